#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ with clang-14 (build/fuzz: the harness and its parser's
# sources with ASan + UBSan + coverage, the libraries of build/ci) and runs each for a budget, one at a time, printing a table of executions,
# coverage (features), time and crashes per target. A crash, leak, timeout (> 1 s per input) or
# out-of-memory input is minimised into fuzz/crashes/TARGET/ next to a REPLAY file with the command
# that reproduces it. Exit status 1 when any target found something.
# Usage: scripts/fuzz.sh [--seconds N] [--runs N] [--jobs N] [TARGET...]   (default: 60 s each)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SECONDS_EACH=""
RUNS=""
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
if [ -z "$SECONDS_EACH" ] && [ -z "$RUNS" ]; then SECONDS_EACH=60; fi

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool missing (scripts/setup-deps.sh installs it)" >&2; exit 1; }
done
export CCACHE_DIR="${CCACHE_DIR:-$ROOT/.cache/ccache}"
# The libraries come from the g++ build (preset ci; kernels/cpu is GCC-only); the harness and
# the parser's own sources (fuzz/CMakeLists.txt) are compiled again here with clang-14 and
# -fsanitize=fuzzer,address,undefined, and linked as that build links rg_fuzz_replay_<target>.
CI="$ROOT/build/ci"
BUILD="$ROOT/build/fuzz"
[ -f "$CI/build.ninja" ] || cmake --preset ci >/dev/null
ALL=$(tr ';' ' ' < "$CI/fuzz/targets.txt" 2>/dev/null || true)
if [ -z "$ALL" ]; then cmake "$CI" >/dev/null; ALL=$(tr ';' ' ' < "$CI/fuzz/targets.txt"); fi
if [ ${#TARGETS[@]} -eq 0 ]; then read -r -a TARGETS <<< "$ALL"; fi
for t in "${TARGETS[@]}"; do
  [[ " $ALL " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (targets: $ALL)" >&2; exit 2; }
done
cmake --build "$CI" -j "$(nproc)" --target rg_fuzz_seed_corpus \
  $(printf 'rg_fuzz_replay_%s ' "${TARGETS[@]}")
mkdir -p "$BUILD"
for t in "${TARGETS[@]}"; do
  python3 - "$CI" "$BUILD" "$t" <<'PY'
import json, os, shlex, subprocess, sys
ci, build, t = sys.argv[1:4]
exe = f"fuzz/rg_fuzz_replay_{t}"
link = subprocess.run(["ninja", "-C", ci, "-t", "commands", exe], check=True,
                      capture_output=True, text=True).stdout.strip().splitlines()[-1]
link = shlex.split(link.split("&&")[1])
objs = [w for w in link if w.endswith(".o") and not w.endswith("replay_main.cpp.o")]
libs = link[link.index("-o") + 2:]
def output_of(e):
    words = shlex.split(e["command"])
    return os.path.normpath(os.path.join(e["directory"], words[words.index("-o") + 1]))
commands = {output_of(e): e["command"] for e in json.load(open(f"{ci}/compile_commands.json"))}
out_dir = f"{build}/obj/{t}"
os.makedirs(out_dir, exist_ok=True)
fuzz_objs = []
for o in objs:
    words = shlex.split(commands[os.path.normpath(os.path.join(ci, o))])
    if os.path.basename(words[0]) == "ccache":
        words = words[1:]
    src = words[words.index("-c") + 1]
    keep = [w for w in words[1:words.index("-o")] if not w.startswith(("-O", "-fsanitize", "-Werror", "-Wno-maybe", "-Wno-stringop", "-fopenmp"))]
    dst = f"{out_dir}/" + o.replace("/", "_")
    fuzz_objs.append(dst)
    cmd = ["ccache", "clang++-14", *keep, "-O1", "-g", "-Wno-unknown-warning-option",
           "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
           "-fno-omit-frame-pointer", "-c", src, "-o", dst]
    subprocess.run(cmd, check=True, cwd=ci)
cmd = ["clang++-14", "-fsanitize=fuzzer,address,undefined", *fuzz_objs, "-o",
       f"{build}/rg_fuzz_{t}", *libs]
subprocess.run(cmd, check=True, cwd=ci)
print(f"built {build}/rg_fuzz_{t}")
PY
done

# Per-target dictionaries (fuzz/dict/*.dict) and input size caps.
dict_of() {
  case "$1" in
    safetensors|checkpoint|snapshot) echo safetensors ;;
    flight|trace|step_profile) echo json ;;
    train_args) echo train_args ;;
    tcp_store_server|tcp_store_client) echo store ;;
    *) echo "" ;;
  esac
}
max_len_of() {
  case "$1" in
    cifar) echo 16384 ;;  # records are 3073/3074 bytes
    *) echo 8192 ;;
  esac
}

LOGS="$BUILD/logs"
mkdir -p "$LOGS"
summary=()
found_any=0
for t in "${TARGETS[@]}"; do
  exe="$BUILD/rg_fuzz_$t"
  corpus="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t"
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  args=(-timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=64 -max_len="$(max_len_of "$t")"
        -print_final_stats=1 -jobs=1 -workers=1 -artifact_prefix="$artifacts/")
  d=$(dict_of "$t")
  [ -n "$d" ] && args+=(-dict="$ROOT/fuzz/dict/$d.dict")
  [ -n "$RUNS" ] && args+=(-runs="$RUNS")
  [ -n "$SECONDS_EACH" ] && args+=(-max_total_time="$SECONDS_EACH")
  seeds=("$CI/fuzz/seeds/$t")
  [ -d "$ROOT/fuzz/regressions/$t" ] && seeds+=("$ROOT/fuzz/regressions/$t")
  echo "== $t"
  start=$(date +%s)
  set +e
  # From a directory of its own: with -jobs, libFuzzer writes its job's fuzz-0.log into the cwd.
  mkdir -p "$LOGS/$t.jobs"
  (cd "$LOGS/$t.jobs" &&
    ASAN_OPTIONS=detect_leaks=1 "$exe" "${args[@]}" "$corpus" "${seeds[@]}") >"$LOGS/$t.log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOGS/$t.log" | grep -o '[0-9]*$' | tail -1)
  feats=$(grep -oE '(ft|features): *[0-9]+' "$LOGS/$t.log" | grep -oE '[0-9]+$' | tail -1)
  crashes=0
  for a in "$artifacts"/*; do
    [ -f "$a" ] || continue
    crashes=$((crashes + 1))
    dest="$ROOT/fuzz/crashes/$t"
    mkdir -p "$dest"
    name=$(basename "$a")
    # Minimise the input (crashes and timeouts; an out-of-memory input is kept as it is).
    if [[ "$name" == crash-* || "$name" == leak-* ]]; then
      ASAN_OPTIONS=detect_leaks=1 "$exe" -minimize_crash=1 -runs=20000 -timeout=1 \
        -exact_artifact_path="$dest/$name.min" "$a" >"$LOGS/$t.minimize.log" 2>&1 || true
    fi
    cp "$a" "$dest/$name"
    final="$dest/$name"
    [ -f "$dest/$name.min" ] && final="$dest/$name.min"
    echo "scripts/fuzz.sh builds it; then: $exe -timeout=1 -malloc_limit_mb=64 $final" >"$dest/$name.REPLAY"
    grep -m1 -E 'ERROR:|runtime error|fuzz:' "$LOGS/$t.log" >>"$dest/$name.REPLAY" || true
  done
  if [ "$crashes" -gt 0 ] || { [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && ! grep -q 'Done [0-9]* runs' "$LOGS/$t.log"; }; then
    found_any=1
  fi
  summary+=("$(printf '%-18s %12s %9s %7ss %8s' "$t" "${execs:-?}" "${feats:-?}" "$secs" "$crashes")")
  echo "   executions ${execs:-?}, features ${feats:-?}, ${secs}s, crashes $crashes (log $LOGS/$t.log)"
done
echo
printf '%-18s %12s %9s %8s %8s\n' target executions features time crashes
printf '%s\n' "${summary[@]}"
[ "$found_any" -eq 0 ] || echo "findings: fuzz/crashes/ (each with a .REPLAY file)"
exit "$found_any"
