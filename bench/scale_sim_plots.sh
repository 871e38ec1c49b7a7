#!/bin/sh
# The scale simulator's plots: measures the compute-only step profiles of ToyNet (the MNIST CNN)
# and ResNet-18 (CIFAR stem, batch 16) on this machine with one rank, then predicts DDP's scaling
# efficiency from 1 to 1024 GPUs on the presets, twice: with the compute times as measured here
# (--compute-scale 1) and 100 times faster (--compute-scale 0.01), a GPU-like step (see the
# README for why 0.01). Writes OUT/{toynet,resnet18}.json, OUT/{cpu,gpu-like}.{txt,csv,png}.
#   sh bench/scale_sim_plots.sh [OUT]        (default bench/results/scale_sim)
set -eu
BUILD=${BUILD:-build/ci}
OUT=${1:-bench/results/scale_sim}
mkdir -p "$OUT"
for m in toynet resnet18; do
  RG_NUM_THREADS=2 "$BUILD/apps/ringgrad-run" --nproc-per-node 1 --master-port 0 \
    "$BUILD/apps/ringgrad-bench" overlap --model "$m" --bucket-mb 25 --iters 7 --stat min \
    --profile-out "$OUT/$m.json"
done
for run in "cpu 1" "gpu-like 0.01"; do
  set -- $run
  "$BUILD/apps/ringgrad-bench" scale --trace "$OUT/toynet.json,$OUT/resnet18.json" \
    --preset dgx-a100,v100-ib,ethernet-10g --compute-scale "$2" --csv "$OUT/$1.csv" \
    --plot "$OUT/$1.png" > "$OUT/$1.txt"
  echo "wrote $OUT/$1.txt, $OUT/$1.csv, $OUT/$1.png"
done
