"""Document benchmark: one 50-page Markdown document through TorchServe as one request, against a
client that sends it one paragraph per request (one at a time, and with concurrent threads); and a
50-page DOCX manual and a 40-slide PPTX deck, each as one request.

In one run: save a 7B-shaped random-weight model (the serving benchmark's), serve it through the
real package (the GPU profile: TorchServe's async mode with the continuous batcher, token auth
on), generate a deterministic Markdown document of about 100,000 characters (headings,
paragraphs, lists, tables, fenced code, links, inline code), then time, alternating, ``--rounds``
times each:

- ``document``: one request ``{"document": ..., "format": "markdown"}`` (the server splits it,
  generates every segment together and rebuilds it);
- ``paragraphs-1``: each paragraph (blank-line separated block outside fenced code) as one
  ``text`` request, one after another (what a simple script does);
- ``paragraphs-N``: the same requests from ``--threads`` threads at once;
- ``docx`` and ``pptx``: one request each, the file in base64 (:mod:`office_documents` builds
  them); the reply's file must open with python-docx / python-pptx and have every member
  outside the translated parts (images included) byte-identical.

``--documents`` picks which documents run (the paragraph modes come with ``markdown``). The
time spent outside the model (the handler's parsing, splitting, tags and rebuilding: it reports
no timings of its own) is measured in this process on the same documents, with the model's
tokenizer counting tokens as the handler does, and a translation that gives each tagged
segment back: ``handler_s`` in the table, ``outside_share`` its part of the median end-to-end.

Output lengths follow one rule for every path (random weights never choose EOS): 8 + 1.2 x the
text's tokens (the server's ``document_length_factor`` is set to 1.2 for the run). The replies'
own token counts are reported, so the work done is visible. The document's structure is checked
in the reply: every literal piece of the source (code, table rules, Markdown markers, blank
lines) must come back in order.

    PYTHONPATH=handler:loadtest/serving python benchmarks/documents/bench_documents.py --out DIR
    PYTHONPATH=handler:loadtest/serving python benchmarks/documents/bench_documents.py --tiny \
        --pages 3 --slides 6 --out DIR
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "handler"), str(REPO / "loadtest/serving")]

from office_documents import WORDS, check_package, make_docx, make_pptx  # noqa: E402
from run_bench import GpuSampler, build_model  # noqa: E402

MODEL = "hunyuan-mt"
DOCUMENTS = ("markdown", "docx", "pptx")
TAG = re.compile(r"<[^>]*>")  # an Office segment's run tags, not words
LENGTH_FACTOR = 1.2


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


Measure = Callable[[str], int]


def handler_side(text: str, kind: str, tokens: Measure, budget: int) -> dict[str, float]:
    """Seconds the handler spends on a document outside the model, timed in this process (the
    handler reports none; best of 3): ``split`` (for an Office file also base64, unzip, XML and
    units) with the tokenizer counting, ``tags`` (each segment's markup to tags, and its
    tokens: the prompt's bulk) and ``rebuild`` (each tagged segment given back as its
    translation, tags restored, the document or package written, in base64 for a file)."""
    from hymt_serve.request.documents import MARKUP_KIND, split_document
    from hymt_serve.request.markup import restore, to_tags

    best: dict[str, float] = {}
    for _ in range(3):
        started = time.perf_counter()
        split = split_document(text, kind, budget=budget, measure=tokens, language="en",
                               target="de")  # fmt: skip
        split_done = time.perf_counter()
        tagged = [to_tags(s, MARKUP_KIND[kind], tags_in_text=True) for s in split.segments]
        for segment, _ in tagged:
            tokens(segment)
        tags_done = time.perf_counter()
        split.assemble([restore(segment, markup, keep_lost=True)[0] for segment, markup in tagged])
        seconds = {
            "split": split_done - started,
            "tags": tags_done - split_done,
            "rebuild": time.perf_counter() - tags_done,
        }
        seconds["total"] = sum(seconds.values())
        if not best or seconds["total"] < best["total"]:
            best = seconds
    return {name: round(value, 3) for name, value in best.items()}


def office_file(kind: str, args: argparse.Namespace) -> bytes:
    if kind == "docx":
        return make_docx(args.pages, footnotes=not args.no_footnotes)
    return make_pptx(args.slides)


def document_facts(
    kind: str, text: str, tokens: Measure, args: argparse.Namespace
) -> tuple[Any, dict[str, Any]]:
    """The document split as the server will split it, and what to say about it."""
    from hymt_serve.request.documents import split_document

    split = split_document(text, kind, budget=args.segment_tokens, measure=tokens,
                           language="en", target="de")  # fmt: skip
    if kind == "markdown":
        size = {"characters": len(text), "pages": args.pages}
    else:
        data = base64.b64decode(text)
        size = {"bytes": len(data), "pages" if kind == "docx" else "slides":
                args.pages if kind == "docx" else args.slides}  # fmt: skip
    facts = {
        **size,
        "words": sum(len(TAG.sub(" ", s).split()) for s in split.segments),
        "segments": len(split.segments),
        "source_tokens": sum(tokens(s) for s in split.segments),
        "handler_s": handler_side(text, kind, tokens, args.segment_tokens),
    }
    return split, facts


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.codec import TokenCodec
    from hymt_serve.ops.archive import build_archive
    from hymt_serve.ops.launcher import start, stop, wait_ready

    work = Path(args.work or tempfile.mkdtemp(prefix="hymt-docbench-"))
    model_dir = build_model(Path(args.model_dir), Path(args.tokenizer), args.tiny)
    codec = TokenCodec.load(Settings.from_mapping({"model_path": str(model_dir)}, environ={}))
    empty = len(codec.encode(""))

    def tokens(text: str) -> int:
        return len(codec.encode(text)) - empty

    texts = {
        kind: make_document(args.pages)
        if kind == "markdown"
        else base64.b64encode(office_file(kind, args)).decode("ascii")
        for kind in args.documents
    }
    splits, facts = {}, {}
    for kind, text in texts.items():
        splits[kind], facts[kind] = document_facts(kind, text, tokens, args)
    blocks = paragraphs(texts["markdown"]) if "markdown" in texts else []
    if blocks:
        facts["markdown"]["paragraph_requests"] = len(blocks)
    print(json.dumps(facts), flush=True)
    profile = "cpu" if args.tiny else "gpu"
    overrides: dict[str, Any] = {
        "asyncCommunication": True,
        "batchSize": 1,
        "handler.document_length_factor": LENGTH_FACTOR,
        "handler.document_segment_tokens": args.segment_tokens,
        "handler.max_new_tokens": args.cap,
        # Every round translates the same documents: the memory would answer all but the first.
        "handler.translation_memory": False,
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

        def one_document(kind: str) -> dict[str, Any]:
            body = {"document": texts[kind], "format": kind, "target_lang": "de",
                    "source_lang": "en"}  # fmt: skip
            try:
                reply = post(url, body, headers)
            except urllib.error.HTTPError as error:  # recorded: the other modes still run
                detail = error.read()[:300].decode("utf-8", "replace")
                return {"output_tokens": 0, "requests": 1, "segments": 0, "structure_kept": False,
                        "error": f"HTTP {error.code}: {detail}"}  # fmt: skip
            outcome = {
                "output_tokens": reply["usage"]["output_tokens"],
                "requests": 1,
                "segments": reply["segments"],
            }
            if kind == "markdown":
                pieces = list(splits[kind].pieces[0::2])
                outcome["structure_kept"] = literal_pieces_in_order(pieces, reply["document"])
                return outcome
            source = base64.b64decode(texts[kind])
            check = check_package(source, base64.b64decode(reply["document"]), kind)
            outcome["structure_kept"] = bool(
                check["same_members_in_order"]
                and check["only_text_parts_changed"]
                and check["images_identical"]
            )
            return outcome | {"package": check}

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

        modes: dict[str, Callable[[], dict[str, Any]]] = {}
        for kind in args.documents:
            modes["document" if kind == "markdown" else kind] = functools.partial(
                one_document, kind
            )
            if kind == "markdown":
                modes["paragraphs-1"] = lambda: by_paragraph(1)
                modes[f"paragraphs-{args.threads}"] = lambda: by_paragraph(args.threads)
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
    return {"documents": facts, "rows": rows, "summary": summarise(rows, facts)}


# The document each one-request mode sends (whose handler_s it is).
MODE_DOCUMENT = {"document": "markdown", "docx": "docx", "pptx": "pptx"}


def summarise(rows: list[dict[str, Any]], facts: dict[str, Any]) -> list[dict[str, Any]]:
    summary = []
    markdown = [r["seconds"] for r in rows if r["mode"] == "document"]
    document = statistics.median(markdown) if markdown else None
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        median = statistics.median(r["seconds"] for r in mine)
        handler = (
            facts[MODE_DOCUMENT[mode]]["handler_s"]["total"] if mode in MODE_DOCUMENT else None
        )
        summary.append(
            {
                "mode": mode,
                "runs": len(mine),
                "median_s": round(median, 2),
                "min_s": min(r["seconds"] for r in mine),
                "max_s": max(r["seconds"] for r in mine),
                "requests": mine[0]["requests"],
                "output_tokens": mine[0]["output_tokens"],
                "vs_document": round(median / document, 2) if document else "-",
                "handler_s": "-" if handler is None else handler,
                "outside_share": "-" if handler is None else f"{handler / median:.1%}",
                "structure_kept": all(r.get("structure_kept", True) for r in mine),
                "failed": sum("error" in r for r in mine),
            }
        )
    return summary


def write_report(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    columns = ["mode", "runs", "median_s", "min_s", "max_s", "requests", "output_tokens",
               "vs_document", "handler_s", "outside_share", "structure_kept", "failed"]  # fmt: skip
    head = "| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns) + "\n"
    lines = ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in result["summary"]]
    documents = "".join(
        f"- {kind}: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + "\n"
        for kind, facts in result["documents"].items()
    )
    checks = "".join(
        f"- {row['mode']} round {row['round']}: {row.get('package') or row['error']}\n"
        for row in result["rows"]
        if "package" in row or "error" in row
    )
    (out / "results.md").write_text(
        f"# Document benchmark: {result['gpu']}, {result['date']}\n\n`{result['command']}`\n\n"
        f"Documents (handler_s: seconds outside the model, timed in-process):\n\n{documents}\n"
        + head
        + "\n".join(lines)
        + (f"\n\nTranslated packages (and failures):\n\n{checks}" if checks else "\n")
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
    axis.set_title(
        f"50-page documents, one request each (and Markdown by paragraph), {result['gpu']}"
    )
    fig.tight_layout()
    fig.savefig(out / "documents.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="the CPU demo model (no GPU)")
    parser.add_argument("--model-dir", default="/tmp/hymt-7b-random")
    parser.add_argument("--tokenizer", default=str(REPO.parent / "shared/hunyuan-tokenizer"))
    parser.add_argument("--work", default=None)
    parser.add_argument(
        "--documents",
        type=lambda text: tuple(text.split(",")),
        default=DOCUMENTS,
        help="comma-separated, of " + ",".join(DOCUMENTS),
    )
    parser.add_argument("--pages", type=int, default=50, help="of the Markdown and DOCX documents")
    parser.add_argument("--slides", type=int, default=40, help="of the PPTX deck")
    parser.add_argument("--no-footnotes", action="store_true", help="a DOCX without footnotes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential-rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--segment-tokens", type=int, default=256)
    parser.add_argument("--cap", type=int, default=512, help="max_new_tokens per text")
    args = parser.parse_args()
    if unknown := set(args.documents) - set(DOCUMENTS):
        parser.error(f"--documents: unknown {sorted(unknown)}, choose from {DOCUMENTS}")
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
