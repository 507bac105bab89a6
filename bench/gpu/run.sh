#!/usr/bin/env bash
# Runs slabserve's GPU bench on a machine with an NVIDIA GPU, from a bundle made by
# prepare.sh: no Node.js and no network needed there. bench/gpu/README.md has its
# steps (each done once: a later call on the same machine skips what is in place).
#
#   bash bench/gpu/run.sh --prepared DIR                 # everything, results in $OUT (or --out)
#   bash bench/gpu/run.sh --prepared DIR --stage check   # which parts are here (sha256 checked); exit 3 if some are missing
#   bash bench/gpu/run.sh --prepared DIR --stage setup   # reassemble and unpack what is complete, generate the models
#   bash bench/gpu/run.sh --prepared DIR --dry-run       # the same cases on the CPU, short: proves the plumbing
#
# Options:
#   --prepared DIR        the bundle (default: $SLABSERVE_GPU_PREPARED, else bench/gpu/prepared)
#   --out DIR             results (default: $OUT, else bench/gpu/results/<time>)
#   --work DIR            where items are unpacked (default: DIR/work)
#   --stage S             check, setup or all (default all)
#   --device D            cuda, cuda:N or cpu (default cuda)
#   --dry-run             cpu, short phases, minilm-l6 only, longer budget: for testing without a GPU
#   --cuda-lib-dirs A:B   folders with libcublas*.so.13, libcudart.so.13, libcurand.so.10, libcudnn*.so.9 (searched first)
#   --cuda-provider-dir D take libonnxruntime_providers_{cuda,shared}.so from D (bundle made with --no-cuda-provider)
#   --models LIST         (default minilm-l6,bert-base)
#   --cases LIST          kind:model,... (default raw:M,batching:M for every model)
#   --budget-s N          whole run, set-up included (default 480; dry run 1500)
#   --suite-args "..."    more flags for suite.js (e.g. "--rounds 5 --duration-s 2")
#   --raw-args "..."      more flags for raw-ceiling.js (e.g. "--batches 1,32,512 --seq-lens 64")
#   --keep-detail         keep OUT/detail/ beside results.tar.gz (by default OUT holds 4 files:
#                         summary.md, run.log, samples.csv, results.tar.gz)
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREP="${SLABSERVE_GPU_PREPARED:-$HERE/prepared}"
OUT_DIR="${OUT:-}"
WORK=""
STAGE=all
DEVICE=cuda
DRY=0
CUDA_LIB_DIRS=""
CUDA_PROVIDER_DIR=""
MODELS=""
CASES=""
BUDGET_S=""
SUITE_ARGS=""
RAW_ARGS=""
KEEP_DETAIL=0
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prepared) PREP="$2"; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --stage) STAGE="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --dry-run) DRY=1; DEVICE=cpu; shift ;;
    --cuda-lib-dirs) CUDA_LIB_DIRS="$2"; shift 2 ;;
    --cuda-provider-dir) CUDA_PROVIDER_DIR="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --cases) CASES="$2"; shift 2 ;;
    --budget-s) BUDGET_S="$2"; shift 2 ;;
    --suite-args) SUITE_ARGS="$2"; shift 2 ;;
    --raw-args) RAW_ARGS="$2"; shift 2 ;;
    --keep-detail) KEEP_DETAIL=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$STAGE" in check|setup|all) ;; *) echo "run: --stage: check, setup or all" >&2; exit 2 ;; esac
[[ "$DEVICE" =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || { echo "run: --device: cuda, cuda:N or cpu" >&2; exit 2; }
[ "$DRY" = 1 ] && [ "$DEVICE" != cpu ] && { echo "run: --dry-run runs on the cpu" >&2; exit 2; }
[ -d "$PREP" ] || { echo "run: no prepared folder $PREP (--prepared DIR or SLABSERVE_GPU_PREPARED)" >&2; exit 2; }
PREP="$(cd "$PREP" && pwd)"
WORK="${WORK:-$PREP/work}"
mkdir -p "$WORK/tmp"
WORK="$(cd "$WORK" && pwd)"
if [ -z "$MODELS" ]; then [ "$DRY" = 1 ] && MODELS=minilm-l6 || MODELS=minilm-l6,bert-base; fi
if [ -z "$BUDGET_S" ]; then [ "$DRY" = 1 ] && BUDGET_S=1500 || BUDGET_S=480; fi
IFS=',' read -r -a MODEL_LIST <<< "$MODELS"
if [ -z "$CASES" ]; then
  for m in "${MODEL_LIST[@]}"; do CASES="$CASES,raw:$m,batching:$m"; done
  CASES="${CASES#,}"
fi
IFS=',' read -r -a CASE_LIST <<< "$CASES"
for c in "${CASE_LIST[@]}"; do
  [[ "$c" =~ ^(raw|batching):[A-Za-z0-9._-]+$ ]] || { echo "run: --cases: kind:model with kind raw or batching, got '$c'" >&2; exit 2; }
done

T0=$(date +%s)
DEADLINE=$((T0 + BUDGET_S))
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "run: [$(elapsed)s] $*"; }

# ---------------------------------------------------------------- output and logging
if [ "$STAGE" = all ]; then
  [ -n "$OUT_DIR" ] || OUT_DIR="$HERE/results/$(date -u +%Y%m%d-%H%M%S)"
  mkdir -p "$OUT_DIR/detail"
  OUT_DIR="$(cd "$OUT_DIR" && pwd)"
  DETAIL="$OUT_DIR/detail"
  exec 3>&1 4>&2
  exec > >(tee -a "$OUT_DIR/run.log") 2>&1
  TEE_PID=$!
else
  DETAIL="$WORK/detail-$STAGE"
  mkdir -p "$DETAIL"
fi
SAMPLER_PID=""
FAILED=""

finish() {
  local rc=$1
  if [ -n "$SAMPLER_PID" ]; then kill "$SAMPLER_PID" 2>/dev/null; wait "$SAMPLER_PID" 2>/dev/null; SAMPLER_PID=""; fi
  if [ "$STAGE" = all ]; then
    cp "$DETAIL/samples.csv" "$OUT_DIR/samples.csv" 2>/dev/null
    local summarized=0
    if [ -x "${NODE:-}" ] && [ -n "${APP:-}" ]; then
      "$NODE" "$APP/dist/bench/gpu/summarize.js" --dir "$DETAIL" --out "$OUT_DIR/summary.md" --device "$DEVICE" ${FAILED:+--failed "$FAILED"} && summarized=1
    fi
    if [ "$summarized" = 0 ]; then
      { echo "# slabserve GPU bench: FAILED"; echo; echo "${FAILED:-summary could not be written}"; echo; echo "See run.log."; } > "$OUT_DIR/summary.md"
    fi
    [ -f "$OUT_DIR/summary.md" ] && cp "$OUT_DIR/summary.md" "$DETAIL/summary.md"
    tar -czf "$OUT_DIR/results.tar.gz" -C "$OUT_DIR" detail 2>/dev/null
    [ "$KEEP_DETAIL" = 1 ] || rm -rf "$DETAIL"
    echo "run: [$(elapsed)s] wrote $OUT_DIR: $(cd "$OUT_DIR" && ls | tr '\n' ' ')"
    [ -f "$OUT_DIR/summary.md" ] && { echo; cat "$OUT_DIR/summary.md"; }
    exec 1>&3 2>&4
    wait "$TEE_PID" 2>/dev/null
  fi
  exit "$rc"
}
fail() {
  FAILED="$*"
  echo "run: FAILED: $*" >&2
  finish 1
}
trap 'fail "interrupted"' INT TERM

# ---------------------------------------------------------------- manifest and parts
MANIFEST=""
mapfile -t MANIFESTS < <(find "$PREP" -name manifest.tsv -type f -not -path "$WORK/*" | LC_ALL=C sort)
[ ${#MANIFESTS[@]} -gt 0 ] || fail "no manifest.tsv under $PREP"
MANIFEST="${MANIFESTS[0]}"
for m in "${MANIFESTS[@]}"; do
  cmp -s "$m" "$MANIFEST" || fail "two different bundles under $PREP: $MANIFEST and $m (remove the older one)"
done
BUNDLE="$(grep -E '^(item|part)' "$MANIFEST" | sha256sum | cut -c1-12)"
APPSUMS="$(find "$PREP" -name app-files.sha256.gz -type f -not -path "$WORK/*" | head -1)"

declare -A ITEM_SHA ITEM_BYTES ITEM_ENC ITEM_STORED ITEM_SSHA ITEM_N ITEM_PARTS PART_SHA PART_BYTES PART_PATH FILE_SHA MODEL_SHA META
ITEMS=()
while IFS=$'\t' read -r kind a b c d e f g h; do
  case "$kind" in
    meta) META[$a]="$b${c:+ $c}" ;;
    item) ITEMS+=("$a"); ITEM_SHA[$a]=$b; ITEM_BYTES[$a]=$c; ITEM_ENC[$a]=$d; ITEM_STORED[$a]=$e; ITEM_SSHA[$a]=$f; ITEM_N[$a]=$h; ITEM_PARTS[$a]="" ;;
    part) ITEM_PARTS[$a]="${ITEM_PARTS[$a]} $b"; PART_SHA[$b]=$c; PART_BYTES[$b]=$d ;;
    file) FILE_SHA["$a/$b"]=$c ;;
    model) MODEL_SHA[$a]=$b ;;
  esac
done < <(grep -v '^#' "$MANIFEST")
say "bundle $BUNDLE (git ${META[git]:-?}, built ${META[created]:-?}, node ${META[node]:-?}, onnxruntime-node ${META[onnxruntime-node]:-?}); items: ${ITEMS[*]}; prepared dir $PREP"

# every part file under PREP (a part may sit in any folder: carry-1, carry-2, or all together)
while IFS= read -r p; do
  b="$(basename "$p")"
  [ -n "${PART_SHA[$b]:-}" ] || continue
  [ -z "${PART_PATH[$b]:-}" ] && PART_PATH[$b]="$p"
done < <(find "$PREP" -type f -name '*.part-[0-9]*' -not -path "$WORK/*")

# parts_status ITEM -> sets PRESENT, MISSING (names), BAD (names); checks sha256 of present parts
declare -A PART_OK
parts_status() {
  local item=$1 p
  PRESENT=0; MISSING=""; BAD=""
  for p in ${ITEM_PARTS[$item]}; do
    if [ -z "${PART_PATH[$p]:-}" ]; then MISSING="$MISSING $p"; continue; fi
    if [ -z "${PART_OK[$p]:-}" ]; then
      if [ "$(stat -c %s "${PART_PATH[$p]}")" != "${PART_BYTES[$p]}" ] || [ "$(sha256sum "${PART_PATH[$p]}" | cut -d' ' -f1)" != "${PART_SHA[$p]}" ]; then
        BAD="$BAD $p"; continue
      fi
      PART_OK[$p]=1
    fi
    PRESENT=$((PRESENT + 1))
  done
}

installed() { [ -f "$WORK/.installed-$1" ] && [ "$(cat "$WORK/.installed-$1")" = "${ITEM_SHA[$1]}" ]; }

if [ "$STAGE" = check ]; then
  complete=1
  for item in "${ITEMS[@]}"; do
    if installed "$item"; then printf 'run: %-14s installed in %s\n' "$item" "$WORK"; continue; fi
    parts_status "$item"
    printf 'run: %-14s %s/%s parts here, sha256 ok%s%s\n' "$item" "$PRESENT" "${ITEM_N[$item]}" "${MISSING:+; missing:$MISSING}" "${BAD:+; WRONG sha256:$BAD}"
    [ "$PRESENT" = "${ITEM_N[$item]}" ] || complete=0
  done
  [ "$complete" = 1 ] && { say "every item complete"; exit 0; }
  say "incomplete"; exit 3
fi

decode() { # decode ENC IN OUT
  case "$1" in
    none) mv "$2" "$3" ;;
    gzip) gzip -dc "$2" > "$3" && rm -f "$2" ;;
    xz)
      if command -v xz >/dev/null; then xz -dc -T0 "$2" > "$3"
      elif command -v python3 >/dev/null; then python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' "$2" "$3"
      else return 1; fi && rm -f "$2" ;;
    *) return 1 ;;
  esac
}

ORT_REL="node_modules/onnxruntime-node/bin/napi-v6/linux/x64"
# assemble ITEM: 0 installed now or before, 2 parts missing; fails the run on a wrong sha256
assemble() {
  local item=$1 p stored final
  installed "$item" && { say "$item: already installed"; return 0; }
  parts_status "$item"
  [ -z "$BAD" ] || fail "$item: wrong sha256 or size for part(s)$BAD: resend them (a transfer cut short, or parts of another bundle)"
  [ -z "$MISSING" ] || { say "$item: missing part(s)$MISSING"; return 2; }
  stored="$WORK/tmp/${ITEM_STORED[$item]}"
  final="$WORK/tmp/$item.final"
  rm -f "$stored" "$final"
  for p in ${ITEM_PARTS[$item]}; do cat "${PART_PATH[$p]}" >> "$stored" || fail "$item: cannot write $stored (disk full?)"; done
  [ "$(sha256sum "$stored" | cut -d' ' -f1)" = "${ITEM_SSHA[$item]}" ] || fail "$item: the reassembled ${ITEM_STORED[$item]} has the wrong sha256"
  decode "${ITEM_ENC[$item]}" "$stored" "$final" || fail "$item: cannot decode ${ITEM_ENC[$item]} (no xz and no python3?)"
  [ "$(sha256sum "$final" | cut -d' ' -f1)" = "${ITEM_SHA[$item]}" ] || fail "$item: decoded file has the wrong sha256"
  case "$item" in
    node)
      mkdir -p "$WORK/bin" && mv "$final" "$WORK/bin/node" && chmod 755 "$WORK/bin/node" ;;
    app)
      rm -rf "$WORK/app" "$WORK/.installed-cuda-provider"
      tar -xf "$final" -C "$WORK" || fail "app: tar failed"
      rm -f "$final"
      [ -n "$APPSUMS" ] || fail "app: no app-files.sha256.gz in the bundle"
      (cd "$WORK/app" && gzip -dc "$APPSUMS" | sha256sum -c --quiet --strict) > "$DETAIL/app-files-check.txt" 2>&1 \
        || fail "app: files differ from app-files.sha256: $(head -5 "$DETAIL/app-files-check.txt" | tr '\n' ' ')"
      say "app: $(gzip -dc "$APPSUMS" | wc -l) files, every sha256 matches" ;;
    cuda-provider)
      installed app || { say "cuda-provider: waits for app"; rm -f "$final"; return 2; }
      tar -xf "$final" -C "$WORK/app/$ORT_REL" || fail "cuda-provider: tar failed"
      rm -f "$final"
      local k
      for k in "${!FILE_SHA[@]}"; do
        [[ "$k" == cuda-provider/* ]] || continue
        [ "$(sha256sum "$WORK/app/$ORT_REL/${k#cuda-provider/}" | cut -d' ' -f1)" = "${FILE_SHA[$k]}" ] || fail "cuda-provider: ${k#cuda-provider/} has the wrong sha256"
      done ;;
  esac
  echo "${ITEM_SHA[$item]}" > "$WORK/.installed-$item"
  say "$item: ${ITEM_N[$item]} part(s) -> ${ITEM_STORED[$item]} -> installed (sha256 checked at each step)"
  return 0
}

say "step 1: reassembling the bundle into $WORK"
for item in node app cuda-provider; do
  [ -n "${ITEM_SHA[$item]:-}" ] || continue
  assemble "$item"
  rc=$?
  if [ $rc = 2 ] && [ "$STAGE" = all ]; then
    case "$item" in
      node|app) fail "$item is incomplete: send the missing parts (bash bench/gpu/run.sh --stage check lists them)" ;;
      cuda-provider) [ "$DEVICE" = cpu ] || fail "the CUDA provider is incomplete: send the missing parts, or --cuda-provider-dir" ;;
    esac
  fi
done
rm -rf "$WORK/tmp"

# ---------------------------------------------------------------- node
installed node || { [ "$STAGE" = setup ] && { say "setup: node not here yet; nothing more to do"; exit 0; }; fail "no node"; }
export PATH="$WORK/bin:$PATH"
NODE="$WORK/bin/node"
[ "$(command -v node)" = "$NODE" ] || fail "node on PATH is $(command -v node), not the carried one"
NODE_SAYS="$(node -p 'process.execPath + " " + process.version + " " + process.platform + "-" + process.arch' 2>&1)" || fail "the carried node does not run: $NODE_SAYS"
[ "${NODE_SAYS%% *}" = "$NODE" ] || fail "node runs from ${NODE_SAYS%% *}, not $NODE"
say "step 2: node on PATH: $NODE_SAYS"
installed app || { [ "$STAGE" = setup ] && { say "setup: app not here yet"; exit 0; }; fail "no app"; }
APP="$WORK/app"

# ---------------------------------------------------------------- models
MODELS_DIR="$WORK/models"
MODEL_FILES_CHECKED=0
model_ok() { # model_ok NAME: every file prepare.sh recorded for it is here with its sha256
  local m=$1 k n=0
  MODEL_FILES_CHECKED=0
  for k in "${!MODEL_SHA[@]}"; do
    [[ "$k" == "$m"/* ]] || continue
    n=$((n + 1))
    [ -f "$MODELS_DIR/$k" ] || return 1
    [ "$(sha256sum "$MODELS_DIR/$k" | cut -d' ' -f1)" = "${MODEL_SHA[$k]}" ] || return 1
  done
  MODEL_FILES_CHECKED=$n
  [ $n -gt 0 ] || [ -f "$MODELS_DIR/$m/model.onnx" ]
}
say "step 3: models ${MODELS//,/ } in $MODELS_DIR"
mkdir -p "$MODELS_DIR"
for m in "${MODEL_LIST[@]}"; do
  if [ "$(cat "$WORK/.model-$m" 2>/dev/null)" = "$BUNDLE" ] && [ -f "$MODELS_DIR/$m/model.onnx" ]; then say "$m: in place"; continue; fi
  how=present
  if ! model_ok "$m"; then
    t=$(date +%s)
    node "$APP/dist/models/generate.js" "$m" --out "$MODELS_DIR" || fail "generating $m failed"
    model_ok "$m" || fail "$m: generated files differ from the sha256 prepare.sh recorded (a different generator?)"
    how="generated in $(( $(date +%s) - t ))s"
  fi
  say "$m: $how, $([ $MODEL_FILES_CHECKED -gt 0 ] && echo "$MODEL_FILES_CHECKED files, sha256 as recorded" || echo "no sha256 recorded for it (not in prepare.sh's --models)")"
  echo "$BUNDLE" > "$WORK/.model-$m"
done
[ "$STAGE" = setup ] && { say "setup done: $(du -sh "$WORK" | cut -f1) in $WORK"; exit 0; }

# ---------------------------------------------------------------- device
ORT_DIR="$APP/$ORT_REL"
PROVIDER="$ORT_DIR/libonnxruntime_providers_cuda.so"
{
  echo "bundle: $BUNDLE"; echo "uname: $(uname -a)"; echo "node: $NODE_SAYS"
} > "$DETAIL/env.txt"
for k in "${!META[@]}"; do echo "meta $k: ${META[$k]}"; done | LC_ALL=C sort >> "$DETAIL/env.txt"

if [ -n "$CUDA_PROVIDER_DIR" ]; then
  for f in libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do
    cp "$CUDA_PROVIDER_DIR/$f" "$ORT_DIR/$f" || fail "--cuda-provider-dir: no $f in $CUDA_PROVIDER_DIR"
  done
fi

if [ "$DEVICE" != cpu ]; then
  say "step 4: CUDA set-up for $DEVICE"
  [ -f "$PROVIDER" ] && [ -f "$ORT_DIR/libonnxruntime_providers_shared.so" ] \
    || fail "no CUDA provider in $ORT_DIR (bundle made with --no-cuda-provider: pass --cuda-provider-dir)"
  LIBDIRS=()
  add_dir() { local d; for d in "$@"; do [ -d "$d" ] || continue; d="$(cd "$d" && pwd)"; [[ " ${LIBDIRS[*]} " == *" $d "* ]] || LIBDIRS+=("$d"); done; }
  IFS=':' read -r -a given <<< "$CUDA_LIB_DIRS"
  add_dir "${given[@]}"
  for py in python3 /opt/torch/.venv/bin/python3 /opt/conda/bin/python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    while IFS= read -r nv; do add_dir "$nv"/*/lib; done < <("$py" -c 'import nvidia; print("\n".join(list(nvidia.__path__)))' 2>/dev/null)
  done
  shopt -s nullglob
  add_dir /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /opt/*/lib/python3*/site-packages/nvidia/*/lib \
    /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib \
    /usr/lib/python3/dist-packages/nvidia/*/lib "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib \
    /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib
  shopt -u nullglob
  LD_LIBRARY_PATH="$ORT_DIR$(printf ':%s' "${LIBDIRS[@]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$DETAIL/env.txt"
  say "library folders: ${LIBDIRS[*]:-none found}"
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcufft.so.12 libcudnn.so.9 libcuda.so.1; do
    where=""
    for d in "${LIBDIRS[@]}"; do [ -e "$d/$lib" ] && where="$d/$lib" && break; done
    [ -n "$where" ] || where="$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l { print $NF; exit }')"
    echo "lib $lib: ${where:-NOT FOUND}" | tee -a "$DETAIL/env.txt"
  done
  ldd "$PROVIDER" > "$DETAIL/ldd-provider.txt" 2>&1
  if grep -q 'not found' "$DETAIL/ldd-provider.txt"; then
    cat "$DETAIL/ldd-provider.txt"
    fail "the CUDA provider cannot load: $(grep 'not found' "$DETAIL/ldd-provider.txt" | awk '{print $1}' | tr '\n' ' ')missing. Pass the folders holding them with --cuda-lib-dirs A:B (CUDA 13 runtime, cuBLAS 13, cuRAND 10; cuDNN 9 too)"
  fi
  grep -q 'libcudnn.so.9: NOT FOUND' "$DETAIL/env.txt" && say "warning: no libcudnn.so.9 found; onnxruntime loads it when a session opens"
  if command -v "$NVIDIA_SMI" >/dev/null; then
    "$NVIDIA_SMI" --query-gpu=name,memory.total,driver_version --format=csv > "$DETAIL/card.csv" 2>&1
    "$NVIDIA_SMI" > "$DETAIL/nvidia-smi.txt" 2>&1
    say "card: $(tail -n +2 "$DETAIL/card.csv" | tr '\n' ' ')"
  else
    say "warning: no nvidia-smi: no card name, no memory samples"
  fi
else
  say "step 4: device cpu$([ "$DRY" = 1 ] && echo ' (dry run: short phases)')"
  if [ -f "$PROVIDER" ]; then ldd "$PROVIDER" > "$DETAIL/ldd-provider.txt" 2>&1; say "(provider present; ldd finds $(grep -c 'not found' "$DETAIL/ldd-provider.txt") libraries missing here: recorded, not needed on cpu)"; fi
fi
# one session on the first model, on the device the cases use, before any case runs
[ "$DEVICE" = cpu ] && SESSION=CPU || SESSION=CUDA
say "opening a $SESSION session (raw-ceiling.js --check on ${MODEL_LIST[0]})"
timeout 180 node "$APP/dist/bench/gpu/raw-ceiling.js" --model-dir "$MODELS_DIR/${MODEL_LIST[0]}" --device "$DEVICE" --check --json "$DETAIL/device-check.json" 2>&1 | tee "$DETAIL/device-check.log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  [ "$DEVICE" = cpu ] || { echo "--- ldd of the provider:"; cat "$DETAIL/ldd-provider.txt"; }
  fail "no $SESSION session could be opened (exit $rc; see device-check.log above)"
fi

# ---------------------------------------------------------------- sampler
SAMPLES="$DETAIL/samples.csv"
echo "epoch_s,source,memory_used_mib,memory_total_mib,util_pct,power_w" > "$SAMPLES"
# the GPU whenever nvidia-smi answers (on --device cpu too: it shows the GPU stays idle), else host memory
if command -v "$NVIDIA_SMI" >/dev/null && "$NVIDIA_SMI" -L >/dev/null 2>&1; then
  GPU_INDEX="${DEVICE#cpu}"; GPU_INDEX="${GPU_INDEX#cuda}"; GPU_INDEX="${GPU_INDEX#:}"; GPU_INDEX="${GPU_INDEX:-0}"
  sample() { # sample EPOCH_S: one row of samples.csv
    "$NVIDIA_SMI" -i "$GPU_INDEX" --query-gpu=memory.used,memory.total,utilization.gpu,power.draw --format=csv,noheader,nounits 2>/dev/null \
      | awk -v t="$1" -v g="gpu$GPU_INDEX" -F', *' 'NF >= 4 { printf "%.2f,%s,%s,%s,%s,%s\n", t, g, $1, $2, $3, $4 }'
  }
else
  sample() { awk -v t="$1" '/^MemTotal/ { tot = $2 } /^MemAvailable/ { av = $2 } END { printf "%.2f,host,%d,%d,,\n", t, (tot - av) / 1024, tot / 1024 }' /proc/meminfo; }
fi
( while :; do
    sample "$(date +%s.%N)"
    sleep 0.5
  done >> "$SAMPLES" ) &
SAMPLER_PID=$!

# ---------------------------------------------------------------- cases
if [ "$DRY" = 1 ]; then
  SUITE_BASE="--rounds 1 --duration-s 1 --warmup-s 0.3"
  RAW_BASE="--batches 1,8,32 --seq-lens 16,32 --duration-s 0.5 --warmup-s 0.1 --max-point-s 3"
  LIMIT_RAW=300; LIMIT_BATCHING=900
else
  SUITE_BASE=""
  RAW_BASE="--batches 1,8,32,64,128,256 --seq-lens 16,32,128 --duration-s 1"
  LIMIT_RAW=150; LIMIT_BATCHING=240
fi
echo -e "case\tkind\tmodel\tstart\tend\trc\tstatus\tlimit_s" > "$DETAIL/cases.tsv"
say "step 5: cases ${CASE_LIST[*]} (budget ${BUDGET_S}s in all, $(( DEADLINE - $(date +%s) ))s left)"
for c in "${CASE_LIST[@]}"; do
  kind="${c%%:*}"; m="${c#*:}"; name="$kind-$m"
  left=$(( DEADLINE - $(date +%s) ))
  case $kind in raw) limit=$LIMIT_RAW ;; batching) limit=$LIMIT_BATCHING ;; esac
  [ $left -lt $limit ] && limit=$left
  now=$(date +%s.%N)
  if [ ! -f "$MODELS_DIR/$m/model.onnx" ]; then
    say "$name: skipped (no model $m: add it to --models)"
    echo -e "$name\t$kind\t$m\t$now\t$now\t\tskipped: no model\t0" >> "$DETAIL/cases.tsv"; continue
  fi
  if [ $limit -lt 30 ]; then
    say "$name: skipped (${left}s of the budget left)"
    echo -e "$name\t$kind\t$m\t$now\t$now\t\tskipped: budget\t0" >> "$DETAIL/cases.tsv"; continue
  fi
  case $kind in
    raw) result="$DETAIL/$name.json"
      cmd=(node "$APP/dist/bench/gpu/raw-ceiling.js" --model-dir "$MODELS_DIR/$m" --device "$DEVICE" $RAW_BASE $RAW_ARGS --json "$result") ;;
    batching) result="$DETAIL/$name/results.json"
      cmd=(node "$APP/dist/bench/suite.js" --cases batching --models "$m" --models-dir "$MODELS_DIR" --bench-models-dir "$WORK/bench-models" --device "$DEVICE" --no-progress $SUITE_BASE $SUITE_ARGS --out "$DETAIL/$name") ;;
  esac
  say "$name: ${cmd[*]} (limit ${limit}s)"
  start=$(date +%s.%N)
  timeout --kill-after=15 "$limit" "${cmd[@]}" 2>&1 | tee "$DETAIL/$name.log"
  rc=${PIPESTATUS[0]}
  end=$(date +%s.%N)
  if [ "$rc" = 0 ] && [ -f "$result" ]; then status=ok
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status="timed out"
  else status="failed"; fi
  echo -e "$name\t$kind\t$m\t$start\t$end\t$rc\t$status\t$limit" >> "$DETAIL/cases.tsv"
  say "$name: $status (exit $rc, $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')s)"
done

finish 0
