#!/usr/bin/env bash
# Install what the tests need and run the whole suite (README's second command;
# .ci/run calls exactly this). Works on a fresh Debian with Python 3.11 and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VENV=${TAILRACE_TEST_VENV:-$ROOT/.venv-test}

step() { printf '\n=== %s (%ds)\n' "$*" "$SECONDS"; }

step "system packages"
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v redis-server >/dev/null || need+=(redis-server)
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

step "build the wheel and install it"
rm -rf dist
python -m build --wheel --outdir dist . >build-wheel.log 2>&1 || { tail -50 build-wheel.log; exit 1; }
python -m pip install -q --force-reinstall --no-deps dist/tailrace-*.whl
(cd /tmp && python -c "import tailrace, tailrace._core; print('tailrace', tailrace.__version__, 'core', tailrace._core.__file__)")

step "lint: ruff, mypy, clang-format, cython-lint"
ruff check .
ruff format --check .
mypy
find csrc bench/c -name '*.[ch]' -print0 | xargs -0 clang-format --dry-run -Werror
cython-lint --max-line-length 110 pysrc/tailrace/*.pyx pysrc/tailrace/redis/*.pyx pysrc/tailrace/*.pxi pysrc/tailrace/*.pxd

step "C tests: plain, ThreadSanitizer, ASan+UBSan"
bash scripts/c_tests.sh

step "pytest"
python -m pytest -q -p no:cacheprovider "$@"
step "done"
