#!/usr/bin/env bash
# Install the project with its test tools and run every check: ruff, mypy, pytest (unit,
# handler, integration against a real TorchServe, and a short Locust run). GPU tests skip
# themselves without CUDA. Extra arguments go to pytest.
# The soak test runs for a minute; HYMT_SOAK_SECONDS=100 bash scripts/test.sh runs the full soak
# (what CI runs), and any other length too.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh dev
ruff format --check .
ruff check .
mypy
python -m pytest "$@"
