#!/usr/bin/env bash
# Build the C library three ways (plain Release, ThreadSanitizer, ASan+UBSan)
# and run its CTest suite in each. Exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="$(nproc 2>/dev/null || echo 2)"

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"

# TSan maps shadow memory at fixed addresses; with high ASLR entropy (newer
# kernels) that fails unless address randomisation is off for the test run.
norand=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
    norand=(setarch "$(uname -m)" -R)
fi

run() { # name, sanitize
    local name="$1" sanitize="$2" dir="$root/build/c-$1" start
    start=$(date +%s)
    echo "== $name: configure + build"
    cmake -S "$root/csrc" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DTR_SANITIZE="$sanitize" \
        -DTR_BUILD_TESTS=ON >/dev/null
    cmake --build "$dir" -j "$jobs" >/dev/null
    echo "== $name: ctest"
    if [ "$sanitize" = thread ]; then
        (cd "$dir" && "${norand[@]}" ctest --output-on-failure)
    else
        (cd "$dir" && ctest --output-on-failure)
    fi
    echo "== $name: passed in $(($(date +%s) - start)) s"
}

run plain ""
run tsan thread
run asan address
echo "== all C test builds passed"
