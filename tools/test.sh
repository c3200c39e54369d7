#!/usr/bin/env bash
# Set up everything the test suite needs (a venv with the project and its test extras, plus Debian's
# Chromium for the browser checks when apt is available), then run the whole suite: in parallel, then the tests
# marked exclusive (real Ray clusters) alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[cpu,test]"
# The suite starts the harness in hundreds of processes: compiled once here, not in each (where the environment
# sets PYTHONDONTWRITEBYTECODE, as CI machines may, nothing else would keep the bytecode)
.venv/bin/python -m compileall -q -j 0 harness reports kernels testkit >/dev/null
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium"
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
# Everything in parallel, then the tests that need the machine to themselves (real Ray clusters), one at a time.
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --dist loadfile -m "not exclusive" "$@"
status=0
.venv/bin/python -m pytest -p no:xdist -m exclusive "$@" || status=$?
[ "$status" -eq 5 ] && status=0  # the paths given hold no exclusive test
exit "$status"
