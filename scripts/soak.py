#!/usr/bin/env python3
"""Soak: a long strata-gpt run, sampled from outside while it trains.

Every --every seconds it reads each rank's VmRSS and open file descriptors
(/proc/<pid>/status, /proc/<pid>/fd) and the step reached (metrics.csv), and
counts the files in the offload directory. At the end it reports, per rank,
the RSS slope after warm-up (least squares, MiB per 1000 steps), the
descriptor counts after warm-up (min..max), and what was left behind.

  scripts/soak.py --gpt build/bin/strata-gpt --out /tmp/soak -- --preset gpt-nano --strategy fsdp --nproc 2 ...

Exit 0 when the run finished, RSS grew less than --max-slope MiB per 1000
steps after warm-up, the descriptor count did not grow, and no offload file
is left; 1 otherwise (the report says which).
"""
import argparse
import csv
import os
import subprocess
import sys
import time


def children(pid):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(name))
        except OSError:
            pass
    return sorted(out)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def last_step(metrics, log=None):
    """The last logged step: metrics.csv's (written at checkpoints and at the
    end), else the progress lines of the run's output ("step N/M")."""
    try:
        with open(metrics) as f:
            rows = [r for r in csv.DictReader(f) if r.get("loss")]
        if rows:
            return int(rows[-1]["step"])
    except (OSError, KeyError, ValueError, IndexError):
        pass
    if log:
        try:
            with open(log, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 65536))
                tail = f.read().decode(errors="replace")
            steps = [int(w.split("/")[0]) for w in tail.split("step ")[1:] if w.split("/")[0].isdigit()]
            return steps[-1] if steps else 0
        except OSError:
            pass
    return 0


def slope(points):
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt", required=True)
    ap.add_argument("--out", required=True, help="--output-dir of the run (must not exist)")
    ap.add_argument("--offload-dir", default="", help="a directory to watch for offload files")
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.1, help="share of the steps left out of the slope")
    ap.add_argument("--max-slope", type=float, default=1.0, help="MiB per 1000 steps")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if os.path.exists(a.out):
        print(f"error: --out '{a.out}' exists; give a new directory", file=sys.stderr)
        return 2
    args = [x for x in a.args if x != "--"]
    cmd = [a.gpt, *args, "--output-dir", a.out, "--progress-bar", "false"]
    print("soak:", " ".join(cmd), flush=True)
    start = time.time()
    log = open(a.out + ".log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    samples = []  # (seconds, step, [(rss, fds) per rank], offload files)
    offload_seen = 0
    while proc.poll() is None:
        time.sleep(a.every)
        ranks = children(proc.pid) or [proc.pid]
        per = []
        for pid in ranks:
            try:
                per.append((rss_mib(pid), fd_count(pid)))
            except OSError:
                pass
        files = len(os.listdir(a.offload_dir)) if a.offload_dir else 0
        offload_seen = max(offload_seen, files)
        samples.append((time.time() - start, last_step(os.path.join(a.out, "metrics.csv"), a.out + ".log"), per, files))
        if len(samples) % 30 == 0:
            s = samples[-1]
            print(f"  {s[0]:7.0f} s  step {s[1]:6d}  rss " + " / ".join(f"{r:.0f}" for r, _ in s[2])
                  + " MiB  fds " + " / ".join(str(f) for _, f in s[2]), flush=True)
    elapsed = time.time() - start
    code = proc.wait()
    steps = last_step(os.path.join(a.out, "metrics.csv"))
    ok = code == 0
    print(f"\nexit {code}, {steps} steps in {elapsed:.0f} s ({len(samples)} samples)")
    nranks = max((len(s[2]) for s in samples), default=0)
    # While training: after warm-up and before the last step (the end of a
    # run -- exports, the summary's planner probe, teardown -- is not a leak).
    after = [s for s in samples if a.warmup * steps <= s[1] < steps and len(s[2]) == nranks]
    for r in range(nranks):
        pts = [(s[1], s[2][r][0]) for s in after]
        fds = [s[2][r][1] for s in after]
        m = slope(pts) * 1000.0
        rss = [p[1] for p in pts]
        print(f"rank {r}: RSS after warm-up {min(rss):.1f}..{max(rss):.1f} MiB, slope {m:+.3f} MiB per 1000 steps; "
              f"descriptors {min(fds)}..{max(fds)}")
        if not (abs(m) < a.max_slope):
            ok = False
            print(f"  RSS slope {m:+.3f} is not within +-{a.max_slope} MiB per 1000 steps")
        if fds and max(fds) > min(fds) + 2:
            ok = False
            print("  the descriptor count grew")
    if a.offload_dir:
        left = os.listdir(a.offload_dir)
        print(f"offload dir: at most {offload_seen} named file(s) seen while training; {len(left)} left: {left}")
        ok = ok and not left and offload_seen == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
