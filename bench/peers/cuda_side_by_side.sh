#!/usr/bin/env bash
# bench/peers/cuda_side_by_side.sh — strata-gpt and its PyTorch peer (bench/peers/gpt_peer.py) side by
# side on one GPU: the same model (the gpt2 preset on byte-level text, vocab 256), the same initial
# weights, batches and optimisation, bf16-mixed, block 1024. Rounds are interleaved (strata, eager,
# strata, eager, ...); torch.compile runs once at the end (its first step compiles). Then one
# profiled run of each (steps 3-5, CPU and CUDA activities), gzip'd.
#
#   scripts/gpu-check --build-only && bench/peers/cuda_side_by_side.sh
#
# Environment: PYTHON (/opt/torch/.venv/bin/python), STRATA_GPT (build-gpu/bin/strata-gpt), DEVICE (cuda),
# PRESET (gpt2), BLOCK (1024),
# OUT (out/side-by-side), ROUNDS (3), STEPS (30), BATCH (8), COMPILE (1: also torch.compile).
# Output: $OUT/side-by-side.json (every run's tokens/s, peak memory and per-step losses) and
# $OUT/trace-{strata,peer}.json.gz; a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/opt/torch/.venv/bin/python}
BIN=${STRATA_GPT:-build-gpu/bin/strata-gpt}
OUT=${OUT:-out/side-by-side}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-30} BATCH=${BATCH:-8} COMPILE=${COMPILE:-1}
DEVICE=${DEVICE:-cuda} PRESET=${PRESET:-gpt2} BLOCK=${BLOCK:-1024}  # cpu, a small preset: a smoke test
WORK=$(mktemp -d /tmp/strata-side.XXXXXX)
mkdir -p "$OUT"
say() { echo "side-by-side: $*" >&2; }

# 8 MiB of printable bytes: strata-gpt reads a plain file as byte-level text, as the peer does.
"$PY" -c "import numpy as np; np.random.default_rng(0).integers(32, 127, 8 << 20, dtype=np.uint8).tofile('$WORK/text')"
"$PY" bench/peers/gpt_peer.py --preset "$PRESET" --block-size "$BLOCK" --bias 1 --seed 1337 --write-init "$WORK/init.pt"

COMMON=(--preset "$PRESET" --block-size "$BLOCK" --batch-size "$BATCH" --max-steps "$STEPS" --seed 1337
  --lr 6e-4 --min-lr 6e-5 --warmup-steps 10 --weight-decay 0.1 --gradient-clip-val 1.0
  --precision bf16-mixed --data "$WORK/text" --init-from "$WORK/init.pt")
strata() { # NAME [extra flags]
  local name=$1; shift
  "$BIN" "${COMMON[@]}" --bias true --dropout 0 --device "$DEVICE" --strategy single --log-every-n-steps 1 \
    --limit-val-batches 0 --progress-bar false --output-dir "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 \
    || { tail -20 "$WORK/$name.log" >&2; return 1; }
  say "$name: $(grep -o '"tokens_per_s": [0-9.]*' "$WORK/$name/summary.json" | head -1)"
}
peer() { # NAME [extra flags]
  local name=$1; shift
  "$PY" bench/peers/gpt_peer.py "${COMMON[@]}" --bias 1 --device "$DEVICE" --mode local --json "$WORK/$name.json" "$@" \
    >"$WORK/$name.log" 2>&1 || { tail -20 "$WORK/$name.log" >&2; return 1; }
  say "$name: $("$PY" -c "import json; print(round(json.load(open('$WORK/$name.json'))['tokens_per_s']))") tokens/s"
}

for r in $(seq "$ROUNDS"); do
  strata "strata-$r"
  peer "eager-$r"
done
strata strata-prof --profile "$WORK/prof-strata"
peer eager-prof --profile "$WORK/prof-peer"
gzip -c "$WORK/prof-strata/trace-rank0.json" >"$OUT/trace-strata.json.gz"
gzip -c "$WORK/prof-peer/trace-rank0.json" >"$OUT/trace-peer.json.gz"
# Last, and bounded: compilation's time varies the most.
if [ "$COMPILE" = 1 ]; then timeout "${COMPILE_TIMEOUT:-150}" bash -c "$(declare -f peer say); $(declare -p PY COMMON DEVICE WORK); peer compile-1 --compile" || say "compile: failed or timed out"; fi

"$PY" - "$WORK" "$OUT/side-by-side.json" <<'EOF'
import csv, glob, json, os, statistics, sys
work, out = sys.argv[1], sys.argv[2]
runs = {}
for d in sorted(glob.glob(os.path.join(work, "strata-*"))):
    if not os.path.isdir(d):
        continue
    s = json.load(open(os.path.join(d, "summary.json")))
    with open(os.path.join(d, "metrics.csv")) as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f) if r.get("loss")]
    runs[os.path.basename(d)] = {"tokens_per_s": s["tokens_per_s"], "peak_bytes": s["peak_tensor_bytes"][0],
                                 "losses": losses, "per_rank": s["per_rank"][0]}
for p in sorted(glob.glob(os.path.join(work, "*.json"))):
    j = json.load(open(p))
    runs[os.path.basename(p)[:-5]] = {"tokens_per_s": j["tokens_per_s"], "peak_bytes": j["peak_cuda_bytes"] or 0,
                                      "losses": j["losses"], "torch": j["torch"]}
json.dump(runs, open(out, "w"), indent=1)
print("| run | tokens/s (median of rounds) | rounds | peak GiB | loss step 1 | loss last |")
print("|---|---|---|---|---|---|")
for kind in ("strata", "eager", "compile"):
    rs = [v for k, v in runs.items() if k.startswith(kind + "-") and not k.endswith("prof")]
    if rs:
        print(f"| {kind} | {statistics.median(v['tokens_per_s'] for v in rs):,.0f} | "
              f"{', '.join(format(v['tokens_per_s'], ',.0f') for v in rs)} | {max(v['peak_bytes'] for v in rs) / 2**30:.2f} | "
              f"{rs[0]['losses'][0]:.4f} | {rs[0]['losses'][-1]:.4f} |")
a, b = runs.get("strata-1", {}).get("losses", []), runs.get("eager-1", {}).get("losses", [])
if a and b:
    n = min(len(a), len(b))
    print(f"\nmax |loss strata - loss eager| over {n} steps: {max(abs(x - y) for x, y in zip(a, b)):.3e}")
EOF
rm -rf "$WORK"
