#!/usr/bin/env bash
# Assembles a self-contained bundle for running the GPU bench on a machine that has
# an NVIDIA GPU but no Node.js and no network (see bench/gpu/README.md).
#
# Run here, on a linux-x64 machine with Node 20, network (npm registry) and `npm ci` done:
#
#   bash bench/gpu/prepare.sh                       # -> bench/gpu/prepared/carry-1 ... carry-N
#   bash bench/gpu/prepare.sh --no-cuda-provider    # the GPU machine already has the provider
#   bash bench/gpu/prepare.sh --cuda-from FILE.tgz  # provider from the package's tarball, not npm
#
# Each item (node, app, the CUDA provider; bench/gpu/README.md says what is in each) is
# compressed or not, then split into parts packed into folders carry-1, carry-2, ... of
# at most --carry-mb each: one folder per transfer. Every carry folder holds manifest.tsv
# (the sha256 of every item, part and model file to expect) and app-files.sha256.gz.
#
# Options:
#   --out DIR            (default bench/gpu/prepared; emptied first)
#   --split-mb N         part size, MiB (default 29: two parts fill a carry folder)
#   --carry-mb N         carry folder size, MiB, manifest included (default 60: with the working tree,
#                        under a 64 MiB cap on one transfer)
#   --build MODE         current: tsc on the working tree (default); none: copy ./dist as it is
#   --compress KIND      xz (default), gzip or none: for node and app
#   --cuda-from FILE     provider from this copy of the package's .tgz instead of `npm pack`
#   --no-cuda-provider   leave it out
#   --models LIST        models run.sh generates there; their sha256 is recorded here (default minilm-l6,bert-base)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$HERE/prepared"
SPLIT_MB=29
CARRY_MB=60
BUILD=current
COMPRESS=xz
CUDA_FROM=""
CUDA=1
MODELS="minilm-l6,bert-base"
CUDA_PACKAGE='com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9'
# devDependencies bench/suite.js imports: histograms, its progress display, the report's plots
BENCH_DEPS=hdr-histogram-js,cli-progress,vega,vega-lite
CUDA_INNER='package/Plugins/Linux/x64'
CUDA_FILES=(libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so)

die() { echo "prepare: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --split-mb) SPLIT_MB="$2"; shift 2 ;;
    --carry-mb) CARRY_MB="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --compress) COMPRESS="$2"; shift 2 ;;
    --cuda-from) CUDA_FROM="$2"; shift 2 ;;
    --no-cuda-provider) CUDA=0; shift ;;
    --models) MODELS="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$SPLIT_MB" =~ ^[0-9]+$ && "$SPLIT_MB" -ge 1 ]] || die "--split-mb: expected a positive integer"
[[ "$CARRY_MB" =~ ^[0-9]+$ && "$CARRY_MB" -gt "$SPLIT_MB" ]] || die "--carry-mb: expected an integer > --split-mb (1 MiB of each folder is kept for manifest.tsv and app-files.sha256.gz)"
case "$BUILD" in current|none) ;; *) die "--build: current or none" ;; esac
case "$COMPRESS" in xz|gzip|none) ;; *) die "--compress: xz, gzip or none" ;; esac

NODE="$(node -p process.execPath)"
NODE_VERSION="$(node -v)"
[ "$(node -p 'process.platform + "-" + process.arch')" = linux-x64 ] || die "this must run on linux-x64 (the GPU machine is)"
# uWebSockets.js: Node 20 runs on glibc >= 2.27 (the trufflesuite build); 22 and 24 need glibc >= 2.38 there (src/gateway/uws.ts).
case "$NODE_VERSION" in v20.*|v22.*|v24.*) ;; *) echo "prepare: warning: node $NODE_VERSION: no uWebSockets.js build is known to load on it" >&2 ;; esac
for t in sha256sum split tar; do command -v $t >/dev/null || die "$t is needed"; done
[ "$COMPRESS" = none ] || command -v "$COMPRESS" >/dev/null || die "$COMPRESS is needed (or --compress none)"
[ -d "$ROOT/node_modules/onnxruntime-node" ] || die "run npm ci first"

t_start=$(date +%s)
stamp() { echo "prepare: [$(( $(date +%s) - t_start ))s] $*"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
size_of() { stat -c %s "$1"; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Empty OUT, but only if it is ours (absent, empty, or made by this script).
if [ -e "$OUT" ]; then
  if [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ ! -e "$OUT/manifest.tsv" ] && [ ! -d "$OUT/.stage" ]; then
    die "$OUT is not empty and holds no manifest.tsv: not touching it"
  fi
  rm -rf "$OUT"
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$OUT/.stage"
mkdir -p "$STAGE/app/bench" "$STAGE/items"

# ---------------------------------------------------------------- app: dist
GIT_COMMIT="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
GIT_DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l | tr -d ' ')"
TSC="$ROOT/node_modules/.bin/tsc"
case "$BUILD" in
  current)
    stamp "building dist/ from the working tree (tsc; $GIT_DIRTY tracked files modified since $GIT_COMMIT)"
    "$TSC" -p "$ROOT/tsconfig.json" --outDir "$STAGE/app/dist" || die "tsc failed (or --build none)"
    ;;
  none)
    [ -f "$ROOT/dist/bench/suite.js" ] || die "no dist/ (npm run build)"
    stamp "copying dist/ as it is"
    cp -r "$ROOT/dist" "$STAGE/app/dist"
    ;;
esac
for f in dist/bench/suite.js dist/bench/gpu/raw-ceiling.js dist/bench/gpu/summarize.js dist/src/cli.js dist/models/generate.js; do
  [ -f "$STAGE/app/$f" ] || die "the build has no $f"
done
cp "$ROOT/package.json" "$STAGE/app/package.json"
# the gRPC gateway every server starts loads its .proto files from the package's proto/
cp -r "$ROOT/proto" "$STAGE/app/proto" || die "no proto/ in $ROOT"
mkdir -p "$STAGE/app/bench/gpu"
find "$HERE" -maxdepth 1 -type f \( -name '*.sh' -o -name '*.mjs' -o -name '*.md' \) -exec cp {} "$STAGE/app/bench/gpu/" \;

# ---------------------------------------------------------------- app: node_modules
stamp "staging production node_modules (+ $BENCH_DEPS), linux-x64 only"
node "$HERE/stage-deps.mjs" --root "$ROOT" --out "$STAGE/app/node_modules" --extra "$BENCH_DEPS" > "$STAGE/stage-deps.json"
node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); console.log(`prepare: node_modules: ${r.packages} packages, ${r.files} files, ${(r.bytes / 2 ** 20).toFixed(1)} MiB after pruning ${r.pruned} paths`)' "$STAGE/stage-deps.json"
ORT_VERSION="$(node -p "require('$STAGE/app/node_modules/onnxruntime-node/package.json').version")"

(cd "$STAGE/app" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) > "$STAGE/app-files.sha256"
tar -C "$STAGE" --owner=0 --group=0 --numeric-owner -cf "$STAGE/items/app.tar" app
stamp "app.tar: $(mib "$(size_of "$STAGE/items/app.tar")"), $(wc -l < "$STAGE/app-files.sha256") files"

# ---------------------------------------------------------------- node
cp "$NODE" "$STAGE/items/node"
chmod 755 "$STAGE/items/node"
if command -v strip >/dev/null; then strip --strip-all "$STAGE/items/node"; else echo "prepare: no strip; node keeps its symbols" >&2; fi
[ "$("$STAGE/items/node" -v)" = "$NODE_VERSION" ] || die "the staged node does not run"
stamp "node $NODE_VERSION from $NODE: $(mib "$(size_of "$NODE")") -> $(mib "$(size_of "$STAGE/items/node")")"

# ---------------------------------------------------------------- CUDA provider
CUDA_SOURCE=none
if [ "$CUDA" = 1 ]; then
  mkdir -p "$STAGE/cuda" "$STAGE/dl"
  tgz="$CUDA_FROM"
  CUDA_SOURCE="${CUDA_FROM:-$CUDA_PACKAGE}"
  if [ -z "$tgz" ]; then
    stamp "fetching $CUDA_PACKAGE (about 180 MB) with npm pack"
    (cd "$STAGE/dl" && npm pack "$CUDA_PACKAGE" --silent >/dev/null) || die "npm pack $CUDA_PACKAGE failed (or use --cuda-from / --no-cuda-provider)"
    tgz="$(ls "$STAGE"/dl/*.tgz)"
  fi
  [ -f "$tgz" ] || die "no such file: $tgz"
  tar -xzf "$tgz" -C "$STAGE/dl" "${CUDA_FILES[@]/#/$CUDA_INNER/}"
  for f in "${CUDA_FILES[@]}"; do cp "$STAGE/dl/$CUDA_INNER/$f" "$STAGE/cuda/$f"; done
  rm -rf "$STAGE/dl"
  tar -C "$STAGE/cuda" --owner=0 --group=0 --numeric-owner -cf "$STAGE/items/cuda-provider.tar" "${CUDA_FILES[@]}"
  stamp "cuda-provider.tar: $(mib "$(size_of "$STAGE/items/cuda-provider.tar")") (${CUDA_FILES[*]})"
fi

# ---------------------------------------------------------------- models: their sha256, for run.sh to check its own against
stamp "generating ${MODELS//,/ } with the staged app, for their sha256"
# shellcheck disable=SC2086
"$STAGE/items/node" "$STAGE/app/dist/models/generate.js" ${MODELS//,/ } --out "$STAGE/models" | sed 's/^/prepare:   /'

# ---------------------------------------------------------------- compress, split, pack
MANIFEST="$STAGE/manifest.tsv"
{
  echo "# slabserve GPU bundle (bench/gpu/prepare.sh). kind<TAB>fields; see bench/gpu/README.md"
  printf 'meta\tcreated\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf 'meta\tgit\t%s\t%s\n' "$GIT_COMMIT" "$GIT_DIRTY"
  printf 'meta\tbuild\t%s\n' "$BUILD"
  printf 'meta\tnode\t%s\n' "$NODE_VERSION"
  printf 'meta\tonnxruntime-node\t%s\n' "$ORT_VERSION"
  printf 'meta\tcuda-provider\t%s\n' "$CUDA_SOURCE"
  printf 'meta\tmodels\t%s\tgenerate\n' "$MODELS"
  printf 'meta\tsplit-mb\t%s\n' "$SPLIT_MB"
  printf 'meta\tcarry-mb\t%s\n' "$CARRY_MB"
} > "$MANIFEST"

ITEM_LINES=()
PART_LIST=() # "bytes<TAB>item<TAB>part"
for item in node app cuda-provider; do
  case $item in
    node) f="$STAGE/items/node"; enc="$COMPRESS" ;;
    app) f="$STAGE/items/app.tar"; enc="$COMPRESS" ;;
    cuda-provider) f="$STAGE/items/cuda-provider.tar"; enc=none ;;
  esac
  [ -f "$f" ] || continue
  fsha="$(sha_of "$f")"; fbytes="$(size_of "$f")"
  case $enc in
    xz) stamp "xz $(basename "$f") ($(mib "$fbytes"))"; xz -T0 -6 -c "$f" > "$f.xz"; stored="$f.xz" ;;
    gzip) gzip -6 -c "$f" > "$f.gz"; stored="$f.gz" ;;
    none) stored="$f" ;;
  esac
  ssha="$(sha_of "$stored")"; sbytes="$(size_of "$stored")"
  sname="$(basename "$stored")"
  (cd "$STAGE/items" && split -b "${SPLIT_MB}M" -d -a 2 "$sname" "$sname.part-")
  [ "$stored" = "$f" ] || rm -f "$f"
  rm -f "$stored"
  n=0
  for p in "$STAGE/items/$sname".part-*; do
    PART_LIST+=("$(size_of "$p")	$item	$(basename "$p")")
    n=$((n + 1))
  done
  ITEM_LINES+=("item	$item	$fsha	$fbytes	$enc	$sname	$ssha	$sbytes	$n")
  stamp "$item: $(mib "$fbytes") -> $sname $(mib "$sbytes") in $n part(s)"
done

# first fit, in item order (node and app first, so the first carry folder can set up alone)
CAP=$(( (CARRY_MB - 1) * 1048576 )) # 1 MiB kept for manifest.tsv and app-files.sha256.gz
declare -a BATCH_USED=()
PART_LINES=()
for entry in "${PART_LIST[@]}"; do
  IFS=$'\t' read -r bytes item part <<< "$entry"
  k=0
  while [ $k -lt ${#BATCH_USED[@]} ] && [ $((BATCH_USED[k] + bytes)) -gt $CAP ]; do k=$((k + 1)); done
  [ $k -lt ${#BATCH_USED[@]} ] || BATCH_USED+=(0)
  BATCH_USED[k]=$((BATCH_USED[k] + bytes))
  batch="carry-$((k + 1))"
  mkdir -p "$OUT/$batch"
  mv "$STAGE/items/$part" "$OUT/$batch/$part"
  PART_LINES+=("part	$item	$part	$(sha_of "$OUT/$batch/$part")	$bytes	$batch")
done

{
  printf '%s\n' "${ITEM_LINES[@]}"
  printf '%s\n' "${PART_LINES[@]}"
  if [ -d "$STAGE/cuda" ]; then
    for f in "${CUDA_FILES[@]}"; do printf 'file\tcuda-provider\t%s\t%s\t%s\n' "$f" "$(sha_of "$STAGE/cuda/$f")" "$(size_of "$STAGE/cuda/$f")"; done
  fi
  if [ -d "$STAGE/models" ]; then
    (cd "$STAGE/models" && find . -type f | sed 's|^\./||' | LC_ALL=C sort | while read -r f; do
      printf 'model\t%s\t%s\t%s\n' "$f" "$(sha_of "$f")" "$(size_of "$f")"
    done)
  fi
} >> "$MANIFEST"
gzip -9 -c "$STAGE/app-files.sha256" > "$STAGE/app-files.sha256.gz"
for b in "$OUT"/carry-*; do
  cp "$MANIFEST" "$STAGE/app-files.sha256.gz" "$b/"
done
cp "$MANIFEST" "$OUT/manifest.tsv"
BUNDLE="$(grep -E '^(item|part)' "$MANIFEST" | sha256sum | cut -c1-12)"

# ---------------------------------------------------------------- report
{
  echo "slabserve GPU bundle $BUNDLE, made $(date -u +%Y-%m-%dT%H:%M:%SZ) from git $GIT_COMMIT (build: $BUILD, $GIT_DIRTY tracked files modified)"
  echo
  echo "carry folders (send each; parts may arrive in any order and any folder under the prepared dir):"
  for b in "$OUT"/carry-*; do
    printf '  %-9s %9s  %s\n' "$(basename "$b")" "$(mib "$(du -sb "$b" | cut -f1)")" "$(cd "$b" && ls | grep -c part-) parts: $(cd "$b" && ls | grep part- | tr '\n' ' ')"
  done
  echo
  echo "items:"
  for l in "${ITEM_LINES[@]}"; do
    IFS=$'\t' read -r _ item fsha fbytes enc sname ssha sbytes n <<< "$l"
    printf '  %-14s %10s  stored as %-22s %10s  %s part(s)\n' "$item" "$(mib "$fbytes")" "$sname" "$(mib "$sbytes")" "$n"
  done
  echo
  echo "total to carry: $(mib "$(du -sb --exclude=.stage "$OUT" | cut -f1)") in $(ls -d "$OUT"/carry-* | wc -l) folder(s)"
  echo "on the GPU machine, with every carry folder under one dir:  bash bench/gpu/run.sh --prepared DIR"
} | tee "$OUT/CARRY.txt"

rm -rf "$STAGE"
stamp "done"
