#!/usr/bin/env bash
# Line coverage of the CUDA code that CI runs without a GPU: builds the emulated engine and NCCL
# group with gcov (preset `coverage`: RG_COVERAGE=ON in build/coverage), runs every test that
# drives them on the CUDA emulator, and prints gcovr's line coverage of engine/cuda/ (the files of
# the emulated build: backend_cudart.cpp, not backend_none.cpp) and comm/process_group_nccl.cpp.
# Fails when either is below RG_COVERAGE_MIN percent (default 90). A developer tool, not run by
# scripts/test.sh. HTML with every line: build/coverage/coverage/index.html. Also regenerates
# docs/cuda-call-sites.md (scripts/cuda-call-sites.py): which CUDA calls the emulator runs.
# Usage: scripts/coverage.sh [extra args for both ctest runs, e.g. -V]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD="$ROOT/build/coverage"
MIN="${RG_COVERAGE_MIN:-90}"
JOBS="$(nproc)"
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"

scripts/setup-deps.sh
if ! command -v gcovr >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "coverage: installing gcovr"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcovr
fi

# The programs behind the tests selected below, and nothing else.
TARGETS=(rg_emu_runtime_tests rg_emu_engine_tests rg_emu_nccl_group_tests rg_emu_dist_tests
  rg_emu_dist_collectives_tests rg_emu_sync_batch_norm_tests ringgrad-run ringgrad-bench-emu
  ringgrad-train-emu rg_emu_kernel_tests)
cmake --preset coverage
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

# Counters from this run only.
find "$BUILD" -name '*.gcda' -delete
# The multi-process jobs first and alone: instrumented kernels are slower, and the 64 MiB
# collectives of emu.dist.nccl_collectives.np4 must stay within the group's 60 s timeout.
# emu.dist.*: ProcessGroupNCCL over the emulated NCCL; dist.ddp_emulated_device: DDP with the
# module on the emulated device over gloo. Then emu.*: the emulated runtime, engine and NCCL group
# tests (label emu, e2e excluded), and Emu*: every launcher against the CPU kernel
# (rg_emu_kernel_tests: no engine, but launchers the engine does not call, for
# docs/cuda-call-sites.md).
set +e
ctest --test-dir "$BUILD" -R '^emu\.dist\.|^dist\.ddp_emulated_device' -LE e2e -j 1 \
  --output-on-failure --timeout 600 "$@" 2>&1 | tee "$BUILD/coverage-ctest.log"
test_rc=${PIPESTATUS[0]}
ctest --test-dir "$BUILD" -R '^emu\.|^Emu[A-Z]' -E '^emu\.dist\.' -LE e2e -j "$JOBS" \
  --output-on-failure --timeout 600 "$@" 2>&1 | tee -a "$BUILD/coverage-ctest.log"
test_rc=$((test_rc | PIPESTATUS[0]))
set -e

# One gcov pass into a JSON tracefile of everything instrumented (backend_none.cpp and the NCCL
# stub are what the CPU-only libraries that ringgrad-run links use: not the emulated build).
mkdir -p "$BUILD/coverage"
gcovr --root "$ROOT" --object-directory "$BUILD" -j "$JOBS" --filter "$ROOT/engine/" \
  --filter "$ROOT/comm/" --filter "$ROOT/kernels/cuda/" \
  --exclude "$ROOT/engine/cuda/backend_none\\.cpp\$" \
  --exclude "$ROOT/comm/process_group_nccl_stub\\.cpp\$" --json "$BUILD/coverage/coverage.json"
# The report: engine/cuda/ and the NCCL group.
REPORT=(--filter "$ROOT/engine/cuda/" --filter "$ROOT/comm/process_group_nccl\\.cpp\$")
echo
gcovr --root "$ROOT" --add-tracefile "$BUILD/coverage/coverage.json" "${REPORT[@]}" --txt \
  --html-details "$BUILD/coverage/index.html"
# Which CUDA, cuBLAS, cuDNN and NCCL calls and kernel launches ran (docs/cuda-call-sites.md).
python3 scripts/cuda-call-sites.py --coverage "$BUILD/coverage/coverage.json"

# The two figures the target is about: engine/cuda as a whole, and the NCCL group.
rc=0
python3 - "$BUILD/coverage/coverage.json" "$MIN" <<'EOF' || rc=1
import json, sys
files = json.load(open(sys.argv[1]))["files"]
minimum = float(sys.argv[2])
def percent(prefix):
    lines = [l for f in files if f["file"].startswith(prefix) for l in f["lines"]
             if not l.get("gcovr/noncode")]
    hit = sum(1 for l in lines if l["count"] > 0)
    return hit, len(lines)
ok = True
for name, prefix in (("engine/cuda/ (total)", "engine/cuda/"),
                     ("comm/process_group_nccl.cpp", "comm/process_group_nccl.cpp")):
    hit, total = percent(prefix)
    p = 100.0 * hit / total if total else 0.0
    flag = "" if p >= minimum else f"  BELOW {minimum:g}%"
    ok = ok and p >= minimum
    print(f"coverage: {name:30s} {hit:5d}/{total:<5d} lines {p:6.2f}%{flag}")
sys.exit(0 if ok else 1)
EOF
echo "coverage: every line in $BUILD/coverage/index.html"
if [ "$test_rc" -ne 0 ]; then
  echo "coverage: some tests failed (ctest exit $test_rc); the figures count what ran" >&2
  exit "$test_rc"
fi
exit "$rc"
