#!/usr/bin/env python3
"""Where a step's time goes, from a strata-gpt --profile trace (or any Kineto/torch.profiler Chrome trace).

Sums the durations of the outermost CPU events on each thread (an op's children are inside it, so
counting only the outermost counts every microsecond once) by name, and prints the top N with their
share of the traced time on the main thread and per step.

  python bench/trace_summary.py prof/trace-rank0.json --steps 3 --top 15
"""
import argparse
import collections
import json


def outermost(events):
    """Complete ('X') events not contained in another event of the same thread."""
    by_tid = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e and e.get("cat") in ("cpu_op", "user_annotation", None, "python_function"):
            by_tid[e.get("tid")].append(e)
    for tid, evs in by_tid.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = -1.0
        for e in evs:
            if e["ts"] >= end:
                end = e["ts"] + e["dur"]
                yield tid, e


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=3, help="steps in the trace (strata-gpt --profile: 3)")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    per_tid = collections.defaultdict(float)
    by_name = collections.defaultdict(float)
    top = list(outermost(events))
    for tid, e in top:
        per_tid[tid] += e["dur"]
    main_tid = max(per_tid, key=per_tid.get)
    for tid, e in top:
        if tid == main_tid:
            # "autograd::engine::evaluate_function: MmBackward0" -> "backward: MmBackward0"
            name = e["name"].replace("autograd::engine::evaluate_function: ", "backward: ")
            by_name[name.replace("torch::autograd::CppNode<", "").rstrip(">")] += e["dur"]
    total = per_tid[main_tid]
    print(f"main thread: {total / 1e3 / a.steps:.1f} ms of ops per step ({a.steps} steps)")
    print(f"{'op (outermost)':64} {'ms/step':>9} {'share':>7}")
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{name[:64]:64} {us / 1e3 / a.steps:9.2f} {100 * us / total:6.1f}%")


if __name__ == "__main__":
    main()
