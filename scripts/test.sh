#!/usr/bin/env bash
# Install what the tests need and run the whole suite (README's second command;
# .ci/run calls exactly this). Works on a fresh Debian with Python 3.11 and gcc.
#
# Builds the sdist, a wheel from that sdist for each Python (3.11, and 3.12 / 3.13 where found,
# e.g. under pyenv), repairs each with auditwheel to a manylinux tag, then: lint, C tests, the
# whole pytest suite on the first Python (tests/packaging installs every wheel in a fresh venv),
# and the behaviour, job and asyncio suites on the others. Independent steps overlap on the
# machine's cores: the other wheels build beside the lint and C tests, and pytest runs in two
# lanes (the Kafka suite, which mostly waits on its mock broker, beside the rest).
# Environment: PYTHON (first Python, default python3), TAILRACE_EXTRA_PYTHONS (default
# "3.12 3.13"; set it empty to skip), TAILRACE_TEST_VENV, MANYLINUX (the tag the wheels must
# reach, default manylinux_2_17), TAILRACE_FUZZ_SECONDS (each JSON fuzz target's time, run
# in the background beside the lint and C tests; default 45, 0 skips). Arguments go to the
# first pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VENV=${TAILRACE_TEST_VENV:-$ROOT/.venv-test}
EXTRA_PYTHONS=${TAILRACE_EXTRA_PYTHONS-3.12 3.13}
PLAT=${MANYLINUX:-manylinux_2_17}_$(uname -m)
WHEELHOUSE=$ROOT/dist/wheelhouse

step() { printf '\n=== %s (%ds)\n' "$*" "$SECONDS"; }

# find_python 3.12: an interpreter of that version that actually runs (a pyenv shim for a version
# that is not selected exits non-zero), on PATH or under pyenv's versions directory
find_python() {
  local v=$1 cand
  for cand in "$(command -v "python$v" || true)" \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v"*/bin/"python$v"; do
    if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys, venv' >/dev/null 2>&1; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

# repair_wheel WHEEL: retag it manylinux with auditwheel, into the wheelhouse; fails if it cannot
repair_wheel() {
  local wheel=$1
  auditwheel repair --plat "$PLAT" -w "$WHEELHOUSE" "$wheel" >>build-wheel.log 2>&1 \
    || { tail -30 build-wheel.log; echo "auditwheel could not tag $wheel $PLAT"; exit 1; }
}

step "system packages"
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v redis-server >/dev/null || need+=(redis-server)
command -v tmux >/dev/null || need+=(tmux)  # the terminal-screen tests of the live display
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

step "virtual environment $VENV"
"$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-test.txt

step "Mokapi (the Kafka wire-protocol mock of tests/kafka) into build/npm"
if [ ! -x build/npm/node_modules/.bin/mokapi ]; then
  if command -v npm >/dev/null; then
    npm install --silent --prefix build/npm go-mokapi >/dev/null || echo "npm install go-mokapi failed: the Kafka tests will be skipped"
  else
    echo "npm not found: the Kafka tests will be skipped (docs/kafka.md)"
  fi
fi

step "sdist, a wheel built from it, repaired to $PLAT; installed"
rm -rf dist
python -m build --outdir dist . >build-wheel.log 2>&1 || { tail -50 build-wheel.log; exit 1; }
repair_wheel dist/tailrace-*-linux_*.whl
python -m pip install -q --force-reinstall --no-deps "$WHEELHOUSE"/tailrace-*-"$(python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"-*.whl
(cd /tmp && python -c "import tailrace, tailrace._core; print('tailrace', tailrace.__version__, 'core', tailrace._core.__file__)")

# the other Pythons: a venv each with just what their test suites need, a wheel built from the
# sdist. They build in the background (the log in build/), beside the lint and the C tests.
others=()
for v in $EXTRA_PYTHONS; do
  find_python "$v" >/dev/null || { echo "Python $v not found (PATH, pyenv); set TAILRACE_EXTRA_PYTHONS"; exit 1; }
  others+=("$v")
done
build_other() {
  local v=$1 interp venv=$ROOT/.venv-test-$1
  interp=$(find_python "$v")
  echo "=== Python $v: venv, wheel from the sdist, repaired, installed"
  "$interp" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q $(grep -E '^(pytest|pytest-timeout|hypothesis|build|prometheus-client)[>=<]' requirements-test.txt)
  "$venv/bin/python" -m build --wheel --outdir "dist/py$v" dist/tailrace-*.tar.gz >"build/wheel-$v.log" 2>&1 \
    || { tail -50 "build/wheel-$v.log"; return 1; }
  auditwheel repair --plat "$PLAT" -w "$WHEELHOUSE" "dist/py$v"/tailrace-*.whl >>"build/wheel-$v.log" 2>&1 \
    || { tail -30 "build/wheel-$v.log"; echo "auditwheel could not tag the $v wheel $PLAT"; return 1; }
  # with its dependencies (rich), as a user's pip install would
  "$venv/bin/python" -m pip install -q --force-reinstall "$WHEELHOUSE"/tailrace-*-cp"${v/./}"-*.whl
}
mkdir -p build
( set -e; for v in "${others[@]}"; do build_other "$v"; done ) >build/other-pythons.log 2>&1 &
others_pid=$!
export TAILRACE_WHEELHOUSE=$WHEELHOUSE TAILRACE_SDIST_DIR=$ROOT/dist TAILRACE_MANYLINUX=$PLAT
export TAILRACE_EXPECT_PYTHONS="$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${others[*]}"

# the JSON codec's fuzz targets (tests/fuzz): their own instrumented build, then a bounded run
FUZZ_SECONDS=${TAILRACE_FUZZ_SECONDS:-45}
fuzz_pid=""
if [ "$FUZZ_SECONDS" != 0 ]; then
  TAILRACE_FUZZ_SECONDS=$FUZZ_SECONDS bash scripts/fuzz.sh >build/fuzz.log 2>&1 &
  fuzz_pid=$!
fi

step "lint: ruff, mypy, clang-format, cython-lint"
ruff check .
ruff format --check .
mypy
find csrc bench/c pysrc tests/fuzz -name '*.[ch]' -print0 | xargs -0 clang-format --dry-run -Werror
cython-lint --max-line-length 110 pysrc/tailrace/*.pyx pysrc/tailrace/redis/*.pyx pysrc/tailrace/*.pxi pysrc/tailrace/*.pxd

step "C tests: plain, ThreadSanitizer, ASan+UBSan"
bash scripts/c_tests.sh

if [ -n "$fuzz_pid" ]; then
  step "fuzzing the JSON reader and writer, ${FUZZ_SECONDS}s a target (in the background)"
  wait "$fuzz_pid" || { cat build/fuzz.log; echo "the JSON fuzz targets failed (the input is above)"; exit 1; }
  cat build/fuzz.log
fi

step "the other Pythons' wheels (built in the background)"
wait "$others_pid" || { cat build/other-pythons.log; echo "building the wheels of Python ${others[*]} failed"; exit 1; }
cat build/other-pythons.log
ls "$WHEELHOUSE"

# pytest in two lanes at once, each run in a fresh base directory: lane 1 the first Python's
# suite but Kafka, lane 2 the Kafka suite (it mostly waits on its mock broker); then the other
# Pythons' suites, one lane each in turn. Each run's output is printed once both lanes are
# done, and every run's exit status counts.
PYV=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SUBSET=(tests/behaviour tests/jobs tests/asyncio tests/testing)
names=()
suite() { # N PYTHON ARGS...: run N of pytest (names[N]), its output into build/pytest-N.log
  local n=$1 py=$2 base rc=0
  shift 2
  base=$(mktemp -d)
  "$py" -m pytest -q -p no:cacheprovider --basetemp="$base" "$@" >"build/pytest-$n.log" 2>&1 || rc=$?
  rm -rf "$base"
  echo "$rc" >"build/pytest-$n.rc"
}
if (($#)); then
  step "pytest (Python $PYV): $*"
  python -m pytest -q -p no:cacheprovider "$@"
else
  step "pytest, two lanes at once: Python $PYV (Kafka beside the rest), then Python ${others[*]:-(none)}"
  names=("Python $PYV: everything but Kafka" "Python $PYV: Kafka")
  for v in "${others[@]}"; do names+=("Python $v: behaviour, jobs, asyncio, testing driver"); done
  rm -f build/pytest-*.log build/pytest-*.rc
  (
    suite 0 python --ignore=tests/kafka
    for ((i = 1; i < ${#others[@]}; i += 2)); do
      suite $((i + 2)) "$ROOT/.venv-test-${others[i]}/bin/python" "${SUBSET[@]}"
    done
  ) &
  lane1=$!
  (
    suite 1 python tests/kafka
    for ((i = 0; i < ${#others[@]}; i += 2)); do
      suite $((i + 2)) "$ROOT/.venv-test-${others[i]}/bin/python" "${SUBSET[@]}"
    done
  ) &
  lane2=$!
  wait "$lane1" "$lane2" || true
  failed=()
  for i in "${!names[@]}"; do
    rc=$(cat "build/pytest-$i.rc" 2>/dev/null || echo "no status")
    printf '\n--- pytest, %s: exit %s\n' "${names[i]}" "$rc"
    cat "build/pytest-$i.log" 2>/dev/null || true
    [ "$rc" = 0 ] || failed+=("${names[i]}")
  done
  if ((${#failed[@]})); then
    printf '\nFAILED: %s\n' "${failed[@]}"
    exit 1
  fi
fi
step "done"
