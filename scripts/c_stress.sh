#!/usr/bin/env bash
# Stress mode for the C stress programs (not CI): run each of them again and
# again, with fresh seeds of timing, until the given time is spent, under
# ThreadSanitizer by default. Exits non-zero at the first failure or race.
#
#   bash scripts/c_stress.sh [SECONDS] [tsan|asan|plain]     # default: 600 s, tsan
#
# stress_notifier also runs for a duration itself (TR_STRESS_SECONDS); the
# others are repeated whole. Run it niced on a shared machine.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-600}"
kind="${2:-tsan}"
case "$kind" in
    tsan) sanitize=thread ;;
    asan) sanitize=address ;;
    plain) sanitize="" ;;
    *) echo "kind must be tsan, asan or plain" >&2; exit 2 ;;
esac
dir="$root/build/c-$kind"
cmake -S "$root/csrc" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DTR_SANITIZE="$sanitize" \
    -DTR_BUILD_TESTS=ON >/dev/null
cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)" >/dev/null

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
norand=()
if [ "$kind" = tsan ] && setarch "$(uname -m)" -R true 2>/dev/null; then
    norand=(setarch "$(uname -m)" -R)
fi

programs=(stress_notifier stress_queue stress_sequencer stress_watermark stress_loop test_loop_cq
          test_loop_signal test_loop_keyed)
share=$((seconds / ${#programs[@]}))
[ "$share" -lt 1 ] && share=1
scale=1
[ "$kind" = tsan ] && scale=0.25
for p in "${programs[@]}"; do
    end=$(($(date +%s) + share))
    runs=0
    while [ "$(date +%s)" -lt "$end" ]; do
        if [ "$p" = stress_notifier ]; then
            TR_STRESS_SECONDS=$((end - $(date +%s))) "${norand[@]}" "$dir/tests/$p" "$scale" >/dev/null
        else
            "${norand[@]}" "$dir/tests/$p" "$scale" >/dev/null
        fi
        runs=$((runs + 1))
    done
    echo "== $kind $p: $runs clean runs in ${share} s"
done
echo "== stress mode ($kind, $seconds s): no failure, no sanitizer report"
