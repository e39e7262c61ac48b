#!/usr/bin/env bash
# vit-classifier's binary: ddp and fsdp x2 train (accuracy above chance), and
# an fsdp run resumed from its step-20 checkpoint ends with the uninterrupted
# run's weights; a bad strategy option is one line, exit 2.
#   check_binary.sh BINARY WORK_DIR
set -euo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
last() { tail -n 1 "$1"; }
field() { sed -n "s/.*$1 \([^ |]*\).*/\1/p" <<<"$2"; }

for strategy in ddp fsdp; do
  "$bin" --strategy $strategy --nproc 2 --steps 40 --activation-checkpointing 1 >"$work/$strategy.log" 2>&1
  line=$(last "$work/$strategy.log")
  accuracy=$(field "val accuracy" "$line")
  echo "$strategy x2: $line"
  # 4 classes: chance is 0.25.
  awk -v a="$accuracy" 'BEGIN { exit !(a > 0.5) }' || { echo "FAIL: $strategy accuracy $accuracy"; exit 1; }
done

"$bin" --strategy fsdp --nproc 2 --steps 40 --checkpoint-every 20 --checkpoint-dir "$work/ckpt" >"$work/full.log" 2>&1
"$bin" --strategy fsdp --nproc 2 --steps 40 --resume "$work/ckpt/step-20" >"$work/resumed.log" 2>&1
full=$(field "params checksum" "$(last "$work/full.log")")
resumed=$(field "params checksum" "$(last "$work/resumed.log")")
echo "fsdp x2 uninterrupted: $full; resumed from step 20: $resumed"
[ -n "$full" ] && [ "$full" = "$resumed" ] || { echo "FAIL: the resumed run's weights differ"; exit 1; }

set +e
"$bin" --strategy fsdp --sharding-strategy sideways >"$work/bad.log" 2>&1
rc=$?
set -e
echo "bad option: exit $rc: $(cat "$work/bad.log")"
[ $rc -eq 2 ] && [ "$(wc -l <"$work/bad.log")" -eq 1 ] && grep -q "sideways" "$work/bad.log" || { echo "FAIL: bad option"; exit 1; }
echo "ok"
