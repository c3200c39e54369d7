#!/usr/bin/env bash
# Set up everything the test suite needs (a venv with the project and its test extras, plus Debian's
# Chromium for the browser checks when apt is available), then run the whole suite in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[cpu,test]"
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium"
fi
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-auto}" --dist loadfile "$@"
