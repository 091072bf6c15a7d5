#!/usr/bin/env bash
# Fuzz the compiled JSON reader and writer for a bounded time (tests/fuzz/README.md):
# build tailrace._core with gcc's coverage instrumentation (build/fuzz), then run both atheris
# targets at once, each for TAILRACE_FUZZ_SECONDS (default 45), from its corpus in
# tests/fuzz/corpus. Inputs a run finds are kept under build/fuzz/new-*, not in the
# repository. A discrepancy (or a crash) exits non-zero with the input printed.
# Runs in the active Python environment: tailrace installed, atheris and cython there.
# scripts/test.sh runs it in the background; alone: bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECS=${TAILRACE_FUZZ_SECONDS:-45}
OUT=$ROOT/build/fuzz
PY=$(command -v python)

started=$SECONDS
echo "== fuzz: instrumented core (gcc -fsanitize-coverage=trace-pc,trace-cmp) into $OUT"
cmake -S "$ROOT" -B "$OUT" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
  -DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY \
  "-DCMAKE_C_FLAGS=-fsanitize-coverage=trace-pc,trace-cmp" >"$OUT.cmake.log" 2>&1 \
  || { tail -30 "$OUT.cmake.log"; exit 1; }
cmake --build "$OUT" --target _core -j 2 >>"$OUT.cmake.log" 2>&1 || { tail -30 "$OUT.cmake.log"; exit 1; }
gcc -O2 -shared -fPIC -o "$OUT/libtr_sancov.so" tests/fuzz/sancov.c
core=$(ls "$OUT"/_core.cpython-*.so)
export TAILRACE_FUZZ_CORE=$core TAILRACE_FUZZ_SANCOV=$OUT/libtr_sancov.so
echo "== fuzz: built in $((SECONDS - started))s; both targets for ${SECS}s each, at once"

run_target() { # decode|encode: its log in $OUT/TARGET.log, its status in $OUT/TARGET.rc
  local t=$1 rc=0
  rm -rf "$OUT/new-$t" "$OUT/$t-"*
  mkdir -p "$OUT/new-$t"
  "$PY" tests/fuzz/"fuzz_$t.py" -max_total_time="$SECS" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$OUT/$t-" \
    "$OUT/new-$t" tests/fuzz/corpus/"$t" >"$OUT/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$OUT/$t.rc"
}
run_target decode &
run_target encode &
wait

status=0
for t in decode encode; do
  rc=$(cat "$OUT/$t.rc")
  # libFuzzer's last lines: executions, coverage, the new inputs
  stats=$(grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units)' "$OUT/$t.log" | tr '\n' ' ' || true)
  echo "-- fuzz_$t: exit $rc; $stats"
  if [ "$rc" != 0 ]; then
    status=1
    echo "fuzz_$t FAILED; its log ends:"
    tail -40 "$OUT/$t.log"
    for crash in "$OUT/$t-"*; do  # libFuzzer's crash-, timeout-, oom-... files
      [ -e "$crash" ] || continue
      echo "the input ($crash, $(wc -c <"$crash") bytes; add it to tests/fuzz/corpus/$t once fixed):"
      od -A d -c "$crash" | head -40
      echo "base64: $(base64 -w0 "$crash" | head -c 4000)"
      echo "replay: TAILRACE_FUZZ_CORE= python tests/fuzz/fuzz_$t.py $crash"
    done
  fi
done
echo "== fuzz: done in $((SECONDS - started))s"
exit "$status"
