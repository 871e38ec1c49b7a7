#!/usr/bin/env bash
# The GPU kit: ringgrad built on this machine (no GPU needed) and carried as one tarball to a GPU
# machine that has the NVIDIA driver, a Python with PyTorch's CUDA wheels (cuBLAS, cuDNN, NCCL)
# and perhaps nothing else: no compiler, no packages, no network. There, `run` in the unpacked kit
# checks the machine in one command (scripts/gpu-kit-run.sh; `run --help`).
#
#   scripts/gpu-kit.sh pack [--archs "90"|"80;90"] [--build-dir DIR] [--out FILE]
#     Without --build-dir: configures and builds Release with CUDA for the architectures (default
#     90: H100/H200) in build/kit-sm<archs>. With --build-dir: packs that existing CUDA build as it
#     is (CI packs the build it already has; --archs is then ignored). Writes FILE (default
#     <build dir>/ringgrad-gpu-kit.tar.xz; relative paths are taken from the current directory)
#     and prints its size (target: at most 60 MiB). FILE's suffix picks the compression: .tar.xz
#     (xz -9, RG_KIT_XZ_LEVEL overrides: ~32 MiB for sm_90, 1.5 minutes to pack, as its 64 MiB
#     dictionary finds the engine's code again in every program) or .tar.gz (gzip: ~55 MiB, 10 s).
#     A GPU machine without xz unpacks either with python3 -m tarfile -e FILE .
#       bin/      ringgrad-train, ringgrad-run, ringgrad-bench, ringgrad-sample (stripped)
#       tests/    every test program with the ctest label gpu (rg_gpu_tests, rg_gpu_device_tests)
#       bench/    rg_micro_bench, and bench/pytorch/*.py (PyTorch's side of the comparisons)
#       examples/ torch_models.py (the PyTorch models the comparison scripts import)
#       lib/      every shared library the programs load at start (ldd) that is not glibc's
#                 (libc, libm, libdl, libpthread, librt, ld-linux) or the driver's (libcuda):
#                 libstdc++, libgomp, OpenBLAS, oneDNN, fmt, ... The programs' RUNPATH is
#                 $ORIGIN/../lib (patchelf), the libraries' $ORIGIN.
#       data/     MNIST (IDX .gz), and data/kjv/kjv.txt when this checkout has it
#       run       the entry point; MANIFEST: commit, architectures, build machine, contents
#     cuBLAS, cuDNN and NCCL are not carried: ringgrad loads them at run time (dlopen, see
#     kernels/cuda/dynload.h), they are several hundred MiB, and the GPU machine has them with
#     PyTorch; `run` finds them there.
set -euo pipefail
CALLER="$PWD"  # relative --build-dir and --out are taken from here
cd "$(dirname "$0")/.."
SRC="$PWD"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

[ $# -ge 1 ] || usage 2
cmd="$1"
shift
case "$cmd" in
  pack) ;;
  -h | --help) usage 0 ;;
  *) echo "gpu-kit: unknown command '$cmd' (expected pack)" >&2; exit 2 ;;
esac

archs="90"
build_dir=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --archs) archs="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "gpu-kit pack: unknown option '$1' (see scripts/gpu-kit.sh --help)" >&2; exit 2 ;;
  esac
done

die() {
  echo "gpu-kit pack: $*" >&2
  exit 1
}
case "$build_dir" in "" | /*) ;; *) build_dir="$CALLER/$build_dir" ;; esac
case "$out" in "" | /*) ;; *) out="$CALLER/$out" ;; esac
# Before any build: the format follows --out's suffix (the default is a .tar.xz).
case "$out" in
  "" | *.tar.xz)
    command -v xz >/dev/null ||
      die "xz is needed for a .tar.xz kit (apt-get install xz-utils), or pack to a .tar.gz" ;;
  *.tar.gz | *.tgz) ;;
  *) die "--out $out: the kit is a .tar.xz (smallest) or a .tar.gz (fastest to pack)" ;;
esac

command -v patchelf >/dev/null ||
  die "patchelf is needed to point the programs at the kit's libraries (apt-get install patchelf; scripts/setup-deps.sh installs it)"

PROGRAMS=(apps/ringgrad-train apps/ringgrad-run apps/ringgrad-bench apps/ringgrad-sample)
MICRO=(bench/rg_micro_bench)
if [ -z "$build_dir" ]; then
  build_dir="build/kit-sm${archs//;/-}"
  export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
  echo "gpu-kit pack: building Release for sm_${archs//;/, sm_} in $build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRG_CUDA=ON \
    -DRG_CUDA_ARCHS="$archs" -DRG_BUILD_TESTS=ON -DRG_BUILD_BENCH=ON >/dev/null
  cmake --build "$build_dir" -j "$(nproc)" --target ringgrad-train ringgrad-run ringgrad-bench \
    ringgrad-sample rg_gpu_tests rg_gpu_device_tests rg_micro_bench
fi
build_dir="$(cd "$build_dir" && pwd)" || die "no build directory $build_dir"
[ -f "$build_dir/CMakeCache.txt" ] || die "$build_dir is not a CMake build directory"
out="${out:-$build_dir/ringgrad-gpu-kit.tar.xz}"
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt" | head -1; }
build_type="$(cached CMAKE_BUILD_TYPE)"
built_archs="$(cached RG_CUDA_ARCHS)"
[ "$build_type" = Release ] || echo "gpu-kit pack: note: $build_dir is a '$build_type' build, not Release" >&2

# The GPU test programs: every executable behind a ctest test labelled gpu.
mapfile -t GPU_TESTS < <(cd "$build_dir" && ctest -L gpu --show-only=json-v1 2>/dev/null |
  python3 -c 'import json, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    c = t.get("command") or []
    if c and c[0] not in seen:
        seen.append(c[0])
print("\n".join(seen))')
for t in rg_gpu_tests rg_gpu_device_tests; do
  printf '%s\n' "${GPU_TESTS[@]}" | grep -q "/$t\$" ||
    die "$build_dir has no ctest tests labelled gpu from $t: is it a CUDA build (RG_CUDA=ON with nvcc) with the tests built?"
done
for p in "${PROGRAMS[@]}" "${MICRO[@]}"; do
  [ -x "$build_dir/$p" ] || die "$build_dir/$p is missing: build the target $(basename "$p") first"
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
kit="$stage/ringgrad-gpu-kit"
mkdir -p "$kit"/{bin,tests,bench/pytorch,examples,lib,data/mnist}
for p in "${PROGRAMS[@]}"; do cp "$build_dir/$p" "$kit/bin/"; done
for p in "${GPU_TESTS[@]}"; do cp "$p" "$kit/tests/"; done
for p in "${MICRO[@]}"; do cp "$build_dir/$p" "$kit/bench/"; done
EXES=("$kit"/bin/* "$kit"/tests/* "$kit"/bench/rg_micro_bench)

# The shared libraries the programs load at start, except glibc's and the driver's.
is_base_lib() {
  case "$1" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | libpthread.so* | \
      librt.so* | libutil.so* | libresolv.so* | libcuda.so* | libnvidia-*) return 0 ;;
  esac
  return 1
}
for exe in "${EXES[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_base_lib "$name" && continue
    [ "$path" != "not" ] || die "$(basename "$exe") needs $name, which the loader does not find here"
    [ -e "$kit/lib/$name" ] || cp -L "$path" "$kit/lib/$name"
  done < <(ldd "$exe")
done
case "$(printf '%s\n' "$kit"/lib/*)" in *libcublas* | *libcudnn* | *libnccl*)
  die "a program links cuBLAS, cuDNN or NCCL at start; ringgrad loads them at run time (kernels/cuda/dynload.h)" ;;
esac

strip --strip-unneeded "${EXES[@]}"
for exe in "${EXES[@]}"; do patchelf --set-rpath '$ORIGIN/../lib' "$exe"; done
for lib in "$kit"/lib/*; do
  chmod u+w "$lib"
  patchelf --set-rpath '$ORIGIN' "$lib"
done

# Data: MNIST as .gz (the loader reads either), fetched first when this checkout lacks it.
mnist_files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
for f in "${mnist_files[@]}"; do
  [ -f "data/mnist/$f" ] || [ -f "data/mnist/$f.gz" ] || { scripts/get-data.sh mnist; break; }
done
for f in "${mnist_files[@]}"; do
  if [ -f "data/mnist/$f.gz" ]; then cp "data/mnist/$f.gz" "$kit/data/mnist/"; else gzip -1 -c "data/mnist/$f" >"$kit/data/mnist/$f.gz"; fi
done
kjv="no"
if [ -f data/kjv/kjv.txt ]; then
  mkdir -p "$kit/data/kjv"
  cp data/kjv/kjv.txt "$kit/data/kjv/"
  kjv="yes"
fi

cp bench/pytorch/*.py "$kit/bench/pytorch/"
cp examples/torch_models.py "$kit/examples/"
cp scripts/gpu-kit-run.sh "$kit/run"
chmod +x "$kit/run"

# What the programs load at run time, as the kit's `run` looks for it.
soname() { grep -aoE "$1\.so\.[0-9]+" "$kit/bin/ringgrad-train" | head -1; }
{
  echo "commit=$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git -C "$SRC" diff --quiet HEAD 2>/dev/null || echo -dirty)"
  echo "packed=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "build_dir=$build_dir"
  echo "build_type=$build_type"
  echo "cuda_archs=$built_archs"
  echo "nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$build_dir"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)"
  echo "build_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"
  echo "cublas_soname=$(soname libcublas)"
  echo "cudnn_soname=$(soname libcudnn)"
  echo "nccl_soname=$(soname libnccl)"
  echo "kjv=$kjv"
  echo "programs=$(cd "$kit" && echo bin/* tests/* bench/rg_micro_bench)"
  echo "libs=$(cd "$kit/lib" && echo *)"
} >"$kit/MANIFEST"

mkdir -p "$(dirname "$out")"
case "$out" in
  *.tar.xz) tar -C "$stage" -cf - ringgrad-gpu-kit | xz "-${RG_KIT_XZ_LEVEL:-9}" -T0 >"$out" ;;
  *) tar -C "$stage" -czf "$out" ringgrad-gpu-kit ;;
esac
bytes="$(wc -c <"$out" | tr -d ' ')"
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
echo "gpu-kit pack: $out: $mib MiB ($(cd "$kit" && du -sh . | cut -f1) unpacked;" \
  "CUDA archs $built_archs; $(ls "$kit/lib" | wc -l) libraries; tests: $(cd "$kit/tests" && echo *))"
if [ "$bytes" -gt $((60 * 1048576)) ]; then
  echo "gpu-kit pack: warning: the kit is larger than its 60 MiB target" >&2
fi
echo "gpu-kit pack: on the GPU machine: tar xf $(basename "$out") && ringgrad-gpu-kit/run [--quick]" \
  "(without xz there: python3 -m tarfile -e $(basename "$out") .)"
