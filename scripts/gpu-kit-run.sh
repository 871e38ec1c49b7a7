#!/usr/bin/env bash
# The GPU kit's entry point, packed as `run` by scripts/gpu-kit.sh pack. Checks a GPU machine in
# one command, with nothing but the kit, the NVIDIA driver and (for cuBLAS, cuDNN, NCCL and the
# PyTorch comparison) a Python with PyTorch's CUDA wheels: no compiler, packages or network.
#   run [--quick] [--out DIR] [--only STAGES] [--skip STAGES]
# Stages, in order (each with its own time limit; a failed stage is reported and the others go
# on; the whole run stays within 6 minutes, --quick within 2, by skipping what no longer fits):
#   start       every program of the kit starts (--help) with only the kit's libraries, each one
#               resolving into lib/ or to glibc (ldd)
#   gpu         nvidia-smi -L and the driver; without a GPU the run ends here: "no GPU", exit 1
#   libs        finds cuBLAS, cuDNN and NCCL (the sonames ringgrad was built for): the loader's
#               default paths, /usr/local/cuda*/lib64, /usr/lib/x86_64-linux-gnu, then the
#               nvidia/*/lib folders of python3's CUDA wheels; sets RG_CUBLAS_LIBRARY etc.
#   probe       ringgrad-bench on the GPU for one step: the device and the libraries' versions
#   tests.*     each GPU test program (gtest), every test
#   tests.nccl-blocking  rg_gpu_tests' one-rank NCCL tests again with RG_NCCL_NONBLOCKING=0
#   mnist       one MNIST epoch with the demo recipe (scripts/demo.sh) in one process on cuda:0
#   throughput  steady-state training throughput (median of timed windows after warm-up, the
#               device synchronized at each window's ends) of ToyNet b64, ResNet-18 b64 and b256
#               (f32, bf16 autocast) and gpt-nano (B64, T128), ringgrad and PyTorch eager
#               (default settings; also bf16 with channels_last) alternating, with ratios
#   overlap     ringgrad-bench overlap --device cuda: ResNet-18 b64 and b256 and gpt-mini b16
#               with the all-reduces of 8 GPUs over NVLink and of 64 over InfiniBand modelled on
#               the NCCL stream, then scale's predictions for 8/64/256 GPUs from its GPU step
#               profile (docs/overlap.md's study; not with --quick; CSVs, PNGs and profiles in
#               DIR/overlap)
#   memcheck    compute-sanitizer memcheck of a short ToyNet training run (not with --quick)
#   racecheck   compute-sanitizer racecheck of the op table's f32 CUDA tests (not with --quick)
#               (both time-boxed: status "timeout" when the box ends them, "unavailable" where
#               the machine refuses the sanitizer; neither counts as a failure)
#   micro       the CUDA kernels' micro-benchmarks, GB/s (not with --quick)
# Writes DIR/report.md and DIR/report.json (default DIR: ./kit-report) and every stage's log in
# DIR/logs. Exit code: 0 when every stage that ran passed; 1 otherwise, and without a GPU.
# --cpu-smoke (for the kit's own test, tests/install/gpu_kit_test.sh): the same stages on the CPU
# with tiny batches and steps, no GPU, libraries or sanitizers: checks the stages and the report,
# not a GPU; its figures mean nothing.
set -euo pipefail

KIT="$(cd "$(dirname "$0")" && pwd)"
OUT="$PWD/kit-report"
QUICK=0
SMOKE=0
DEVICE=cuda
ONLY=""
SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --cpu-smoke) SMOKE=1; DEVICE=cpu; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --skip) SKIP=",$2,"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run: unknown option '$1' (see run --help)" >&2; exit 2 ;;
  esac
done
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
mkdir -p "$OUT/logs" "$OUT/throughput"
: >"$OUT/stages.tsv"

T0="$(date +%s)"
MODE="$([ "$QUICK" = 1 ] && echo quick || echo full)$([ "$SMOKE" = 0 ] || echo ", cpu-smoke")"
BUDGET=$((QUICK ? 115 : 345))  # seconds for all stages; the report is written after them
ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
CUDA_DIRS=""  # where `libs` found cuBLAS, cuDNN and NCCL
GPU_NAME=""
DRIVER=""
RG_DEVICE=""
FAILED=0
NO_GPU=""
# The field separator of the stages' and the throughput table's rows (not whitespace, so that
# `read` keeps empty fields).
US=$'\x1f'

manifest() { sed -n "s/^$1=//p" "$KIT/MANIFEST" 2>/dev/null | head -1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
wanted() {
  local s="$1" base="${1%%.*}"
  if [ -n "$ONLY" ] && [[ "$ONLY" != *",$s,"* && "$ONLY" != *",$base,"* ]]; then return 1; fi
  [[ "$SKIP" != *",$s,"* && "$SKIP" != *",$base,"* ]]
}
# record NAME STATUS SECONDS SUMMARY: one line on the console and one row of the report.
record() {
  local name="$1" status="$2" secs="$3" summary="$4"
  summary="${summary//$US/ }"
  summary="${summary//$'\n'/ }"
  printf '%s\n' "$name$US$status$US$secs$US$summary" >>"$OUT/stages.tsv"
  printf '[%-7s] %-26s %6ss  %s\n' "$status" "$name" "$secs" "$summary"
  [ "$status" != failed ] || FAILED=1
}
# limit WANTED MINIMUM: WANTED seconds, or what is left of the budget; 0 when under MINIMUM.
limit() {
  local l
  l="$(left)"
  [ "$l" -lt "$1" ] || l="$1"
  if [ "$l" -lt "$2" ]; then echo 0; else echo "$l"; fi
}
# Our programs on the GPU: the kit's libraries first (as their RUNPATH says; first here too, so
# that no folder of the caller's path replaces one), then the CUDA libraries' folders, then the
# caller's path (the driver's libcuda may be found through it).
ours() {
  local p="$KIT/lib${CUDA_DIRS:+:$CUDA_DIRS}"
  [ -z "$ORIG_LD_LIBRARY_PATH" ] || p="$p:$ORIG_LD_LIBRARY_PATH"
  env LD_LIBRARY_PATH="$p" "$@"
}
# Python and PyTorch with the caller's environment, untouched.
theirs() { env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$@"; }
json_str() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\t'/ }"
  s="${s//$'\r'/}"
  s="${s//$'\n'/\\n}"
  s="$(printf '%s' "$s" | tr -d '\000-\010\013-\037')"  # other control characters (colours)
  printf '"%s"' "$s"
}

echo "ringgrad GPU kit: $(manifest commit), CUDA archs $(manifest cuda_archs), packed $(manifest packed)"
echo "report: $OUT"

# ---- start: every program starts with only the kit's libraries ----
stage_start() {
  local t0 log="$OUT/logs/start.log" bad=0 ok=() exe rel name path lister
  t0="$(now)"
  : >"$log"
  if command -v ldd >/dev/null; then lister=(ldd); else lister=(/lib64/ld-linux-x86-64.so.2 --list); fi
  for exe in "$KIT"/bin/* "$KIT"/tests/* "$KIT"/bench/rg_micro_bench; do
    [ -x "$exe" ] || continue
    rel="${exe#"$KIT"/}"
    local problems=""
    while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      case "$name" in
        linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | libpthread.so* | \
          librt.so* | libutil.so* | libresolv.so*) continue ;;
      esac
      if [ "$path" = not ]; then
        problems+=" $name (not found)"
      elif [ "$(cd "$(dirname "$path")" && pwd -P)" != "$(cd "$KIT/lib" && pwd -P)" ]; then
        problems+=" $name (from $path, not the kit)"
      fi
    done < <(env LD_LIBRARY_PATH="$KIT/lib" "${lister[@]}" "$exe" 2>&1)
    if [ -z "$problems" ] &&
      env LD_LIBRARY_PATH="$KIT/lib" timeout -k 5 20 "$exe" --help >>"$log" 2>&1; then
      ok+=("$rel")
      echo "start: $rel ok" >>"$log"
    else
      bad=1
      [ -n "$problems" ] || problems=" --help failed (exit code or output in this log)"
      echo "start: $rel FAILED:$problems" >>"$log"
      echo "  $rel does not start with only the kit's libraries:$problems"
    fi
  done
  if [ "$bad" = 0 ]; then
    record start ok "$(elapsed "$t0")" "every program starts with only the kit's libraries: ${ok[*]}"
  else
    record start failed "$(elapsed "$t0")" "some programs do not start with only the kit's libraries (ok: ${ok[*]:-none}; see logs/start.log)"
  fi
}

# ---- gpu: is there one? ----
stage_gpu() {
  local t0 log="$OUT/logs/gpu.log"
  t0="$(now)"
  if [ "$SMOKE" = 1 ]; then record gpu skipped 0 "--cpu-smoke: the stages run on the CPU"; return; fi
  if ! command -v nvidia-smi >/dev/null; then
    NO_GPU="nvidia-smi is not installed"
  elif ! nvidia-smi -L >"$log" 2>&1 || ! grep -q '^GPU ' "$log"; then
    NO_GPU="nvidia-smi -L failed or lists no GPU: $(head -1 "$log")"
  fi
  if [ -n "$NO_GPU" ]; then
    record gpu failed "$(elapsed "$t0")" "no GPU: $NO_GPU"
    return
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
    >>"$log" 2>&1 || true
  GPU_NAME="$(grep '^GPU 0' "$log" | sed 's/^GPU 0: //; s/ (UUID.*//')"
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  local cc
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)"
  local note=""
  if [ -n "$cc" ] && [[ ";$(manifest cuda_archs);" != *";$cc;"* ]]; then
    note=" (no sm_$cc code in the kit: kernels JIT-compiled from PTX, slower start)"
  fi
  record gpu ok "$(elapsed "$t0")" "$(grep -c '^GPU ' "$log") GPU(s): $(grep '^GPU ' "$log" | sed 's/ (UUID.*//' | paste -sd';'), driver $DRIVER$note"
}

# ---- libs: cuBLAS, cuDNN, NCCL ----
PY_DIRS=""
python_lib_dirs() {
  # The nvidia/*/lib folders of python3's CUDA wheels (and torch/lib), one per line.
  command -v python3 >/dev/null || return 0
  theirs timeout 30 python3 - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
try:
    sp = site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    sp = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
for p in sp:
    roots.append(os.path.join(p, "nvidia"))
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))) + [os.path.join(os.path.dirname(r), "torch", "lib")]:
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print("\n".join(seen))
EOF
}
find_lib() {  # find_lib SONAME -> "path<TAB>where"
  local so="$1" d p
  local IFS=$'\n'
  for d in $(echo "$ORIG_LD_LIBRARY_PATH" | tr ':' '\n'); do
    [ -n "$d" ] && [ -e "$d/$so" ] && { printf '%s\t%s\n' "$d/$so" "LD_LIBRARY_PATH"; return; }
  done
  p="$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s && /x86-64/ { print $NF; exit }')"
  [ -n "$p" ] && [ -e "$p" ] && { printf '%s\t%s\n' "$p" "the loader's cache (ldconfig)"; return; }
  for p in /usr/local/cuda*/lib64/"$so" /usr/local/cuda*/lib/"$so" /usr/local/cuda*/targets/*/lib/"$so" \
    /usr/lib/x86_64-linux-gnu/"$so" /usr/lib64/"$so" /usr/local/lib/"$so"; do
    [ -e "$p" ] && { printf '%s\t%s\n' "$p" "a system folder"; return; }
  done
  [ -n "$PY_DIRS" ] || PY_DIRS="$(python_lib_dirs)"
  for d in $PY_DIRS; do
    [ -e "$d/$so" ] && { printf '%s\t%s\n' "$d/$so" "python3's CUDA wheels"; return; }
  done
  return 1
}
LIB_REPORT=()
stage_libs() {
  local t0 log="$OUT/logs/libs.log" missing=() entry name so var found path where
  t0="$(now)"
  if [ "$SMOKE" = 1 ]; then record libs skipped 0 "--cpu-smoke"; return; fi
  : >"$log"
  for entry in "cuBLAS:cublas_soname:libcublas.so.13:RG_CUBLAS_LIBRARY" \
    "cuDNN:cudnn_soname:libcudnn.so.9:RG_CUDNN_LIBRARY" "NCCL:nccl_soname:libnccl.so.2:RG_NCCL_LIBRARY"; do
    IFS=: read -r name key so var <<<"$entry"
    so="$(manifest "$key" || true)"
    [ -n "$so" ] || so="$(echo "$entry" | cut -d: -f3)"
    if [ -n "${!var:-}" ] && [ -e "${!var}" ]; then
      found="$(printf '%s\t%s' "${!var}" "\$$var")"
    elif ! found="$(find_lib "$so")"; then
      missing+=("$name ($so)")
      echo "$name: $so not found" >>"$log"
      LIB_REPORT+=("$name|$so|not found|")
      continue
    fi
    path="${found%%$'\t'*}"
    where="${found#*$'\t'}"
    export "$var=$path"
    case ":$CUDA_DIRS:" in *":$(dirname "$path"):"*) ;; *) CUDA_DIRS="${CUDA_DIRS:+$CUDA_DIRS:}$(dirname "$path")" ;; esac
    echo "$name: $so -> $path (from $where)" >>"$log"
    LIB_REPORT+=("$name|$so|$path|$where")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    record libs failed "$(elapsed "$t0")" "not found: ${missing[*]} (set RG_CUBLAS_LIBRARY, RG_CUDNN_LIBRARY or RG_NCCL_LIBRARY to the file)"
  else
    record libs ok "$(elapsed "$t0")" "$(sed 's/ (from .*//' "$log" | paste -sd';' | sed 's/;/; /g')"
  fi
}

# ---- probe: one step on the GPU; the device and the libraries' versions ----
stage_probe() {
  local t0 log="$OUT/logs/probe.log" rc=0
  t0="$(now)"
  ours timeout -k 5 60 "$KIT/bin/ringgrad-bench" train --device "$DEVICE" --model toynet --warmup 1 \
    --windows 1 --window-steps 1 >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    RG_DEVICE="$(grep -o 'device=.*' "$log" | head -1 | sed 's/^device=//; s/ params=[0-9]*//')"
    [ "$SMOKE" = 0 ] || RG_DEVICE="cpu ($(head -1 "$log"))"
    record probe ok "$(elapsed "$t0")" "$RG_DEVICE"
  elif grep -q "no CUDA device" "$log"; then
    NO_GPU="ringgrad sees no CUDA device: $(grep -o 'no CUDA device: .*' "$log" | head -1 | sed 's/^no CUDA device: //')"
    record probe failed "$(elapsed "$t0")" "$NO_GPU"
  else
    record probe failed "$(elapsed "$t0")" "exit code $rc: $(grep -v '^ *$' "$log" | tail -1)"
  fi
}

# ---- tests.<program>: gtest ----
# stage_test EXE [NAME GTEST-ARGS...]: NAME defaults to tests.<program>.
stage_test() {
  local exe="$1" name t0 log rc=0 secs passed failed skipped names
  name="${2:-tests.$(basename "$exe")}"
  shift $(($# > 1 ? 2 : 1))
  wanted "$name" || return 0
  log="$OUT/logs/$name.log"
  secs="$(limit $((QUICK ? 75 : 180)) 20)"
  [ "$secs" != 0 ] || { record "$name" skipped 0 "the time budget is spent"; return; }
  t0="$(now)"
  ours timeout -k 5 "$secs" "$exe" --gtest_color=no --gtest_output="json:$OUT/logs/$name.json" \
    "$@" >"$log" 2>&1 || rc=$?
  passed="$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)"
  failed="$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' || echo 0)"
  skipped="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' || echo 0)"
  names="$(grep -E '^\[  FAILED  \] [A-Za-z_]' "$log" | sed 's/^\[  FAILED  \] //; s/ (.*//; s/, where .*//' | sort -u | paste -sd' ')"
  if [ "$rc" = 0 ]; then
    record "$name" ok "$(elapsed "$t0")" "$passed passed, $skipped skipped"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$name" failed "$(elapsed "$t0")" "timed out after ${secs}s ($(grep -c '^\[       OK \]' "$log") tests had passed; last started: $(grep '^\[ RUN      \]' "$log" | tail -1 | sed 's/^\[ RUN      \] //'))"
  else
    record "$name" failed "$(elapsed "$t0")" "$passed passed, $failed failed, $skipped skipped (exit code $rc); failed: ${names:-see the log}"
  fi
}

# ---- mnist: the demo recipe, one process on the GPU ----
MNIST_TOP1=""
stage_mnist() {
  local t0 log="$OUT/logs/mnist.log" rc=0 secs top1
  secs="$(limit 90 20)"
  [ "$secs" != 0 ] || { record mnist skipped 0 "the time budget is spent"; return; }
  t0="$(now)"
  local smoke=()
  [ "$SMOKE" = 0 ] || smoke=(--max-steps 20 --eval-samples 500)
  ours timeout -k 5 "$secs" "$KIT/bin/ringgrad-train" --model toynet --dataset mnist \
    --data-dir "$KIT/data/mnist" --epochs 1 --batch-size 64 --optimizer adam --lr 0.002 \
    --lr-schedule cosine --label-smoothing 0.1 --seed 1 --workers 1 --device "$DEVICE" \
    "${smoke[@]}" >"$log" 2>&1 || rc=$?
  top1="$(grep -oE '"top1":[0-9.eE+-]+' "$log" | tail -1 | cut -d: -f2)"
  if [ "$rc" != 0 ] || [ -z "$top1" ]; then
    record mnist failed "$(elapsed "$t0")" "exit code $rc: $(grep -v '^ *$' "$log" | tail -1 | cut -c1-200)"
    return
  fi
  MNIST_TOP1="$(awk -v t="$top1" 'BEGIN { printf "%.2f", 100 * t }')"
  local train_s
  train_s="$(grep -oE '"seconds":[0-9.eE+-]+' "$log" | tail -1 | cut -d: -f2)"
  if [ "$SMOKE" = 1 ]; then
    record mnist ok "$(elapsed "$t0")" "--cpu-smoke, 20 steps: top-1 $MNIST_TOP1 % on 500 test images"
  elif awk -v t="$top1" 'BEGIN { exit !(t >= 0.97) }'; then
    record mnist ok "$(elapsed "$t0")" "ToyNet, 1 epoch, batch 64, Adam: top-1 $MNIST_TOP1 % (training ${train_s:-?} s)"
  else
    record mnist failed "$(elapsed "$t0")" "top-1 $MNIST_TOP1 % is below 97 % (the demo recipe reaches about 98.7 %)"
  fi
}

# ---- throughput: ours and PyTorch's, alternating ----
# id|model|batch|amp|label; PyTorch also runs the bf16 ResNet-18 rows with channels_last, and we
# also run every row with --cuda-graphs (side ours_graphs), the ResNet-18 rows with cuDNN's
# legacy convolution API (side ours_legacy, --cudnn-conv-api legacy; the default is the graph API)
# and the bf16 ResNet-18 rows with --channels-last (side ours_cl, against PyTorch's torch_cl);
# ResNet-18 b256 f32 also as DDP with one rank over NCCL under ringgrad-run, eager and with
# --cuda-graphs (sides ours_ddp and ours_ddp_graphs: the collectives captured with the step).
WORKLOADS_FULL="toynet_b64|toynet|64|off|ToyNet b64 f32
resnet18_b64|resnet18|64|off|ResNet-18 b64 f32
resnet18_b64_bf16|resnet18|64|bf16|ResNet-18 b64 bf16
resnet18_b256|resnet18|256|off|ResNet-18 b256 f32
resnet18_b256_bf16|resnet18|256|bf16|ResNet-18 b256 bf16
resnet18_b256_f16|resnet18|256|f16|ResNet-18 b256 f16 + GradScaler
gpt_nano|gpt-nano|64|off|gpt-nano B64 T128 f32
gpt_nano_f16|gpt-nano|64|f16|gpt-nano B64 T128 f16 + GradScaler (AdamW)"
WORKLOADS_QUICK="toynet_b64|toynet|64|off|ToyNet b64 f32
resnet18_b256|resnet18|256|off|ResNet-18 b256 f32
resnet18_b256_bf16|resnet18|256|bf16|ResNet-18 b256 bf16
gpt_nano|gpt-nano|64|off|gpt-nano B64 T128 f32"
TORCH=""  # "" until checked; then "yes" or why not
json_num() { grep -oE "\"$2\": ?[0-9.eE+-]+" "$1" 2>/dev/null | head -1 | sed 's/.*: \{0,1\}//'; }
stage_throughput() {
  local t0 cap workloads steps reps pass id model batch amp label side rc secs f
  t0="$(now)"
  cap="$(limit $((QUICK ? 60 : 150)) 15)"
  [ "$cap" != 0 ] || { record throughput skipped 0 "the time budget is spent"; return; }
  local end=$(($(date +%s) + cap))
  if [ "$SMOKE" = 1 ]; then
    # Tiny batches: the CPU would take minutes over the real ones.
    workloads="$(echo "$WORKLOADS_QUICK" | awk -F'|' -v OFS='|' '{ $3 = 4; sub(/ [bB][0-9]+/, " b4", $5); print }')"
    steps=(--warmup 1 --windows 2 --window-steps 1) reps=1
  elif [ "$QUICK" = 1 ]; then
    workloads="$WORKLOADS_QUICK" steps=(--warmup 5 --windows 3 --window-steps 10) reps=1
  else
    workloads="$WORKLOADS_FULL" steps=(--warmup 10 --windows 5 --window-steps 20) reps=2
  fi
  if command -v python3 >/dev/null && theirs timeout 60 python3 -c 'import sys, torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
sys.exit(0 if sys.argv[1] == "cpu" or torch.cuda.is_available() else 3)' "$DEVICE" >"$OUT/logs/torch.log" 2>&1; then
    TORCH="yes"
  else
    TORCH="PyTorch with CUDA is not importable by python3 ($(tail -1 "$OUT/logs/torch.log" 2>/dev/null))"
  fi
  local ran=0 short=0
  for pass in $(seq 1 "$reps"); do
    while IFS='|' read -r id model batch amp label; do
      for side in ours ours_graphs ours_legacy ours_cl ours_ddp ours_ddp_graphs torch torch_cl; do
        [[ "$side" = ours* ]] || [ "$TORCH" = yes ] || continue
        [ "$side" != torch_cl ] || [ "$amp" = bf16 ] || continue
        # (CUDA graphs and cuDNN need a GPU: not in --cpu-smoke)
        [ "$side" != ours_graphs ] || [ "$DEVICE" != cpu ] || continue
        [ "$side" != ours_legacy ] || { [ "$DEVICE" != cpu ] && [ "$model" = resnet18 ]; } || continue
        [ "$side" != ours_cl ] || { [ "$DEVICE" != cpu ] && [ "$model" = resnet18 ] && [ "$amp" = bf16 ]; } || continue
        [[ "$side" != ours_ddp* ]] || { [ "$DEVICE" != cpu ] && [ "$id" = resnet18_b256 ]; } || continue
        secs=$((end - $(date +%s)))
        [ "$secs" -gt 60 ] && secs=60
        if [ "$secs" -lt 12 ]; then short=1; continue; fi
        f="$OUT/throughput/$id.$side.$pass"
        rm -f "$f.json"
        rc=0
        case "$side" in
          ours | ours_graphs | ours_legacy | ours_cl)
            local graphs=()
            [ "$side" != ours_graphs ] || graphs=(--cuda-graphs)
            [ "$side" != ours_legacy ] || graphs=(--cudnn-conv-api legacy)
            [ "$side" != ours_cl ] || graphs=(--channels-last)
            # RG_CUDNN_LOG: each convolution's engine (or legacy algorithm) choice, in the log
            RG_CUDNN_LOG=1 ours timeout -k 5 "$secs" "$KIT/bin/ringgrad-bench" train --device "$DEVICE" \
              --model "$model" --batch-size "$batch" --amp "$amp" "${graphs[@]}" "${steps[@]}" \
              --json "$f.json" >"$f.log" 2>&1 || rc=$? ;;
          ours_ddp | ours_ddp_graphs)
            local graphs=()
            [ "$side" != ours_ddp_graphs ] || graphs=(--cuda-graphs)
            ours timeout -k 5 "$secs" "$KIT/bin/ringgrad-run" --nproc-per-node 1 --master-port 0 \
              "$KIT/bin/ringgrad-bench" train --ddp --device "$DEVICE" --model "$model" \
              --batch-size "$batch" --amp "$amp" "${graphs[@]}" "${steps[@]}" --json "$f.json" \
              >"$f.log" 2>&1 || rc=$? ;;
          torch | torch_cl)
            local cl=()
            [ "$side" = torch ] || cl=(--channels-last)
            theirs timeout -k 5 "$secs" python3 "$KIT/bench/pytorch/train_bench.py" --device "$DEVICE" \
              --model "$model" --batch-size "$batch" --amp "$amp" "${cl[@]}" "${steps[@]}" \
              --json "$f.json" >"$f.log" 2>&1 || rc=$? ;;
        esac
        ran=$((ran + 1))
        if [ "$rc" != 0 ] || [ ! -s "$f.json" ]; then
          echo "  throughput: $label ($side) failed with exit code $rc: $(grep -v '^ *$' "$f.log" | tail -1 | cut -c1-160)"
          echo "$id|$side|$pass|failed" >>"$OUT/throughput/failures"
        else
          printf '  %-22s %-9s %12.0f %s\n' "$label" "$side" "$(json_num "$f.json" median)" \
            "$(sed -n 's/.*"unit": \{0,1\}"\([^"]*\)".*/\1/p' "$f.json")"
        fi
      done
    done <<<"$workloads"
    [ "$short" = 0 ] || break
  done
  throughput_table "$workloads"
  local summary="$ran runs"
  [ "$TORCH" = yes ] || summary+="; no PyTorch column: $TORCH"
  [ "$short" = 0 ] || summary+="; stopped early: the stage's time ran out"
  if [ -s "$OUT/throughput/failures" ]; then
    record throughput failed "$(elapsed "$t0")" "$summary; failed: $(cut -d'|' -f1,2 "$OUT/throughput/failures" | sort -u | paste -sd' ')"
  else
    record throughput ok "$(elapsed "$t0")" "$summary (table in report.md)"
  fi
}
# The medians of a side's runs (each run's own figure is its windows' median).
side_median() {  # side_median ID SIDE FIELD
  local f v=()
  for f in "$OUT/throughput/$1.$2."*.json; do
    [ -s "$f" ] && v+=("$(json_num "$f" "$3")")
  done
  [ ${#v[@]} -gt 0 ] || return 0
  printf '%s\n' "${v[@]}" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
side_runs() { local n=0 f; for f in "$OUT/throughput/$1.$2."*.json; do [ -s "$f" ] && n=$((n + 1)); done; echo "$n"; }
# Writes throughput.tsv ($US-separated): label, unit, ours, theirs, ratio, ours peak MB, theirs
# peak MB, runs, PyTorch variant.
throughput_table() {
  local id model batch amp label side ours_v theirs_v ratio unit variant mine mine_label
  : >"$OUT/throughput.tsv"
  while IFS='|' read -r id model batch amp label; do
    unit="img/s"
    [[ "$model" != gpt-* ]] || unit="tok/s"
    for mine in ours ours_graphs ours_legacy ours_cl ours_ddp ours_ddp_graphs torch_cl; do
      # ours and ours_graphs against PyTorch eager; ours against channels_last too (bf16 rows).
      side=torch mine_label="$label" variant="eager"
      if [ "$mine" = ours_graphs ]; then
        [ "$DEVICE" != cpu ] || continue
        mine_label="$label, --cuda-graphs"
      elif [ "$mine" = ours_legacy ]; then
        [ "$DEVICE" != cpu ] && [ "$model" = resnet18 ] || continue
        mine_label="$label, --cudnn-conv-api legacy"
      elif [[ "$mine" = ours_ddp* ]]; then
        [ "$DEVICE" != cpu ] && [ "$id" = resnet18_b256 ] || continue
        mine_label="$label, DDP 1 rank (NCCL)"
        [ "$mine" = ours_ddp ] || mine_label+=", --cuda-graphs"
      elif [ "$mine" = ours_cl ]; then
        [ "$DEVICE" != cpu ] && [ "$model" = resnet18 ] && [ "$amp" = bf16 ] || continue
        mine_label="$label, --channels-last" side=torch_cl variant="eager, channels_last"
      elif [ "$mine" = torch_cl ]; then
        [ "$amp" = bf16 ] || continue
        mine=ours side=torch_cl variant="eager, channels_last"
      fi
      ours_v="$(side_median "$id" "$mine" median)"
      theirs_v="$(side_median "$id" "$side" median)"
      ratio=""
      [ -n "$ours_v" ] && [ -n "$theirs_v" ] && ratio="$(awk -v a="$ours_v" -v b="$theirs_v" 'BEGIN { if (b > 0) printf "%.2f", a / b }')"
      printf '%s\n' "$mine_label$US$unit$US$ours_v$US$theirs_v$US$ratio$US$(side_median "$id" "$mine" peak_device_mb)$US$(side_median "$id" "$side" peak_device_mb)$US$(side_runs "$id" "$mine")/$(side_runs "$id" "$side")$US$variant" \
        >>"$OUT/throughput.tsv"
    done
  done <<<"$1"
}

# ---- compute-sanitizer ----
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)"
stage_sanitizer() {  # stage_sanitizer NAME WANTED_SECONDS TOOL CMD...
  local name="$1" want="$2" tool="$3" t0 log secs rc=0 summary
  shift 3
  log="$OUT/logs/$name.log"
  if [ "$QUICK" = 1 ] || [ "$SMOKE" = 1 ]; then record "$name" skipped 0 "not with --quick or --cpu-smoke"; return; fi
  if [ -z "$SANITIZER" ]; then record "$name" skipped 0 "compute-sanitizer is not installed"; return; fi
  secs="$(limit "$want" 30)"
  [ "$secs" != 0 ] || { record "$name" skipped 0 "the time budget is spent"; return; }
  t0="$(now)"
  ours timeout -k 10 "$secs" "$SANITIZER" --tool "$tool" --error-exitcode 3 --print-limit 20 \
    "$@" >"$log" 2>&1 || rc=$?
  summary="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^========= //')"
  if [ "$rc" = 0 ]; then
    record "$name" ok "$(elapsed "$t0")" "${summary:-no summary line}"
  elif [ "$rc" != 3 ] && [[ "$summary" =~ SUMMARY:\ 0\ (errors|hazards) ]]; then
    # The program's own failures (a test that fails without the sanitizer too) are its own
    # stage's findings, not the sanitizer's.
    record "$name" ok "$(elapsed "$t0")" "$summary (the program itself exited $rc; see its own stage)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    # Time-boxed: what ran until then is in the log; not a finding either way.
    record "$name" timeout "$(elapsed "$t0")" "stopped at its time limit (${secs}s) with $(grep -cE '^========= (Invalid|Race|Error)' "$log") reports so far; see logs/$name.log"
  elif grep -q "Device not supported" "$log"; then
    # The sandbox of some GPU machines (gVisor) refuses the sanitizer: not ringgrad's failure.
    record "$name" unavailable "$(elapsed "$t0")" "compute-sanitizer cannot run on this machine: $(grep -m1 'Device not supported' "$log" | sed 's/^========= //')"
  else
    record "$name" failed "$(elapsed "$t0")" "exit code $rc${summary:+: $summary}; see logs/$name.log"
  fi
}

# ---- micro: the CUDA kernels' micro-benchmarks ----
stage_micro() {
  local t0 log="$OUT/logs/micro.log" secs rc=0
  if [ "$QUICK" = 1 ] || [ "$SMOKE" = 1 ]; then record micro skipped 0 "not with --quick or --cpu-smoke"; return; fi
  secs="$(limit 40 15)"
  [ "$secs" != 0 ] || { record micro skipped 0 "the time budget is spent"; return; }
  t0="$(now)"
  ours timeout -k 5 "$secs" "$KIT/bench/rg_micro_bench" --benchmark_filter='^cuda/' \
    --benchmark_min_time=0.05 --benchmark_out="$OUT/micro.json" --benchmark_out_format=json \
    >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    record micro ok "$(elapsed "$t0")" "$(grep -c '^cuda/' "$log") CUDA kernels timed (logs/micro.log, micro.json)"
  else
    record micro failed "$(elapsed "$t0")" "exit code $rc: $(grep -v '^ *$' "$log" | tail -1 | cut -c1-160)"
  fi
}

stage_overlap() {
  local t0 log="$OUT/logs/overlap.log" secs rc=0 dev=cuda link l n rows work model batch tag
  local extra plot scale_plot
  local workloads="resnet18:64 resnet18:256 gpt-mini:16"
  if [ "$QUICK" = 1 ]; then record overlap skipped 0 "not with --quick"; return; fi
  [ "$SMOKE" = 0 ] || { dev=cpu; workloads="toynet:4"; }
  secs="$(limit 90 15)"
  [ "$secs" != 0 ] || { record overlap skipped 0 "the time budget is spent"; return; }
  local end=$(($(date +%s) + secs))
  t0="$(now)"
  mkdir -p "$OUT/overlap"
  # docs/overlap.md's study: each workload with the all-reduces of 8 GPUs over NVLink and of 64
  # over InfiniBand modelled, then scale's predictions for 8/64/256 GPUs from the 25 MiB profile.
  for work in $workloads; do
    model="${work%:*}" batch="${work#*:}" extra=()
    [ "$model" != gpt-mini ] || extra=(--block-size 128)
    for link in nvlink-h100:8 ib-ndr:64; do
      l="${link%:*}" n="${link#*:}" tag="$model-b$batch-$l"
      secs=$((end - $(date +%s)))
      if [ "$secs" -lt 5 ]; then rc=124; echo "overlap: no time left for $tag" >>"$log"; break 2; fi
      # PNGs where the machine has gnuplot (the CSVs hold the same figures).
      plot=() scale_plot=()
      if command -v gnuplot >/dev/null 2>&1; then
        plot=(--plot "$OUT/overlap/$tag.png") scale_plot=(--plot "$OUT/overlap/scale-$tag.png")
      fi
      ours timeout -k 5 "$secs" "$KIT/bin/ringgrad-bench" overlap --device "$dev" --model "$model" \
        --batch-size "$batch" "${extra[@]}" --sim-link "$l" --sim-ranks "$n" \
        --bucket-mb 1,5,25,single --warmup 3 --iters 5 --csv "$OUT/overlap/$tag.csv" \
        "${plot[@]}" --profile-out "$OUT/overlap/p-$tag-{bucket}.json" >>"$log" 2>&1 || rc=$?
      [ "$rc" = 0 ] || break 2
      ours "$KIT/bin/ringgrad-bench" scale --trace "$OUT/overlap/p-$tag-25.json" \
        --sim-link "$l" --gpus 8,64,256 --bucket-mb 1,5,25,single "${scale_plot[@]}" \
        >>"$log" 2>&1 || rc=$?
      [ "$rc" = 0 ] || break 2
    done
  done
  rows="$(cat "$OUT/overlap/"*.csv 2>/dev/null | grep -vc '^model' || true)"
  if [ "$rc" = 0 ]; then
    record overlap ok "$(elapsed "$t0")" "$workloads, nvlink-h100 x8 and ib-ndr x64: $rows rows (logs/overlap.log, overlap/)"
  else
    record overlap failed "$(elapsed "$t0")" "exit code $rc: $(grep -v '^ *$' "$log" | tail -1 | cut -c1-160)"
  fi
}

# ---- the report ----
write_report() {
  local code="$1" md="$OUT/report.md" js="$OUT/report.json" name status secs summary first=1 e
  {
    echo "# ringgrad GPU kit report"
    echo
    echo "- kit: $(manifest commit), CUDA archs $(manifest cuda_archs), packed $(manifest packed)"
    echo "- host: $(hostname 2>/dev/null || echo ?), $(date -u +%Y-%m-%dT%H:%M:%SZ), mode: $MODE, $(($(date +%s) - T0)) s"
    [ "$SMOKE" = 0 ] || echo "- **--cpu-smoke**: every stage ran on the CPU with tiny batches; no figure here says anything about a GPU"
    echo "- GPU: ${GPU_NAME:-none}${DRIVER:+, driver $DRIVER}"
    [ -z "$RG_DEVICE" ] || echo "- ringgrad sees: $RG_DEVICE"
    for e in "${LIB_REPORT[@]}"; do
      IFS='|' read -r name so secs summary <<<"$e"
      echo "- $name: $so -> $secs${summary:+ ($summary)}"
    done
    [ -z "$MNIST_TOP1" ] || echo "- MNIST, one epoch (demo recipe, one GPU): top-1 $MNIST_TOP1 %"
    [ -z "$NO_GPU" ] || echo "- **no GPU**: $NO_GPU"
    echo
    echo "| stage | status | seconds | summary |"
    echo "| --- | --- | ---: | --- |"
    while IFS="$US" read -r name status secs summary; do
      echo "| $name | $status | $secs | ${summary//|/\\|} |"
    done <"$OUT/stages.tsv"
    if [ -s "$OUT/throughput.tsv" ]; then
      echo
      echo "Training throughput in steady state (median of timed windows after warm-up; the"
      echo "device synchronized at each window's ends; synthetic data resident on the GPU; SGD"
      echo "momentum 0.9, gpt-nano: AdamW). PyTorch: $(tail -1 "$OUT/logs/torch.log" 2>/dev/null), eager, default settings."
      echo "ratio = ringgrad / PyTorch (higher is better for ringgrad). runs = ringgrad/PyTorch runs."
      echo
      echo "| workload | PyTorch variant | unit | ringgrad | PyTorch | ratio | ringgrad peak MB | PyTorch peak MB | runs |"
      echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
      local label unit o t r op tp runs variant
      while IFS="$US" read -r label unit o t r op tp runs variant; do
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$variant" "$unit" \
          "$(awk -v v="$o" 'BEGIN { if (v != "") printf "%.0f", v; else printf "-" }')" \
          "$(awk -v v="$t" 'BEGIN { if (v != "") printf "%.0f", v; else printf "-" }')" "${r:--}" \
          "$(awk -v v="$op" 'BEGIN { if (v != "") printf "%.0f", v; else printf "-" }')" \
          "$(awk -v v="$tp" 'BEGIN { if (v != "") printf "%.0f", v; else printf "-" }')" "$runs"
      done <"$OUT/throughput.tsv"
    fi
    echo
    echo "Logs: logs/<stage>.log; each throughput run: throughput/<workload>.<side>.<run>.{log,json}."
  } >"$md"
  {
    printf '{"kit": {"commit": %s, "cuda_archs": %s, "packed": %s},\n' "$(json_str "$(manifest commit)")" \
      "$(json_str "$(manifest cuda_archs)")" "$(json_str "$(manifest packed)")"
    printf ' "host": %s, "date": %s, "mode": %s, "seconds": %s,\n' "$(json_str "$(hostname 2>/dev/null)")" \
      "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(json_str "$MODE")" "$(($(date +%s) - T0))"
    printf ' "gpu": %s, "driver": %s, "ringgrad_device": %s, "no_gpu": %s,\n' "$(json_str "$GPU_NAME")" \
      "$(json_str "$DRIVER")" "$(json_str "$RG_DEVICE")" "$(json_str "$NO_GPU")"
    printf ' "libraries": ['
    first=1
    for e in "${LIB_REPORT[@]}"; do
      IFS='|' read -r name so secs summary <<<"$e"
      [ "$first" = 1 ] || printf ', '
      first=0
      printf '{"name": %s, "soname": %s, "path": %s, "found_in": %s}' "$(json_str "$name")" \
        "$(json_str "$so")" "$(json_str "$secs")" "$(json_str "$summary")"
    done
    printf '],\n "mnist_top1_percent": %s,\n' "${MNIST_TOP1:-null}"
    printf ' "stages": [\n'
    first=1
    while IFS="$US" read -r name status secs summary; do
      [ "$first" = 1 ] || printf ',\n'
      first=0
      local log=null
      [ ! -f "$OUT/logs/$name.log" ] || log="$(json_str "logs/$name.log")"
      printf '  {"name": %s, "status": %s, "seconds": %s, "summary": %s, "log": %s}' "$(json_str "$name")" \
        "$(json_str "$status")" "$secs" "$(json_str "$summary")" "$log"
    done <"$OUT/stages.tsv"
    printf '\n ],\n "throughput": [\n'
    first=1
    if [ -f "$OUT/throughput.tsv" ]; then
      local label unit o t r op tp runs variant
      while IFS="$US" read -r label unit o t r op tp runs variant; do
        [ "$first" = 1 ] || printf ',\n'
        first=0
        printf '  {"workload": %s, "pytorch_variant": %s, "unit": %s, "ringgrad": %s, "pytorch": %s, "ratio": %s, "ringgrad_peak_device_mb": %s, "pytorch_peak_device_mb": %s, "runs": %s}' \
          "$(json_str "$label")" "$(json_str "$variant")" "$(json_str "$unit")" "${o:-null}" "${t:-null}" \
          "${r:-null}" "${op:-null}" "${tp:-null}" "$(json_str "$runs")"
      done <"$OUT/throughput.tsv"
    fi
    printf '\n ],\n "exit_code": %s}\n' "$code"
  } >"$js"
}

finish() {
  local code="$FAILED"
  [ -z "$NO_GPU" ] || code=1
  write_report "$code"
  if [ -s "$OUT/throughput.tsv" ]; then
    echo
    sed -n '/^| workload/,$p' "$OUT/report.md" | grep '^|'
  fi
  echo
  echo "report: $OUT/report.md, $OUT/report.json"
  if [ -n "$NO_GPU" ]; then
    echo "run: no GPU: $NO_GPU; the kit's programs were checked to start (stage start), nothing ran on a GPU"
  elif [ "$code" != 0 ]; then
    echo "run: some stages failed: $(awk -F"$US" '$2 == "failed" { print $1 }' "$OUT/stages.tsv" | paste -sd' ')"
  else
    echo "run: every stage that ran passed"
  fi
  exit "$code"
}

# Each stage runs as the left side of `||`, where bash does not apply set -e: a command that
# fails inside a stage (a grep that finds nothing) never ends the run; the stage records its own
# status.
stage() { "$@" || true; }
wanted start && stage stage_start
stage stage_gpu
[ -z "$NO_GPU" ] || finish
wanted libs && stage stage_libs
wanted probe && stage stage_probe
[ -z "$NO_GPU" ] || finish
for exe in "$KIT"/tests/*; do stage stage_test "$exe"; done
# The NCCL tests again with blocking communicators (the default is nonblocking).
[ ! -x "$KIT/tests/rg_gpu_tests" ] || RG_NCCL_NONBLOCKING=0 stage stage_test \
  "$KIT/tests/rg_gpu_tests" tests.nccl-blocking '--gtest_filter=Nccl*'
wanted mnist && stage stage_mnist
wanted throughput && stage stage_throughput
wanted overlap && stage stage_overlap
wanted memcheck && stage stage_sanitizer memcheck 90 memcheck --leak-check no \
  "$KIT/bin/ringgrad-train" --model toynet --dataset mnist --data-dir "$KIT/data/mnist" \
  --device cuda --epochs 1 --max-steps 20 --eval-samples 512 --batch-size 64 --workers 0
wanted racecheck && stage stage_sanitizer racecheck 90 racecheck "$KIT/tests/rg_gpu_device_tests" \
  --gtest_color=no '--gtest_filter=Ops/OpTableDevice.MatchesTheCpu/*_f32'
wanted micro && stage stage_micro
finish
