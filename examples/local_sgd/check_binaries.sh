#!/usr/bin/env bash
# This project's strata-gpt and strata-bench know local-sgd from its spec:
# --help lists it and its options, it trains x2 under strata's launcher (and
# sends ~1/8 of ddp's bytes per step, measured), a bad option is one line and
# exit 2, --strategy auto lists it without picking it, and a strata-bench
# sweep runs it beside ddp.
#   check_binaries.sh BIN_DIR WORK_DIR
set -euo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
# 17 steps: summary.json's per-step bytes count steps 2-17 (the first is warm-up), two
# synchronisations (steps 8 and 16) in 16 steps.
common=(--preset gpt-nano --log-every-n-steps 8 --limit-val-batches 0 --progress-bar false)

"$bin/strata-gpt" --help >"$work/help.txt"
grep -q "^  local-sgd " "$work/help.txt" || fail "--help does not list local-sgd"
grep -q -- "--sync-every" "$work/help.txt" || fail "--help does not list --sync-every"
grep -q -- "--outer-lr" "$work/help.txt" || fail "--help does not list --outer-lr"

for run in "ddp" "local-sgd --sync-every 8"; do
  name=${run%% *}
  # shellcheck disable=SC2086
  "$bin/strata-gpt" --strategy $run --nproc 2 "${common[@]}" --max-steps 17 --output-dir "$work/$name" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "$run x2"; }
done
grep -q "local-sgd: 2 rank(s) each step alone; every 8 step(s)" "$work/local-sgd.log" || fail "describe() not printed"
bytes() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['per_rank'][0]['comm_bytes_per_step']['all_reduce'])" "$1"; }
ddp=$(bytes "$work/ddp/summary.json") local=$(bytes "$work/local-sgd/summary.json")
ratio=$(python3 -c "print($local / $ddp)")
echo "all-reduce bytes per step: ddp $ddp, local-sgd --sync-every 8: $local (ratio $ratio; 1/8 = 0.125)"
python3 -c "import sys; sys.exit(not 0.12 < $ratio < 0.13)" || fail "local-sgd sends $ratio of ddp's bytes"
predicted=$(python3 -c "import json; print(json.load(open('$work/local-sgd/summary.json'))['predicted_comm_bytes_per_step']['all_reduce'])")
echo "local-sgd's communication model predicted $predicted all-reduce bytes per step"

set +e
"$bin/strata-gpt" --strategy local-sgd --sync-every 0 >"$work/bad.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && [ "$(wc -l <"$work/bad.log")" -eq 1 ] && grep -q "sync-every" "$work/bad.log" ||
  fail "--sync-every 0: exit $rc, $(cat "$work/bad.log")"

"$bin/strata-gpt" --strategy auto --nproc 2 --memory-budget 1GiB "${common[@]}" --max-steps 2 \
  --output-dir "$work/auto" >"$work/auto.log" 2>&1 || { cat "$work/auto.log"; fail "--strategy auto"; }
grep -q "^local-sgd .*never picked" "$work/auto.log" || { cat "$work/auto.log"; fail "auto's table lacks local-sgd"; }
grep -q "^chosen: ddp" "$work/auto.log" || fail "auto did not choose ddp"

"$bin/strata-bench" --sweep --presets gpt-nano --strategies ddp,local-sgd --nproc 2 --steps 6 --block-size 32 \
  --out "$work/sweep" >"$work/sweep.md" 2>"$work/sweep.err" || { cat "$work/sweep.err"; fail "strata-bench sweep"; }
grep -q "sweep/gpt-nano/local-sgd-2x1" "$work/sweep.md" || fail "the sweep has no local-sgd case"
grep "sweep/gpt-nano/local-sgd-2x1" "$work/sweep.md" | head -1
echo "ok"
