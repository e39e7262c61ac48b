#!/usr/bin/env python3
"""Two strata-gpt builds side by side: the same cases, interleaved, repeated.

    bench/compare_builds.py --old OLD/strata-gpt --new NEW/strata-gpt [--repeats 3]
                            [--strategies a,b] [--work DIR] [--steps 40]
                            [--old-flags "..."] [--new-flags "..."] [-- extra strata-gpt flags]

--old-flags / --new-flags are added to one side only: one binary against itself
with a feature off and on (the flight recorder's overhead: docs/debugging.md).

The cases are the strategies the new build lists in its --help (or --strategies): one process
for a strategy that runs one, 2 ranks otherwise.

Each repeat runs every case on both builds, alternating which build goes first,
so that load on a shared machine falls on both alike. Prints a Markdown table:
tokens/s (median, min-max), peak RSS and peak tensor bytes (largest rank,
median), bytes sent per step by rank 0 per collective kind, the new/old
tokens/s ratio, and the matmul peak strata probes at start-up (the BLAS:
OpenBLAS under Debian's LibTorch, MKL inside the wheel). Used for the LibTorch 1.13 -> 2.x move (README, "LibTorch 2.x").
"""
import argparse
import json
import random
import re
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

def listed_strategies(binary):
    """(name, one_process) for each strategy `binary --help` lists under "Strategies (--strategy):"."""
    text = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, text=True, check=True).stdout
    listed, inside = [], False
    for line in text.splitlines():
        if line.startswith("Strategies (--strategy):"):
            inside = True
        elif inside and line.startswith("  "):
            names = re.split(r"\s{2,}", line.strip())[0]  # names and aliases, then 2+ spaces, then the description
            listed.append((names.split(",")[0], "(one process)" in line))
        elif inside:
            break
    return listed


def cases_of(binary, only):
    """name, strata-gpt flags"""
    cases = []
    for name, one in listed_strategies(binary):
        if only and name not in only:
            continue
        cases.append((name if one else f"{name} x2", ["--strategy", name, "--nproc", "1" if one else "2"]))
    return cases


def write_text(path, size=1 << 20):
    """Printable pseudo-random bytes, the same on every run (a text file makes
    --block-size apply; the built-in addition task has 11-token samples)."""
    rng = random.Random(20240601)
    with open(path, "w", encoding="ascii") as f:
        f.write("".join(chr(32 + rng.randrange(95)) for _ in range(size)))


def run_case(binary, flags, out_dir):
    result = subprocess.run([binary, *flags, "--output-dir", out_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{binary} {' '.join(flags)} failed ({result.returncode}):\n{result.stdout[-2000:]}")
    with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def measure(summary):
    rank0 = summary["per_rank"][0]
    sent = {k: v for k, v in rank0.get("comm_bytes_per_step", {}).items() if v}
    return {
        "tokens_per_s": summary["tokens_per_s"],
        "peak_rss": max(summary["peak_rss_bytes"]),
        "peak_tensor": max(summary["peak_tensor_bytes"]),
        "sent": sent,
        "matmul_gflops": summary.get("matmul_peak_flops", 0.0) / 1e9,
    }


def fmt_sent(sent):
    return ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in sorted(sent.items())) or "none"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--strategies", default="", help="comma-separated (default: every one --new lists)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--old-flags", default="", help="strata-gpt flags for the old side only")
    parser.add_argument("--new-flags", default="", help="strata-gpt flags for the new side only")
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    for b in (args.old, args.new):
        if not os.access(b, os.X_OK):
            sys.exit(f"compare_builds: {b} is not an executable file")
    cases = cases_of(args.new, [n for n in args.strategies.split(",") if n])
    if not cases:
        sys.exit(f"compare_builds: no strategy to run ({args.new} --help lists none of '{args.strategies}')")
    work = args.work or tempfile.mkdtemp(prefix="strata-compare-")
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "generated.txt")
    write_text(text)
    base = ["--preset", "gpt-mini", "--data", text, "--batch-size", "8", "--block-size", "128",
            "--max-steps", str(args.steps), "--threads-per-rank", "1", "--log-every-n-steps", "10",
            "--limit-val-batches", "0", "--progress-bar", "false", "--device", "cpu", *args.extra]
    results = {(case, build): [] for case, _ in cases for build in ("old", "new")}
    for rep in range(args.repeats):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for case, flags in cases:
            for build in order:
                binary = args.old if build == "old" else args.new
                side = shlex.split(args.old_flags if build == "old" else args.new_flags)
                out = os.path.join(work, f"{case.replace(' ', '')}-{build}-{rep}")
                results[(case, build)].append(measure(run_case(binary, base + flags + side, out)))
                print(f"repeat {rep + 1}/{args.repeats} {case} {build}: "
                      f"{results[(case, build)][-1]['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    print(f"gpt-mini on 1 MB of generated text, batch 8 per rank, block 128, {args.steps} steps, 1 thread per "
          f"rank, {args.repeats} interleaved repeats; tokens/s: summary.json's (all ranks' tokens, first step excluded)")
    for build, flags in (("old", args.old_flags), ("new", args.new_flags)):
        if flags:
            print(f"{build}: {args.old if build == 'old' else args.new} {flags}")
    print()
    print("| case | build | tokens/s median (min-max) | new/old | peak RSS MiB | peak tensor MiB | rank 0 sent per step "
          "| matmul probe GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for case, _ in cases:
        medians = {}
        for build in ("old", "new"):
            runs = results[(case, build)]
            tps = [r["tokens_per_s"] for r in runs]
            medians[build] = statistics.median(tps)
            ratio = f"{medians['new'] / medians['old']:.2f}x" if build == "new" else ""
            rss = statistics.median(r["peak_rss"] for r in runs) / 2**20
            tensor = statistics.median(r["peak_tensor"] for r in runs) / 2**20
            print(f"| {case} | {build} | {medians[build]:,.0f} ({min(tps):,.0f}-{max(tps):,.0f}) | {ratio} | "
                  f"{rss:.1f} | {tensor:.2f} | {fmt_sent(runs[0]['sent'])} | "
                  f"{statistics.median(r['matmul_gflops'] for r in runs):.1f} |")


if __name__ == "__main__":
    main()
