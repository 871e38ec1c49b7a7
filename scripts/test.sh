#!/usr/bin/env bash
# Installs what is missing, configures (preset `ci`: CUDA compiled for one architecture when nvcc
# exists), fetches MNIST, builds, runs the whole ctest suite and prints its summary line.
# Usage: scripts/test.sh [extra ctest args, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh
scripts/get-data.sh mnist  # the e2e tests train on the real files
JOBS="$(nproc)"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"

cmake --preset ci
cmake --build --preset ci -j "$JOBS"

cd build/ci
set +e
ctest --output-on-failure --timeout 900 -j "$JOBS" "$@" 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
set -e
echo
grep -E "tests passed|tests failed" ctest.log | tail -1 || true
exit "$rc"
