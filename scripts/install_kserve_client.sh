#!/usr/bin/env bash
# Create .venv/kserve-client (git-ignored) with KServe's Python client for the KServe test
# (tests/integration/test_kserve.py), in an environment of its own: kserve 0.21.0 pins
# protobuf < 7 and the project's gRPC tools need protobuf >= 7. Does nothing when it is there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
target=.venv/kserve-client
requirements=tests/integration/kserve-client.txt
if [ -x "$target/bin/python" ] && cmp -s "$requirements" "$target/requirements.txt"; then
  exit 0
fi
rm -rf "$target"
"$PYTHON" -m venv "$target"
"$target/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
cp "$requirements" "$target/requirements.txt"
echo "KServe client installed in $target"
