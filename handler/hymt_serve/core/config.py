"""The ``handler:`` keys of model-config.yaml, one frozen dataclass per concern.

Each field carries its bounds and a one-line doc in its metadata (:func:`bounded`,
:func:`choice`, :func:`flag`): :mod:`hymt_serve.core.settings` validates against them and
:mod:`hymt_serve.core.reference` writes the configuration reference from them. The keys stay
flat on the wire; which concern a key belongs to is ours alone.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from hymt_serve.core.types import SamplingParams

Kind = Literal["int", "float", "choice", "flag", "path", "url"]


@dataclass(frozen=True)
class Spec:
    """What one key accepts: its kind, bounds (both inclusive unless ``low_open``) or choices,
    and its doc."""

    kind: Kind
    doc: str
    low: float = 0
    high: float = 0
    low_open: bool = False
    choices: tuple[str, ...] = ()

    def bounds(self) -> str:
        """The accepted values as the error messages and the reference write them."""
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind == "flag":
            return "true, false"
        if self.kind == "path":
            return ", ".join((*self.choices, "a folder"))
        if self.kind == "url":
            return ", ".join((*self.choices, "a database URL"))
        return f"{'(' if self.low_open else '['}{self.low}, {self.high}]"


def bounded(default: float, low: float, high: float, doc: str, *, low_open: bool = False) -> Any:
    """An int or float field in [low, high] (or (low, high] with ``low_open``)."""
    kind: Kind = "int" if isinstance(default, int) else "float"
    spec = Spec(kind, doc, low, high, low_open)
    return field(default=default, metadata={"spec": spec})


def choice(default: str, choices: tuple[str, ...], doc: str) -> Any:
    """A field naming one of ``choices`` (normalised: stripped, lower-cased)."""
    return field(default=default, metadata={"spec": Spec("choice", doc, choices=choices)})


def flag(default: bool, doc: str) -> Any:
    return field(default=default, metadata={"spec": Spec("flag", doc)})


def folder(default: str, words: tuple[str, ...], doc: str) -> Any:
    """A field naming a folder, or one of ``words`` (normalised: stripped, lower-cased)."""
    return field(default=default, metadata={"spec": Spec("path", doc, choices=words)})


def database_url(default: str, words: tuple[str, ...], doc: str) -> Any:
    """A field naming a database (a SQLAlchemy URL), or one of ``words`` (normalised)."""
    return field(default=default, metadata={"spec": Spec("url", doc, choices=words)})


def spec_of(config: type[Any], name: str) -> Spec:
    """The spec of ``config``'s field ``name``."""
    return next(spec for field_, spec in specs(config) if field_.name == name)


def specs(config: type[Any]) -> Iterator[tuple[Field[Any], Spec]]:
    for field_ in fields(config):
        yield field_, field_.metadata["spec"]


class Quantization(str, enum.Enum):
    """How the weights are quantized: a ``quantization`` setting, or a quantized checkpoint's
    kind (``GPTQ_INT4``, ``FP8``). It knows which engine quantizes, and whether the LM head may
    follow the projections (``quantize_lm_head``). A member is its value as a string (as
    ``enum.StrEnum``, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    NONE = "none"
    FP8 = "fp8"  # FP8 tensor cores (or an FP8 checkpoint), quantized by the fast engine
    INT8 = "int8"  # weight-only, the fast engine's kernels
    INT4 = "int4"  # weight-only, the fast engine's kernels
    BNB_INT8 = "bnb-int8"  # bitsandbytes, quantized by transformers at load (hf engine)
    NF4 = "nf4"  # bitsandbytes, quantized by transformers at load (hf engine)
    GPTQ_INT4 = "gptq-int4"  # a GPTQ-Int4 checkpoint, run by the int4 kernels; not a setting

    @classmethod
    def settable(cls) -> tuple[str, ...]:
        """The values the ``quantization`` key accepts."""
        return tuple(q.value for q in cls if q is not cls.GPTQ_INT4)

    @property
    def fast(self) -> bool:
        """Quantized by the fast engine when it builds (it cannot fall back to transformers)."""
        return self in (Quantization.FP8, Quantization.INT8, Quantization.INT4)

    @property
    def bitsandbytes(self) -> bool:
        """Quantized by transformers at load through bitsandbytes (CUDA, the hf engine)."""
        return self in (Quantization.BNB_INT8, Quantization.NF4)

    @property
    def head_may_follow(self) -> bool:
        """Whether the LM head may be quantized too: fp8, or int8 beside int8 and int4."""
        return self.fast or self is Quantization.GPTQ_INT4

    def fits_checkpoint(self, checkpoint: Quantization) -> bool:
        """Whether this setting may load a checkpoint already quantized as ``checkpoint``:
        none, or the kernels the checkpoint runs on."""
        kernel = Quantization.INT4 if checkpoint is Quantization.GPTQ_INT4 else checkpoint
        return self in (Quantization.NONE, kernel)


FAMILIES = ("auto", "hunyuan-mt-7b", "hunyuan-mt-chimera", "hy-mt1.5", "hy-mt2")


@dataclass(frozen=True, kw_only=True)
class Loading:
    """Where the model runs, in which form, with which kernels."""

    device: str = choice("auto", ("auto", "cpu", "cuda"), "Where the model runs.")
    dtype: str = choice(
        "auto",
        ("auto", "bfloat16", "float16", "float32"),
        "Weights' and activations' dtype (auto: bfloat16 where supported, float16 on other "
        "GPUs, float32 on the CPU).",
    )
    attention: str = choice(
        "auto",
        ("auto", "flash_attention_2", "sdpa", "eager"),
        "transformers' attention (auto: flash_attention_2 where flash_attn imports on CUDA, "
        "sdpa otherwise).",
    )
    quantization: Quantization = choice(  # noqa: RUF009 (an enum member: immutable)
        Quantization.NONE,
        Quantization.settable(),
        "Weights' quantization: fp8 (FP8 tensor cores, compute capability 8.9+), int8 or int4 "
        "(weight-only, the fast engine), bnb-int8 or nf4 (bitsandbytes, the hf engine). FP8 "
        "and GPTQ-Int4 checkpoints are recognised from their config.json: leave none.",
    )
    quantize_lm_head: bool = flag(
        False,
        "Quantize the LM head (and the embedding tied to it) like the projections: fp8, or "
        "int8 beside int8, int4 and GPTQ-Int4.",
    )
    engine: str = choice(
        "auto",
        ("auto", "hf", "fast"),
        "fast: static KV cache and CUDA graphs; hf: transformers' forward; auto: fast on CUDA "
        "(falling back to hf with a logged reason).",
    )
    blas_library: str = choice(
        "cublas",
        ("cublas", "cublaslt"),
        "CUDA only: the library of PyTorch's dense products, for the whole engine process.",
    )
    one_row_kernel: str = choice(
        "auto",
        ("auto", "triton", "cublas"),
        "CUDA only: the kernel of one-row bf16/fp16 products (batch-1 decode); auto: triton "
        "on compute capability 9.x, cublas elsewhere.",
    )
    cpu_threads: int = bounded(
        0,
        0,
        1_024,
        "CPU only: threads of one engine's operations; 0: the usable cores divided among the "
        "model's engines (unless OMP_NUM_THREADS is set).",
    )
    prompt_family: str = choice(
        "auto",
        FAMILIES,
        "The model family's prompts and request fields (auto: from the model folder's "
        "hymt_family.txt or name).",
    )
    compile_cache_dir: str = folder(
        "auto",
        ("auto", "off"),
        "Fast engine: where compiled kernels and autotuning results are kept and reused by the "
        "next start with the same model, card, precision and code (one folder per key); auto: "
        "compile-cache in hymt start's work folder; off: torch's own defaults. "
        "$HYMT_COMPILE_CACHE_DIR overrides it; a relative folder is read in the work folder.",
    )


@dataclass(frozen=True, kw_only=True)
class Scheduler:
    """The continuous batcher: rows in the engine, the prefix cache, chunked prefill."""

    max_batch_rows: int = bounded(
        64,
        1,
        4_096,
        "Rows generated together: the KV-cache slots (fewer when free memory holds fewer rows "
        "of max_input_tokens + max_new_tokens).",
    )
    prefix_cache_entries: int = bounded(
        64,
        0,
        1_024,
        "Fast engine: prompt beginnings (templates per target language, a document's context) "
        "whose K/V are kept and reused, 256 tokens at most each; 0: off.",
    )
    mixed_step_tokens: int = bounded(
        256,
        0,
        4_096,
        "Fast engine: prompt tokens that ride in each decode step, so new rows join without "
        "stalling the batch; 0: rows join between steps.",
    )
    document_window_rows: int = bounded(
        512,
        1,
        1_000_000,
        "A document's rows in the engine at once; the rest follow as they finish.",
    )


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """Ceilings on what one request may ask: a request may lower them, never raise them."""

    max_input_tokens: int = bounded(1024, 16, 32_768, "Prompt tokens per text.")
    max_new_tokens: int = bounded(
        512, 1, 32_768, "Generated tokens per text: the default and the cap of a request's own."
    )
    max_texts_per_request: int = bounded(16, 1, 1_024, "Texts in one request.")
    max_chars_per_text: int = bounded(4000, 1, 1_000_000, "Characters per text.")
    max_glossary_terms: int = bounded(64, 0, 10_000, "Glossary pairs per request.")
    max_term_chars: int = bounded(200, 1, 10_000, "Characters per glossary term.")
    max_context_chars: int = bounded(2000, 0, 1_000_000, "Characters of context.")
    max_instruction_chars: int = bounded(
        500, 1, 100_000, "Characters of a style or of one preference."
    )
    max_document_bytes: int = bounded(1_048_576, 1, 16_777_216, "A document's UTF-8 bytes.")
    # 4 MiB: in base64 (5.6 MB) it fits TorchServe's max_request_size of 6.5 MB.
    max_office_bytes: int = bounded(
        4_194_304, 1, 67_108_864, "An Office file's bytes (DOCX, PPTX, XLSX), before base64."
    )
    max_document_segments: int = bounded(20_000, 1, 1_000_000, "Segments (rows) per document.")
    document_segment_tokens: int = bounded(
        256, 16, 32_768, "Tokens per segment before a block is cut into sentences."
    )
    document_length_factor: float = bounded(
        3.0,
        0.0,
        100.0,
        "A segment's output stops at 8 + this x its own tokens (and at max_new_tokens).",
        low_open=True,
    )


@dataclass(frozen=True, kw_only=True)
class Serving:
    """How TorchServe's workers reach the engine (async mode)."""

    max_waiting_rows: int = bounded(
        1024,
        1,
        1_000_000,
        "Async mode: texts that may wait for the engine beyond those it generates; more get "
        "503 at once.",
    )
    share_engine: bool = flag(
        False,
        "Async mode: the workers on one GPU share one engine process (one copy of the "
        "weights, one batch).",
    )


@dataclass(frozen=True, kw_only=True)
class OutputChecks:
    """What is checked in a translation before it is answered: its language against the
    target (the reply's target_language, docs/api.md)."""

    target_language_check: str = choice(
        "retry",
        ("retry", "report", "off"),
        "retry: a text answered in another language than its target is generated once more, "
        "sampled (never a streamed text: its deltas are already sent); report: only said in "
        "the reply and the metric; off: not checked.",
    )
    target_language_confidence: float = bounded(
        0.8,
        0.5,
        1.0,
        "How sure the language identification must be to call an output's language wrong "
        "(short, mixed or copied text is never called wrong).",
    )


@dataclass(frozen=True, kw_only=True)
class Memory:
    """The translation memory (docs/translation-memory.md): each text's or segment's
    translation kept in a database, keyed by everything that decides it (the model's files and
    precision, the prompt's token ids, the limits), and served again without the model."""

    translation_memory: bool = flag(
        True,
        "Serve a text or segment translated before from the memory (greedy rows; a sampled one "
        'only with a seed and "cache": true); on where memory_database_url finds a database.',
    )
    memory_database_url: str = database_url(
        "auto",
        ("auto",),
        "The memory's database; auto: $HYMT_DATABASE_URL, else hymt.db in hymt start's work "
        "folder (the front end's database), else none (the memory is off).",
    )
    memory_max_rows: int = bounded(
        1_000_000,
        100,
        1_000_000_000,
        "Translations kept; past it the least recently used go, 5 % at a time.",
    )
    memory_isolation: bool = flag(
        False,
        "Each client key of the front end gets a memory of its own (the front end sends the "
        "key's name); false: one memory for every client.",
    )


_DEFAULTS = SamplingParams()


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Sampling defaults of requests that ask for ``"sampling": true``, and the bounds of a
    request's own values. A key the handler section leaves out comes from the model folder's
    ``generation_config.json`` when it names it (the card's recommendation: Hy-MT2-30B-A3B's
    differs from the 7B family's), else from the defaults here (Hunyuan-MT-7B's card)."""

    temperature: float = bounded(
        _DEFAULTS.temperature, 0.0, 10.0, "Softmax temperature.", low_open=True
    )
    top_p: float = bounded(_DEFAULTS.top_p, 0.0, 1.0, "Nucleus probability mass.", low_open=True)
    top_k: int = bounded(_DEFAULTS.top_k, 0, 1_000, "Candidates kept per step (0: no limit).")
    repetition_penalty: float = bounded(
        _DEFAULTS.repetition_penalty, 0.0, 10.0, "Penalty of tokens already seen.", low_open=True
    )

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.repetition_penalty)


CONCERNS: dict[str, type[Any]] = {
    "loading": Loading,
    "scheduler": Scheduler,
    "limits": RequestLimits,
    "serving": Serving,
    "checks": OutputChecks,
    "memory": Memory,
    "sampling": Sampling,
}
