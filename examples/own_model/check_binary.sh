#!/usr/bin/env bash
# This project's strata-gpt knows the bigram-mlp family from its spec alone:
# --help lists its presets; it trains under fsdp x2 (strata's launcher) to a
# lower loss; --dry-run at 64 ranks holds FSDP's state for it; --strategy
# auto picks a strategy for it; a key it does not read, and --export-weights
# (it writes no weights format), are one line and exit 2.
#   check_binary.sh STRATA_GPT WORK_DIR
set -euo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
common=(--preset bigram-mlp-small --log-every-n-steps 10 --limit-val-batches 0 --progress-bar false --threads-per-rank 1)

"$bin" --help >"$work/help.txt"
grep -q "bigram-mlp-small" "$work/help.txt" || fail "--help does not list bigram-mlp-small"

"$bin" "${common[@]}" --max-steps 60 --strategy fsdp --nproc 2 --output-dir "$work/fsdp" >"$work/fsdp.log" 2>&1 ||
  { cat "$work/fsdp.log"; fail "fsdp x2"; }
grep -q "strata-gpt | bigram-mlp-small" "$work/fsdp.log" || { head -5 "$work/fsdp.log"; fail "the header names the preset"; }
python3 - "$work/fsdp/metrics.csv" <<'PY' || fail "the loss did not fall"
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("loss")]
first, last = float(rows[0]["loss"]), float(rows[-1]["loss"])
print(f"bigram-mlp-small, fsdp x2: loss {first:.4f} at step {rows[0]['step']} -> {last:.4f} at step {rows[-1]['step']}")
sys.exit(0 if last < first - 0.1 else 1)
PY

"$bin" --preset bigram-mlp-small --strategy fsdp --nproc 64 --dry-run >"$work/dry.log" 2>&1 || { cat "$work/dry.log"; fail "dry run"; }
grep -q "^model state bytes, rank 63: params=" "$work/dry.log" || { cat "$work/dry.log"; fail "the dry run's state"; }

"$bin" "${common[@]}" --max-steps 2 --strategy auto --output-dir "$work/auto" >"$work/auto.log" 2>&1 ||
  { cat "$work/auto.log"; fail "--strategy auto"; }

expect_one_line() {  # expect_one_line WHAT GREP ARGS...
  local what=$1 want=$2
  shift 2
  set +e
  "$bin" "$@" >"$work/bad.log" 2>&1
  local rc=$?
  set -e
  [ $rc -eq 2 ] && [ "$(wc -l <"$work/bad.log")" -eq 1 ] && grep -q -- "$want" "$work/bad.log" ||
    { cat "$work/bad.log"; fail "$what: expected one line with '$want' and exit 2, got exit $rc"; }
}
expect_one_line "--n-head" "does not apply to the bigram-mlp family" "${common[@]}" --n-head 4 --output-dir "$work/x"
expect_one_line "--export-weights" "writes no weights" "${common[@]}" --export-weights "$work/w.pt" --output-dir "$work/y"
[ ! -e "$work/x" ] && [ ! -e "$work/y" ] || fail "a refused run wrote its output directory"
echo "own_model: all checks passed"
