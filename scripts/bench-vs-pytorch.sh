#!/usr/bin/env bash
# ringgrad against PyTorch 1.13 (Debian's python3-torch, used here only; the engine never uses it),
# side by side in one run: training img/s and peak RSS (ToyNet, ResNet-18; 1 and 2 threads; native
# and AVX2-capped instruction sets), 2-rank DDP on this host, 64 MiB all-reduce and the cost per op
# on one-element tensors (overhead). Prints each
# figure as ours / PyTorch's, the median of alternating runs. Takes about 20 minutes on 2 cores;
# --quick for a smoke test, --only/--models/--threads/--isa to narrow it (see --help).
# Usage: scripts/bench-vs-pytorch.sh [--build DIR] [--repeats N] [--quick] [...]
# minGPT's character-level recipe on the King James Bible (2-rank DDP, validation loss per epoch
# and training tokens/s of both sides; about 15 minutes, so only when asked; fetches data/kjv):
#   scripts/bench-vs-pytorch.sh --only gpt [--quick]
# or bench/pytorch/gpt_bench.py directly for its own options (--model gpt-micro, --epochs,
# --steps-per-epoch, --batch-size; see --help). Results: bench/results/gpt/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "bench-vs-pytorch: installing Debian's python3-torch (the reference)"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null ||
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null; }
fi
BUILD=build/ci
if [[ " $* " == *gpt* && ! -f data/kjv/kjv.txt ]]; then scripts/get-data.sh kjv; fi
if [ ! -x "$BUILD/apps/ringgrad-bench" ] || [ ! -x "$BUILD/apps/ringgrad-train" ] ||
  [ ! -x "$BUILD/bench/rg_micro_bench" ]; then
  scripts/setup-deps.sh
  export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
  cmake --preset ci >/dev/null
  cmake --build --preset ci -j "$(nproc)" --target ringgrad-bench ringgrad-run ringgrad-train \
    rg_micro_bench
fi
exec /usr/bin/python3 bench/pytorch/compare.py "$@"
