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
# A fresh build has no timings of earlier runs, and ctest then starts the tests in the order they
# were declared, leaving the long ones for the end with one core idle; tests/ctest-costs.txt
# holds the timings of the tests over 2 s (a CTestCostData.txt, regenerated after a full run with
# awk '$3 >= 2' build/ci/Testing/Temporary/CTestCostData.txt), so the longest start first.
if [ ! -f Testing/Temporary/CTestCostData.txt ]; then
  mkdir -p Testing/Temporary
  cp ../../tests/ctest-costs.txt Testing/Temporary/CTestCostData.txt
fi
set +e
ctest --output-on-failure --timeout 900 -j "$JOBS" "$@" 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
set -e
echo
grep -E "tests passed|tests failed" ctest.log | tail -1 || true
exit "$rc"
