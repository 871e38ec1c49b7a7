#!/usr/bin/env bash
# Reference runs of ringgrad-train for the trainer refactor: prints sha256 of every checkpoint,
# snapshot and metrics file (metrics with the "seconds", rates and peak memory fields removed).
# Usage: bench/train-ref/run.sh BUILD_DIR OUT_DIR
set -uo pipefail
B=$1; O=$2; rm -rf "$O"; mkdir -p "$O"
T="$B/apps/ringgrad-train"; R="$B/apps/ringgrad-run"
base="--model toynet --dataset mnist --data-dir data/mnist --batch-size 64 --optimizer adam --lr 0.002 --lr-schedule cosine --label-smoothing 0.1 --seed 1 --workers 1 --eval-samples 2000"
m="--max-steps 60"
run1() { n=$1; shift; $T $base "$@" > "$O/$n.out" 2>&1; echo "$n rc=$?" >> "$O/rc.txt"; }
run2() { n=$1; shift; $R --nproc-per-node 2 --master-port 0 $T $base "$@" > "$O/$n.out" 2>&1; echo "$n rc=$?" >> "$O/rc.txt"; }
run1 plain $m --checkpoint $O/plain.ckpt --metrics $O/plain.jsonl
run2 ddp $m --checkpoint $O/ddp.ckpt --metrics $O/ddp.jsonl
run1 snap --snapshot $O/snap.st --snapshot-every 7 --metrics $O/snap.jsonl --steps-per-epoch 20 --epochs 3
RG_TEST_FAULT=step:25:0 run1 snapkill --snapshot $O/snapk.st --snapshot-every 7 --steps-per-epoch 20 --epochs 3
run1 snapkill2 --snapshot $O/snapk.st --snapshot-every 7 --steps-per-epoch 20 --epochs 3 --metrics $O/snapk.jsonl
run2 ddpsnap --snapshot $O/ddpsnap.st --snapshot-every 5 --steps-per-epoch 15 --epochs 2 --metrics $O/ddpsnap.jsonl
RG_TEST_FAULT=step:12:1 run2 ddpkill --snapshot $O/ddpk.st --snapshot-every 5 --max-steps 40
run1 ddpkill1 --snapshot $O/ddpk.st --snapshot-every 5 --max-steps 40 --metrics $O/ddpk.jsonl
run1 early --early-stop-patience 1 --steps-per-epoch 10 --epochs 4 --checkpoint $O/early.ckpt --metrics $O/early.jsonl
run2 accum $m --grad-accum-steps 3 --checkpoint $O/accum.ckpt --metrics $O/accum.jsonl --clip-grad-norm 1.0
run1 bf16 $m --amp bf16 --checkpoint $O/bf16.ckpt --metrics $O/bf16.jsonl
run2 rank0 $m --eval-on-rank0 --checkpoint $O/rank0.ckpt --metrics $O/rank0.jsonl
run2 join $m --uneven-data --join --grad-accum-steps 2 --checkpoint $O/join.ckpt --metrics $O/join.jsonl
run2 cons $m --check-consistency 5 --checkpoint $O/cons.ckpt --metrics $O/cons.jsonl --trace $O/cons.trace --trace-steps 4
python3 - "$O" <<'PY'
import random, sys
random.seed(3); s = "".join(random.choice("abcdefgh ijk.\n") for _ in range(4000))
open(sys.argv[1] + "/text.txt", "w").write(s)
PY
$R --nproc-per-node 2 --master-port 0 $T --model gpt-nano --dataset text --data-file $O/text.txt --block-size 16 --batch-size 8 --test-batch-size 64 --steps-per-epoch 10 --epochs 2 --optimizer adamw --lr 0.003 --workers 0 --seed 3 --checkpoint $O/gpt.ckpt --metrics $O/gpt.jsonl > $O/gpt.out 2>&1; echo "gpt rc=$?" >> "$O/rc.txt"
cd "$O"
for f in *.ckpt *.st *.best.ckpt; do [ -f "$f" ] && sha256sum "$f"; done
for f in *.jsonl; do python3 -c '
import json,sys
for l in open(sys.argv[1]):
  j=json.loads(l)
  for k in list(j):
    if k in ("seconds","img_per_s","tokens_per_s","peak_rss_mb","peak_device_mb"): del j[k]
  print(json.dumps(j,sort_keys=True))' "$f" | sha256sum | sed "s/-/$f/"; done
for f in *.out; do sed -E 's/[0-9]+ (img|tok)\/s/R \1\/s/g; s/ETA [0-9:-]+/ETA T/g; s/[0-9.]+ s$/S s/; s/"(seconds|peak_rss_mb|img_per_s|tokens_per_s)":[0-9.e+-]+/"\1":X/g; s/"peak_device_mb":\[[^]]*\]/X/' "$f" | sha256sum | sed "s/-/$f/"; done
cat rc.txt
