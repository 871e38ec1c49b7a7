#!/usr/bin/env bash
# ctest install.gpu_kit: the GPU kit (scripts/gpu-kit.sh) packs this CUDA build, and its `run`,
# unpacked elsewhere on a machine without a GPU, checks that every program starts with only the
# kit's libraries, then ends with the "no GPU" line and a non-zero exit code. Also: the tarball is
# at most 60 MiB, the report is written, and the start check fails, naming the library, when one
# of the kit's libraries is missing. It packs a .tar.xz, as the kit is carried, at xz's fastest
# level (RG_KIT_XZ_LEVEL=0: -9 takes 1.5 minutes), and unpacks it as a GPU machine without xz
# would, with python3's tarfile (tar -xJf where there is no python3).
# Usage: gpu_kit_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src="$1" build="$2" work="$3"

fail() {
  echo "install.gpu_kit: FAILED: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work/fakebin"
# A machine whose nvidia-smi finds no GPU (also where this test runs on a GPU machine).
cat >"$work/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver (install.gpu_kit's stand-in)" >&2
exit 9
EOF
chmod +x "$work/fakebin/nvidia-smi"

RG_KIT_XZ_LEVEL=0 "$src/scripts/gpu-kit.sh" pack --build-dir "$build" --out "$work/kit.tar.xz" |
  tee "$work/pack.log"
bytes="$(wc -c <"$work/kit.tar.xz" | tr -d ' ')"
[ "$bytes" -le $((60 * 1048576)) ] || fail "the kit is $bytes bytes, more than 60 MiB"

mkdir -p "$work/there"
if command -v python3 >/dev/null; then
  (cd "$work/there" && python3 -m tarfile -e "$work/kit.tar.xz" .)
else
  tar -xJf "$work/kit.tar.xz" -C "$work/there"
fi
kit="$work/there/ringgrad-gpu-kit"
run_kit() {  # run_kit LOG: runs the kit with the stand-in nvidia-smi; prints its exit code
  local rc=0
  (cd "$work/there" && PATH="$work/fakebin:$PATH" CUDA_VISIBLE_DEVICES="" \
    "$kit/run" --out "$work/report" >"$1" 2>&1) || rc=$?
  echo "$rc"
}

rc="$(run_kit "$work/run.log")"
cat "$work/run.log"
[ "$rc" != 0 ] || fail "run exited 0 without a GPU"
grep -q '^run: no GPU: ' "$work/run.log" || fail "no 'run: no GPU:' line"
start_line="$(grep -E '^\[ok +\] start ' "$work/run.log")" ||
  fail "the start check did not pass (every program with only the kit's libraries)"
for p in bin/ringgrad-train bin/ringgrad-run bin/ringgrad-bench bin/ringgrad-sample \
  tests/rg_gpu_tests tests/rg_gpu_device_tests bench/rg_micro_bench; do
  [ -x "$kit/$p" ] || fail "the kit has no $p"
  [[ "$start_line" == *" $p"* ]] || fail "the start check does not list $p"
done
[ -s "$work/report/report.md" ] || fail "no report.md"
[ -s "$work/report/report.json" ] || fail "no report.json"
if command -v python3 >/dev/null; then
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_code"] == 1 and r["no_gpu"], r
assert [s["status"] for s in r["stages"] if s["name"] == "start"] == ["ok"], r["stages"]' \
    "$work/report/report.json" || fail "report.json does not say what run printed"
fi
[ -f "$kit/data/mnist/train-images-idx3-ubyte.gz" ] || fail "the kit has no MNIST"

# The GPU stages' drivers and the report on the CPU (--cpu-smoke: tiny batches): the gtest
# summaries, MNIST's top-1 and a throughput table with a ringgrad figure in every row (and
# PyTorch's where python3 imports torch).
rc=0
(cd "$work/there" && PATH="$work/fakebin:$PATH" "$kit/run" --cpu-smoke --quick \
  --out "$work/smoke" >"$work/smoke.log" 2>&1) || rc=$?
cat "$work/smoke.log"
[ "$rc" = 0 ] || fail "run --cpu-smoke exited $rc"
grep -qE '^\[ok +\] tests\.rg_gpu_device_tests .* passed, [0-9]+ skipped' "$work/smoke.log" ||
  fail "no gtest summary for rg_gpu_device_tests"
grep -qE '^- MNIST, one epoch .*: top-1 [0-9.]+ %' "$work/smoke/report.md" || fail "no MNIST top-1 in report.md"
for w in "ToyNet b4 f32" "ResNet-18 b4 f32" "ResNet-18 b4 bf16" "gpt-nano b4 T128 f32"; do
  grep -qE "^\| $w \| eager \| (img|tok)/s \| [0-9]+ \|" "$work/smoke/report.md" ||
    fail "report.md has no ringgrad figure for $w"
done
if command -v python3 >/dev/null; then
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_code"] == 0 and len(r["throughput"]) == 5, r
assert all(t["ringgrad"] > 0 for t in r["throughput"]), r["throughput"]' \
    "$work/smoke/report.json" || fail "report.json of --cpu-smoke is not as expected"
fi

# The check can fail: without one of the libraries ringgrad-train needs, it must say so.
victim=""
for name in $(ldd "$kit/bin/ringgrad-train" | awk '$2 == "=>" { print $1 }'); do
  if [ -f "$kit/lib/$name" ]; then victim="$name" && break; fi
done
[ -n "$victim" ] || fail "ringgrad-train needs none of the kit's libraries (ldd)"
rm "$kit/lib/$victim"
rc="$(run_kit "$work/run-missing.log")"
[ "$rc" != 0 ] || fail "run exited 0 with $victim missing"
grep -q "bin/ringgrad-train does not start with only the kit's libraries:.*$victim" \
  "$work/run-missing.log" || { cat "$work/run-missing.log"; fail "the start check did not name the missing $victim"; }
grep -qE '^\[failed +\] start ' "$work/run-missing.log" || fail "the start stage did not fail"
echo "install.gpu_kit: passed ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB; without $victim the start check fails as it should)"
