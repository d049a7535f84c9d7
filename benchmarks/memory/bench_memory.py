"""The translation memory on the CPU demo (issue 60 item 2): what it saves the model on files
with realistic repetition, and how fast a cached sentence comes back through the front end.

Builds the demo's tiny model and archive (configs/model-config-cpu.yaml, as ``hymt demo``),
starts TorchServe and ``hymt web`` on free ports in a fresh work folder (both on its
``hymt.db``), then:

- a subtitle file (SRT) and a Markdown manual, made here with the repetition such files have
  (interjections and catchphrases; notes, warnings and steps repeated section after section),
  each sent whole to ``/api/translate`` twice, and a revised manual (a tenth of its
  paragraphs changed) once: the segments the memory served (``usage.memory_segments``) against
  the repeated segments (those whose text an earlier segment of the file has) and the whole;
- one sentence through the front end once, then ``--rounds`` times again (the memory's fast
  path answers it), beside the same sentence sent with ``"cache": false`` (the normal path:
  TorchServe and the model) and straight to TorchServe (the worker's memory): p50 and p90.

Writes results.json and results.md to ``--out``. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[2]
MODEL = "hunyuan-mt"
SENTENCE = "Please restart the application after the update has finished."
SHORT = ["Yes.", "No.", "What?", "Thank you.", "Okay.", "Come on!", "Let's go.", "Wait!"]
LINES = [
    "I don't know.",
    "Are you sure?",
    "Get out of here!",
    "We have to go now.",
    "Where is she?",
    "Trust me.",
    "I'm sorry.",
    "Good morning.",
    "See you tomorrow.",
]
WORDS = [
    *(
        [
            "river",
            "city",
            "light",
            "north",
            "engine",
            "garden",
            "letter",
            "silver",
            "window",
            "morning",
            "captain",
        ]
    ),
    *(
        [
            "signal",
            "harbour",
            "winter",
            "market",
            "doctor",
            "station",
            "bridge",
            "forest",
            "island",
            "paper",
            "voice",
        ]
    ),
]
NOTE = "> **Note:** Back up your data before you change these settings."
WARNING = "> **Warning:** Do not unplug the device while it is updating."
STEPS = ["Open the **Settings** menu.", "Click **Save**.", "Restart the device."]


def sentence(rng: random.Random, words: int) -> str:
    picked = " ".join(rng.choice(WORDS) for _ in range(words))
    return picked[0].upper() + picked[1:] + rng.choice([".", "?", "!"])


def subtitles(cues: int, seed: int = 0) -> str:
    """An SRT file: a third of its cues short interjections, a sixth stock lines, the rest
    lines of their own (as dialogue goes)."""
    rng = random.Random(seed)
    blocks = []
    for number in range(1, cues + 1):
        draw = rng.random()
        text = rng.choice(SHORT) if draw < 0.33 else rng.choice(LINES) if draw < 0.5 else None
        text = text or sentence(rng, rng.randint(5, 11))
        start = number * 3
        at = f"00:{start // 60:02d}:{start % 60:02d}"
        stamp = f"{at},000 --> {at},900"
        blocks.append(f"{number}\n{stamp}\n{text}\n")
    return "\n".join(blocks)


def manual(sections: int, seed: int = 1, changed: float = 0.0) -> str:
    """A Markdown manual: each section a heading, paragraphs of its own, the same steps and the
    same note or warning (as manuals repeat them); ``changed`` of its paragraphs rewritten (a
    revision)."""
    rng, edit = random.Random(seed), random.Random(seed + 100)
    parts = ["# Device manual", ""]
    for number in range(1, sections + 1):
        parts += [f"## {number}. {sentence(rng, 3)[:-1]}", ""]
        for _ in range(2):
            paragraph = " ".join(sentence(rng, rng.randint(6, 12)) for _ in range(2))
            if edit.random() < changed:
                paragraph = sentence(edit, 9)
            parts += [paragraph, ""]
        parts += [f"{i}. {step}" for i, step in enumerate(STEPS, 1)] + [""]
        parts += [NOTE if number % 2 else WARNING, ""]
    return "\n".join(parts)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def repeated(segments: list[str]) -> int:
    """Segments whose text an earlier segment of the same file has."""
    return len(segments) - len(set(segments))


def document_round(web: str, text: str, kind: str) -> dict[str, Any]:
    started = time.perf_counter()
    answer = requests.post(
        f"{web}api/translate",
        json={
            "document": text,
            "format": kind,
            "source_lang": "en",
            "target_lang": "de",
            "stream": False,
        },
        timeout=1800,
    )
    answer.raise_for_status()
    reply = answer.json()
    return {
        "segments": reply["segments"],
        "memory_segments": reply["usage"].get("memory_segments", 0),
        "memory_characters": reply["usage"].get("memory_characters", 0),
        "seconds": round(time.perf_counter() - started, 3),
    }


def latencies(session: requests.Session, url: str, body: dict[str, Any], rounds: int,
              headers: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    seen, memory = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        answer = session.post(url, json=body, headers=headers, timeout=120)
        seen.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        memory += bool(answer.json()["usage"].get("memory_segments"))
    cuts = statistics.quantiles(seen, n=10)
    return {"p50_ms": round(statistics.median(seen), 2), "p90_ms": round(cuts[8], 2),
            "rounds": rounds, "from_memory": memory}  # fmt: skip


def segments_of(text: str, kind: str, codec: Any, budget: int) -> list[str]:
    from hymt_serve.request.documents import split_document

    empty = len(codec.encode(""))
    split = split_document(
        text, kind, budget=budget, measure=lambda t: len(codec.encode(t)) - empty
    )
    return list(split.segments)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The package loads only here (the harness's help costs nothing).
    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.codec import TokenCodec
    from hymt_serve.ops.archive import build_archive
    from hymt_serve.ops.launcher import free_port_overrides, start, stop, wait_ready
    from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir

    work = Path(args.work or tempfile.mkdtemp(prefix="hymt-memorybench-"))
    model_dir = build_tiny_model(work / "tiny-model", default_tokenizer_dir())
    codec = TokenCodec.load(Settings.from_mapping({"model_path": str(model_dir)}, environ={}))
    build_archive(
        model_path=model_dir,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=work / "model_store",
    )
    files = {
        "subtitles.srt": (subtitles(args.cues), "srt"),
        "manual.md": (manual(args.sections), "markdown"),
    }
    revised = manual(args.sections, changed=0.1)
    server, _ = start(
        REPO / "config.properties",
        work / "run",
        model_store=work / "model_store",
        models=[f"{MODEL}={MODEL}.mar"],
        overrides=free_port_overrides(),
    )
    port = free_port()
    web_log = (work / "web.log").open("w")
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hymt_serve.cli",
            "web",
            "--workdir",
            str(work / "run"),
            "--port",
            str(port),
        ],
        stdout=web_log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(server, [MODEL], timeout=900)
        for _ in range(300):
            try:
                if requests.get(base, timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        results: dict[str, Any] = {"files": {}}
        for name, (text, kind) in files.items():
            segments = segments_of(text, kind, codec, 256)
            repeats = repeated(segments)
            first, second = document_round(base, text, kind), document_round(base, text, kind)
            results["files"][name] = {
                "segments": len(segments),
                "repeated_segments": repeats,
                "first": first,
                "second": second,
                "repeated_served_share": round(first["memory_segments"] / max(1, repeats), 4),
            }
        segments = segments_of(revised, "markdown", codec, 256)
        known = set(segments_of(files["manual.md"][0], "markdown", codec, 256))
        again = document_round(base, revised, "markdown")
        results["files"]["manual-revised.md"] = {
            "segments": len(segments),
            "segments_seen_before_or_repeated": sum(1 for s in segments if s in known)
            + repeated([s for s in segments if s not in known]),
            "first": again,
        }
        session = requests.Session()
        body = {"text": SENTENCE, "source_lang": "en", "target_lang": "de", "stream": False}
        session.post(f"{base}api/translate", json=body, timeout=120).raise_for_status()
        time.sleep(1.0)  # the writer's turn, and the front end's description of the worker
        session.post(f"{base}api/translate", json=body, timeout=120).raise_for_status()
        direct = f"{server.inference_url()}/predictions/{MODEL}"
        results["latency"] = {
            "front_end_cached": latencies(session, f"{base}api/translate", body, args.rounds),
            "front_end_cache_false": latencies(
                session, f"{base}api/translate", {**body, "cache": False}, args.rounds // 4
            ),
            "torchserve_cached": latencies(
                session, direct, body, args.rounds // 4, server.headers("inference")
            ),
        }
        results["setup"] = {
            "config": "configs/model-config-cpu.yaml (batchSize 4, maxBatchDelay 20 ms)",
            "model": "tiny random-weight hunyuan_v1_dense (hymt tiny-model)",
            "cues": args.cues,
            "sections": args.sections,
            "cpu_cores": len(__import__("os").sched_getaffinity(0)),
        }
        return results
    finally:
        web.terminate()
        web.wait(timeout=30)
        stop(server)


def markdown(results: dict[str, Any]) -> str:
    head = "| file | segments | repeated | 1st run: from memory | share of repeats | "
    head += "2nd run: from memory | seconds 1st / 2nd |"
    lines = ["# Translation memory on the CPU demo", "", head]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, facts in results["files"].items():
        first, second = facts["first"], facts.get("second")
        repeats = facts.get("repeated_segments", facts.get("segments_seen_before_or_repeated"))
        share = facts.get(
            "repeated_served_share", round(first["memory_segments"] / max(1, repeats), 4)
        )
        lines.append(
            f"| {name} | {facts['segments']} | {repeats} | {first['memory_segments']} | "
            f"{share:.0%} | {second['memory_segments'] if second else '-'} | "
            f"{first['seconds']} / {second['seconds'] if second else '-'} |"
        )
    lines += ["", "| a cached sentence | p50 ms | p90 ms | rounds | from memory |",
              "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, facts in results["latency"].items():
        lines.append(f"| {name} | {facts['p50_ms']} | {facts['p90_ms']} | {facts['rounds']} | "
                     f"{facts['from_memory']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    parser.add_argument("--work", help="work folder (default: a new temporary one)")
    parser.add_argument("--cues", type=int, default=300, help="subtitle cues")
    parser.add_argument("--sections", type=int, default=30, help="manual sections")
    parser.add_argument("--rounds", type=int, default=400, help="cached sentence requests")
    args = parser.parse_args()
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
