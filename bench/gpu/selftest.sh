#!/usr/bin/env bash
# Checks prepare.sh + run.sh on this machine, without a GPU (about 3-4 min on 2 cores):
#   1. a small bundle: ./dist as it is, gzip, parts of 4 MiB in folders of 10 MiB, no CUDA
#      provider, minilm-l6's sha256 recorded
#   2. run.sh --stage check: every part present; then one part missing (exit 3) and one
#      part one byte short (named as wrong)
#   3. in a clean environment (env -i PATH=/usr/bin:/bin), run.sh --dry-run with the raw and
#      batching cases: parts reassembled across folders with their sha256, the carried node on
#      PATH (not /usr/bin/node), minilm-l6 generated with the recorded sha256, both cases ok,
#      summary.md with the engine and HTTP tables from the suite's results.json, and
#      results.tar.gz written, nothing else at the top of the output
#
#   bash bench/gpu/selftest.sh [--keep]      # --keep: leave the temporary folder
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
T="$(mktemp -d /tmp/slabserve-gpu-selftest.XXXXXX)"
KEEP=0; [ "${1:-}" = --keep ] && KEEP=1
pass=0; fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
ko() { echo "FAIL: $*"; fail=$((fail + 1)); }

echo "selftest: in $T"
if bash "$HERE/prepare.sh" --out "$T/prep" --split-mb 4 --carry-mb 10 --build none --compress gzip --no-cuda-provider --models minilm-l6 > "$T/prepare.log" 2>&1; then
  ok "prepare.sh (small parts): $(grep -c '^part' "$T/prep/manifest.tsv") parts in $(ls -d "$T"/prep/carry-* | wc -l) folders"
else
  ko "prepare.sh: $(tail -3 "$T/prepare.log")"; echo "$pass passed, $fail failed"; exit 1
fi
big=$(find "$T/prep" -name '*.part-*' -size +4096k | wc -l)
[ "$big" = 0 ] && ok "no part over 4 MiB" || ko "$big parts over 4 MiB"

bash "$HERE/run.sh" --prepared "$T/prep" --work "$T/w0" --stage check > "$T/check1.log" 2>&1 && ok "check: complete (exit 0)" || ko "check: $(tail -3 "$T/check1.log")"
victim="$(find "$T/prep/carry-2" -name '*.part-*' | head -1)"
mv "$victim" "$T/away"
bash "$HERE/run.sh" --prepared "$T/prep" --work "$T/w0" --stage check > "$T/check2.log" 2>&1
rc=$?
[ $rc = 3 ] && grep -q "missing: $(basename "$victim")" "$T/check2.log" && ok "check: a missing part is named (exit 3)" || ko "check with a part missing: exit $rc"
head -c -1 "$T/away" > "$victim"
bash "$HERE/run.sh" --prepared "$T/prep" --work "$T/w0" --stage check > "$T/check3.log" 2>&1
rc=$?
[ $rc = 3 ] && grep -q "WRONG sha256: $(basename "$victim")" "$T/check3.log" && ok "check: a part one byte short is named (exit 3)" || ko "check with a short part: exit $rc"
mv "$T/away" "$victim"

env -i PATH=/usr/bin:/bin HOME=/tmp bash "$HERE/run.sh" --prepared "$T/prep" --dry-run --cases raw:minilm-l6,batching:minilm-l6 --out "$T/out" > "$T/dry.log" 2>&1
rc=$?
[ $rc = 0 ] && ok "dry run exit 0" || ko "dry run exit $rc: $(grep FAILED "$T/dry.log" | head -2)"
grep -q "step 2: node on PATH: $T/prep/work/bin/node v" "$T/out/run.log" 2>/dev/null && ok "the carried node ran ($T/prep/work/bin/node)" || ko "carried node not confirmed"
grep -q 'minilm-l6: generated in .*sha256 as recorded' "$T/out/run.log" 2>/dev/null && ok "minilm-l6 generated, sha256 as recorded" || ko "model sha256 not confirmed"
n_items=$(grep -c '^item' "$T/prep/manifest.tsv")
n_inst=$(grep -c -- '-> installed (sha256 checked at each step)' "$T/out/run.log" 2>/dev/null)
[ "$n_items" = "$n_inst" ] && ok "all $n_items items reassembled and installed" || ko "$n_inst of $n_items items installed"
for c in raw-minilm-l6 batching-minilm-l6; do
  grep -q "^| $c | ok |" "$T/out/summary.md" 2>/dev/null && ok "case $c ok in summary.md" || ko "case $c not ok in summary.md"
done
top="$(cd "$T/out" 2>/dev/null && ls | LC_ALL=C sort | tr '\n' ' ')"
[ "$top" = "results.tar.gz run.log samples.csv summary.json summary.md " ] && ok "output: $top" || ko "output holds: $top"
tar -tzf "$T/out/results.tar.gz" > "$T/listing.txt" 2>/dev/null # not piped into grep -q: its early exit would kill tar (pipefail)
grep -q 'detail/batching-minilm-l6/results.json' "$T/listing.txt" && ok "results.tar.gz holds the suite's results.json" || ko "results.tar.gz lacks detail/batching-minilm-l6/results.json"
# both sides of the engine and of HTTP, and the batching gains, made it from results.json into the summary
rows=0
for r in '| minilm-l6 | engine batched |' '| minilm-l6 | engine max-batch-size 1 |' '| minilm-l6 | HTTP | 64 clients | batched |' '| minilm-l6 | HTTP | 64 clients | max-batch-size 1 |' '| minilm-l6 | WebSocket | 1 socket x 64 in flight | batched |'; do
  grep -qF -- "$r" "$T/out/summary.md" 2>/dev/null && rows=$((rows + 1))
done
[ "$rows" = 5 ] && ok "summary.md: engine and HTTP rows, batched and max-batch-size 1" || ko "summary.md: $rows of 5 engine/HTTP rows"
grep -q '^- minilm-l6: What does dynamic batching buy with no transport?.*\*\*[0-9.]*x\*\*' "$T/out/summary.md" 2>/dev/null \
  && grep -q '^- minilm-l6: What does dynamic batching buy?.*\*\*[0-9.]*x\*\*' "$T/out/summary.md" 2>/dev/null \
  && grep -q "^- minilm-l6 checks before timing: vectors equal raw onnxruntime's (a CPU session) within: batched server .*, max-batch-size 1 server .*, engine batched .*, engine max-batch-size 1 .*; /ws f32 rows equal POST /embed within: batched server .*, max-batch-size 1 server " "$T/out/summary.md" 2>/dev/null \
  && ok "summary.md: engine and HTTP batching gains, and the checks (both servers and engines against raw onnxruntime, /ws against POST /embed)" || ko "summary.md lacks a batching gain or a check"

echo "$pass passed, $fail failed"
[ "$KEEP" = 1 ] && echo "selftest: kept $T" || rm -rf "$T"
[ "$fail" = 0 ]
