#!/usr/bin/env bash
# Install what the tests need and run the whole suite (README's second command;
# .ci/run calls exactly this). Works on a fresh Debian with Python 3.11 and gcc.
#
# Builds the sdist, a wheel from that sdist for each Python (3.11, and 3.12 / 3.13 where found,
# e.g. under pyenv), repairs each with auditwheel to a manylinux tag, then: lint, C tests, the
# whole pytest suite on the first Python (tests/packaging installs every wheel in a fresh venv),
# and the behaviour, job and asyncio suites on the others.
# Environment: PYTHON (first Python, default python3), TAILRACE_EXTRA_PYTHONS (default
# "3.12 3.13"; set it empty to skip), TAILRACE_TEST_VENV, MANYLINUX (the tag the wheels must
# reach, default manylinux_2_17). Arguments go to the first pytest run.
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

# the other Pythons: a venv each with just what their test suites need, a wheel built from the sdist
others=()
for v in $EXTRA_PYTHONS; do
  step "Python $v: venv, wheel from the sdist, repaired, installed"
  interp=$(find_python "$v") || { echo "Python $v not found (PATH, pyenv); set TAILRACE_EXTRA_PYTHONS"; exit 1; }
  venv=$ROOT/.venv-test-$v
  "$interp" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q $(grep -E '^(pytest|pytest-timeout|hypothesis|build|prometheus-client)[>=<]' requirements-test.txt)
  "$venv/bin/python" -m build --wheel --outdir "dist/py$v" dist/tailrace-*.tar.gz >>build-wheel.log 2>&1 \
    || { tail -50 build-wheel.log; exit 1; }
  repair_wheel "dist/py$v"/tailrace-*.whl
  # with its dependencies (rich), as a user's pip install would
  "$venv/bin/python" -m pip install -q --force-reinstall "$WHEELHOUSE"/tailrace-*-cp"${v/./}"-*.whl
  others+=("$v")
done
ls "$WHEELHOUSE"
export TAILRACE_WHEELHOUSE=$WHEELHOUSE TAILRACE_SDIST_DIR=$ROOT/dist TAILRACE_MANYLINUX=$PLAT
export TAILRACE_EXPECT_PYTHONS="$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${others[*]}"

step "lint: ruff, mypy, clang-format, cython-lint"
ruff check .
ruff format --check .
mypy
find csrc bench/c -name '*.[ch]' -print0 | xargs -0 clang-format --dry-run -Werror
cython-lint --max-line-length 110 pysrc/tailrace/*.pyx pysrc/tailrace/redis/*.pyx pysrc/tailrace/*.pxi pysrc/tailrace/*.pxd

step "C tests: plain, ThreadSanitizer, ASan+UBSan"
bash scripts/c_tests.sh

step "pytest (Python $(python -c 'import sys; print("%d.%d" % sys.version_info[:2])'): everything)"
python -m pytest -q -p no:cacheprovider "$@"
for v in "${others[@]}"; do
  step "pytest (Python $v: behaviour, jobs, asyncio, testing driver)"
  "$ROOT/.venv-test-$v/bin/python" -m pytest -q -p no:cacheprovider tests/behaviour tests/jobs tests/asyncio \
    tests/testing
done
step "done"
