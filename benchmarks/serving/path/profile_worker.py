"""Where TorchServe's Python worker spends its time in async mode (the GPU profile's path):
start our TorchServe on a model folder, load it with closed-loop users, and record the worker
process with py-spy meanwhile; writes the raw stacks and their summary (py_spy_summary.py).

    PYTHONPATH=handler:loadtest/serving:benchmarks/serving/path \\
        python benchmarks/serving/path/profile_worker.py --out DIR [--model-dir DIR] [--users 32]

Without ``--model-dir`` the tiny model is built (CPU, fast engine). py-spy must be on PATH
(``pip install py-spy``); one output token per request, so that the path, not generation, is
what the worker does.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
from pathlib import Path

from client import Job, run_closed_loop
from py_spy_summary import summarise

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import model_workers, start, stop, wait_ready

REPO = Path(__file__).resolve().parents[3]
MODEL = "hunyuan-mt"
TEXTS = ("Good morning.", "See you tomorrow, my friend.", "今天天气很好。", "How are you?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--work", type=Path, default=Path("/tmp/hymt-profile-worker"))
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not on PATH (pip install py-spy)")
    model = args.model_dir or _tiny(args.work / "tiny-model")
    build_archive(
        model_path=model,
        template=REPO / f"configs/model-config-{'gpu' if args.model_dir else 'cpu'}.yaml",
        export_path=args.work / "model_store",
        overrides={"asyncCommunication": True, "batchSize": 1, "handler.engine": "fast"},
    )
    server, _ = start(
        REPO / "config.properties", args.work / "run", model_store=args.work / "model_store"
    )
    try:
        wait_ready(server, [MODEL], timeout=900)
        url = f"{server.inference_url()}/predictions/{MODEL}"

        def job(rng: random.Random) -> Job:
            body = {"text": rng.choice(TEXTS), "target_lang": "de", "max_new_tokens": 1}
            return Job(url, body, server.headers("inference"), 1)

        run_closed_loop(job, 8, 3)  # warm up
        pid = model_workers(server, MODEL)[0]["pid"]
        args.out.mkdir(parents=True, exist_ok=True)
        raw = args.out / "worker-stacks.txt"
        command = [spy, "record", "-p", str(pid), "-d", str(args.seconds), "-r", "200",
                   "--format", "raw", "-o", str(raw), "--nonblocking"]  # fmt: skip
        recording = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        load = run_closed_loop(job, args.users, args.seconds + 3, processes=2)
        recording.wait()
    finally:
        stop(server)
    kept = ("users", "requests_per_s", "p50_ms", "p95_ms", "errors")
    summary = {key: load[key] for key in kept}
    print(json.dumps(summary))
    head = f"# TorchServe worker profile\n\n`{json.dumps(summary)}`\n\n"
    (args.out / "profile.md").write_text(head + summarise(raw.read_text(), 40))


def _tiny(folder: Path) -> Path:
    from hymt_serve.ops.tiny_model import build_tiny_model

    return folder if (folder / "config.json").is_file() else build_tiny_model(folder, None)


if __name__ == "__main__":
    main()
