#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds ringgrad for the local GPU's architecture, then runs
# the GPU tests (ctest label gpu), one epoch of ToyNet and MLP training on the GPU and the kernel
# micro-benchmarks. Exits non-zero when there is
# no GPU, so a green run always means the GPU code really ran.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check" >&2
  exit 1
fi
nvidia-smi -L
scripts/setup-deps.sh
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
# "native" asks nvcc for the architectures of the GPUs in this machine.
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DRG_CUDA=ON -DRG_CUDA_ARCHS=native
cmake --build build/gpu -j "$(nproc)"
(cd build/gpu && ctest -L gpu --output-on-failure)
# ringgrad-train on the GPU: ToyNet and an MLP on MNIST (the CUDA path of every op they use,
# cuDNN and cuBLAS included).
scripts/get-data.sh mnist
build/gpu/apps/ringgrad-train --model toynet --dataset mnist --device cuda --epochs 1 \
  --optimizer adam --lr 2e-3 --batch-size 64
build/gpu/apps/ringgrad-train --model mlp --dataset mnist --device cuda --epochs 1 \
  --optimizer adam --lr 1e-3 --batch-size 64
if [ -x build/gpu/bench/rg_micro_bench ]; then
  build/gpu/bench/rg_micro_bench --benchmark_filter='Cuda|cuda|GPU|Gpu' "$@"
fi
