#!/usr/bin/env bash
# The first thing to run: installs what is missing, fetches MNIST, builds, and trains ToyNet
# (the PyTorch MNIST example CNN) for one epoch, printing progress and the test accuracy.
# Recipe: Adam, lr 1e-3 with cosine decay over the epoch, batch 64, seed 1 (98.57% top-1 here).
# Extra arguments go to ringgrad-train (e.g. --epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh
scripts/get-data.sh mnist
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$(nproc)" --target ringgrad-train

build/ci/apps/ringgrad-train --model toynet --dataset mnist --data-dir data/mnist --epochs 1 \
  --batch-size 64 --optimizer adam --lr 0.001 --lr-schedule cosine --seed 1 "$@"
