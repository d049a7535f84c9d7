"""Document benchmark: one 50-page Markdown document through TorchServe as one request, against a
client that sends it one paragraph per request (one at a time, and with concurrent threads).

In one run: save a 7B-shaped random-weight model (the serving benchmark's), serve it through the
real package (the GPU profile: TorchServe's async mode with the continuous batcher, token auth
on), generate a deterministic Markdown document of about 100,000 characters (headings,
paragraphs, lists, tables, fenced code, links, inline code), then time, alternating, ``--rounds``
times each:

- ``document``: one request ``{"document": ..., "format": "markdown"}`` (the server splits it,
  generates every segment together and rebuilds it);
- ``paragraphs-1``: each paragraph (blank-line separated block outside fenced code) as one
  ``text`` request, one after another (what a simple script does);
- ``paragraphs-N``: the same requests from ``--threads`` threads at once.

Output lengths follow one rule for every path (random weights never choose EOS): 8 + 1.2 x the
text's tokens (the server's ``document_length_factor`` is set to 1.2 for the run). The replies'
own token counts are reported, so the work done is visible. The document's structure is checked
in the reply: every literal piece of the source (code, table rules, Markdown markers, blank
lines) must come back in order.

    PYTHONPATH=handler:loadtest/serving python benchmarks/documents/bench_documents.py --out DIR
    PYTHONPATH=handler:loadtest/serving python benchmarks/documents/bench_documents.py --tiny \
        --pages 3 --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "handler"), str(REPO / "loadtest/serving")]

from run_bench import GpuSampler, build_model  # noqa: E402

MODEL = "hunyuan-mt"
LENGTH_FACTOR = 1.2
WORDS = (  # noqa: SIM905
    "the server model request batch token engine worker queue memory document segment page "
    "language translation sentence paragraph result answer user client system time second "
    "step speed limit number value field name file folder format table list code example "
    "reply error status health metric graph kernel layer weight cache prompt template output "
    "input text word line block heading link image release version update change feature "
    "test check run start stop load save read write send wait keep make take give show find "
    "use need want know think see come go get put set turn move hold bring begin end build "
    "quick slow large small long short early late new old good best first last next every "
    "each many few most some all other same different simple clear real whole open careful"
).split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 24))]
    if rng.random() < 0.15:
        words.insert(rng.randint(1, len(words) - 1), f"`{rng.choice(WORDS)}_{rng.randint(1, 99)}`")
    if rng.random() < 0.1:
        words.insert(
            rng.randint(1, len(words) - 1), f"[{rng.choice(WORDS)}](docs/{rng.choice(WORDS)}.md)"
        )
    if rng.random() < 0.1:
        words.insert(rng.randint(1, len(words) - 1), f"**{rng.choice(WORDS)}**")
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".....?!")


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))


def make_document(pages: int, seed: int = 0) -> str:
    """About 2,000 characters of varied Markdown per page."""
    rng = random.Random(seed)
    parts = ["---\ntitle: Benchmark document\n---\n"]
    for page in range(pages):
        parts.append(f"## {page + 1}. {sentence(rng).rstrip('.?!')}\n")
        parts.append(paragraph(rng) + "\n")
        kind = page % 4
        if kind == 0:
            parts.append("\n".join(f"- {sentence(rng)}" for _ in range(rng.randint(3, 6))) + "\n")
        elif kind == 1:
            rows = "\n".join(
                f"| `{rng.choice(WORDS)}` | {sentence(rng)} | {rng.randint(1, 999)} |"
                for _ in range(rng.randint(3, 5))
            )
            parts.append("| Name | Meaning | Value |\n|------|---------|------:|\n" + rows + "\n")
        elif kind == 2:
            code = "\n".join(f"{rng.choice(WORDS)} = {rng.randint(0, 9999)}" for _ in range(6))
            parts.append(f"```python\n{code}\n```\n")
        else:
            parts.append(f"> {sentence(rng)} {sentence(rng)}\n")
        parts.append(paragraph(rng) + "\n")
        parts.append(paragraph(rng) + "\n")
    return "\n".join(parts)


def paragraphs(document: str) -> list[str]:
    """What a per-paragraph client sends: blank-line separated blocks outside fenced code."""
    blocks, inside = [], False
    for block in document.split("\n\n"):
        if block.startswith("```"):
            inside = not block.rstrip().endswith("```") or block.count("```") == 1
            continue
        if inside or block.startswith("---\ntitle"):
            continue
        if block.strip():
            blocks.append(block.strip())
    return blocks


def post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 600) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def literal_pieces_in_order(source_pieces: list[str], translated: str) -> bool:
    position = 0
    for piece in source_pieces:
        found = translated.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.codec import TokenCodec
    from hymt_serve.ops.archive import build_archive
    from hymt_serve.ops.launcher import start, stop, wait_ready
    from hymt_serve.request.documents import split_document

    work = Path(args.work or tempfile.mkdtemp(prefix="hymt-docbench-"))
    model_dir = build_model(Path(args.model_dir), Path(args.tokenizer), args.tiny)
    document = make_document(args.pages)
    blocks = paragraphs(document)
    codec = TokenCodec.load(Settings.from_mapping({"model_path": str(model_dir)}, environ={}))
    empty = len(codec.encode(""))

    def tokens(text: str) -> int:
        return len(codec.encode(text)) - empty

    split = split_document(
        document, "markdown", budget=args.segment_tokens, measure=tokens, language="en"
    )
    facts = {
        "characters": len(document),
        "pages": args.pages,
        "segments": len(split.segments),
        "paragraph_requests": len(blocks),
        "source_tokens": sum(tokens(s) for s in split.segments),
    }
    print(json.dumps(facts), flush=True)
    profile = "cpu" if args.tiny else "gpu"
    overrides: dict[str, Any] = {
        "asyncCommunication": True,
        "batchSize": 1,
        "handler.document_length_factor": LENGTH_FACTOR,
        "handler.document_segment_tokens": args.segment_tokens,
        "handler.max_new_tokens": args.cap,
    }
    if args.tiny:
        overrides["handler.engine"] = "fast"
    build_archive(
        model_path=model_dir,
        template=REPO / f"configs/model-config-{profile}.yaml",
        export_path=work / "model_store",
        overrides=overrides,
    )
    sampler = GpuSampler()
    server, _ = start(REPO / "config.properties", work / "run", model_store=work / "model_store")
    try:
        wait_ready(server, [MODEL], timeout=900)
        url = f"{server.inference_url()}/predictions/{MODEL}"
        headers = server.headers("inference")
        post(url, {"text": "Warm up.", "target_lang": "de"}, headers)

        def one_document() -> dict[str, Any]:
            reply = post(
                url,
                {"document": document, "format": "markdown", "target_lang": "de",
                 "source_lang": "en"},
                headers,
            )  # fmt: skip
            return {
                "output_tokens": reply["usage"]["output_tokens"],
                "requests": 1,
                "structure_kept": literal_pieces_in_order(
                    list(split.pieces[0::2]), reply["document"]
                ),
                "segments": reply["segments"],
            }

        def one_paragraph(text: str) -> int:
            body = {
                "text": text,
                "target_lang": "de",
                "source_lang": "en",
                "max_new_tokens": min(args.cap, 8 + math.ceil(LENGTH_FACTOR * tokens(text))),
            }
            return int(post(url, body, headers)["usage"]["output_tokens"])

        def by_paragraph(threads: int) -> dict[str, Any]:
            with ThreadPoolExecutor(threads) as pool:
                produced = list(pool.map(one_paragraph, blocks))
            return {"output_tokens": sum(produced), "requests": len(produced)}

        modes = {
            "document": one_document,
            "paragraphs-1": lambda: by_paragraph(1),
            f"paragraphs-{args.threads}": lambda: by_paragraph(args.threads),
        }
        rows = []
        for round_ in range(args.rounds):
            for mode, call in modes.items():
                if mode == "paragraphs-1" and round_ >= args.sequential_rounds:
                    continue
                started = time.monotonic()
                outcome = call()
                seconds = time.monotonic() - started
                row = {
                    "mode": mode,
                    "round": round_,
                    "seconds": round(seconds, 2),
                    "output_tokens_per_s": round(outcome["output_tokens"] / seconds),
                    **outcome,
                    **sampler.window(started, time.monotonic()),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
        describe = urllib.request.Request(
            f"{server.management_url()}/models/{MODEL}?customized=true",
            headers=server.headers("management"),
        )
        with urllib.request.urlopen(describe, timeout=60) as response:
            (work / "describe.json").write_bytes(response.read())
    finally:
        stop(server)
    return {"document": facts, "rows": rows, "summary": summarise(rows)}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    document = statistics.median(r["seconds"] for r in rows if r["mode"] == "document")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        median = statistics.median(r["seconds"] for r in mine)
        summary.append(
            {
                "mode": mode,
                "runs": len(mine),
                "median_s": round(median, 2),
                "min_s": min(r["seconds"] for r in mine),
                "max_s": max(r["seconds"] for r in mine),
                "requests": mine[0]["requests"],
                "output_tokens": mine[0]["output_tokens"],
                "vs_document": round(median / document, 2),
                "structure_kept": all(r.get("structure_kept", True) for r in mine),
            }
        )
    return summary


def write_report(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    columns = ["mode", "runs", "median_s", "min_s", "max_s", "requests", "output_tokens",
               "vs_document", "structure_kept"]  # fmt: skip
    head = "| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns) + "\n"
    lines = ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in result["summary"]]
    facts = ", ".join(f"{k} {v}" for k, v in result["document"].items())
    (out / "results.md").write_text(
        f"# Document benchmark: {result['gpu']}, {result['date']}\n\n`{result['command']}`\n\n"
        f"Document: {facts}.\n\n" + head + "\n".join(lines) + "\n"
    )
    plot(out, result)


def plot(out: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 4))
    modes = [r["mode"] for r in result["summary"]]
    medians = [r["median_s"] for r in result["summary"]]
    axis.bar(modes, medians, color=[f"C{i}" for i in range(len(modes))])
    for index, value in enumerate(medians):
        axis.text(index, value, f"{value:g} s", ha="center", va="bottom")
    axis.set_ylabel("seconds for the whole document (median)")
    axis.set_title(f"{result['document']['characters']:,} characters of Markdown, {result['gpu']}")
    fig.tight_layout()
    fig.savefig(out / "documents.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="the CPU demo model (no GPU)")
    parser.add_argument("--model-dir", default="/tmp/hymt-7b-random")
    parser.add_argument("--tokenizer", default=str(REPO.parent / "shared/hunyuan-tokenizer"))
    parser.add_argument("--work", default=None)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential-rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--segment-tokens", type=int, default=256)
    parser.add_argument("--cap", type=int, default=512, help="max_new_tokens per text")
    args = parser.parse_args()
    result = run(args)
    gpu = "CPU (tiny model)"
    if not args.tiny:
        import torch

        gpu = torch.cuda.get_device_name(0)
    result.update(
        gpu=gpu,
        date=datetime.date.today().isoformat(),
        command="python benchmarks/documents/bench_documents.py " + " ".join(sys.argv[1:]),
    )
    write_report(Path(args.out), result)
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
