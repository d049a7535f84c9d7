"""The arithmetic of sizing on paper: the cards' datasheet figures, the models' shapes, the bytes
each weight form keeps in the fast engine, the KV-cache slots the engine's memory plan gives, and
a roofline decode step. No torch, no GPU: :mod:`size_24gb` runs it over the cards and calibrates
it with the H100's measurements.

Sources of the figures are in docs/sizing.md ("24 GB cards"); what each constant stands for is
said beside it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class Card:
    """One GPU as a datasheet gives it (rates dense, without sparsity) and as NVML reports its
    memory. ``fp8_flops`` is 0 where the card has no FP8 tensor cores."""

    name: str
    capability: tuple[int, int]
    total_bytes: int  # what NVML / nvidia-smi report as the card's memory
    bandwidth: float  # bytes/s, the datasheet's memory bandwidth
    bf16_flops: float  # FLOP/s, dense bf16 tensor-core rate
    fp8_flops: float  # FLOP/s, dense FP8 tensor-core rate; 0: none


A10 = Card("NVIDIA A10", (8, 6), 23028 * MIB, 600e9, 125e12, 0.0)
L4 = Card("NVIDIA L4", (8, 9), 23034 * MIB, 300e9, 121e12, 242e12)
H100 = Card("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB, 3.35e12, 989.5e12, 1979e12)

# Memory that is not free to the engine before its KV cache is sized: what an idle A10 reports
# as used with no process on it (driver reservations), and the engine process's own CUDA
# context, cuBLAS workspace and modules (an assumption: not separable in the H100's figures).
DRIVER_RESERVED = 541_917_184
CONTEXT = 500_000_000


@dataclass(frozen=True)
class Shape:
    """A hunyuan_v1_dense model's shape (config.json's fields)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    def projection_params(self) -> int:
        """q, k, v, o, gate, up and down of every layer."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    def projection_rows(self) -> int:
        """Output rows of every layer's fused products (qkv, o, gate_up, down): one int8 scale
        each."""
        qkv = self.head_dim * (self.heads + 2 * self.kv_heads)
        return self.layers * (qkv + self.hidden + 2 * self.intermediate + self.hidden)

    def norm_params(self) -> int:
        """Two RMSNorms of the hidden size and the q/k norms of head_dim per layer, the last
        norm."""
        return self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        head = 0 if self.tied else self.embed_params()
        return self.projection_params() + self.norm_params() + self.embed_params() + head

    def flops_per_token(self) -> float:
        """2 x the weights a token multiplies (projections and LM head)."""
        return 2.0 * (self.projection_params() + self.embed_params())

    def kv_bytes_per_token(self, element: int = 2) -> int:
        """K and V of every layer for one position (the cache is bf16 in every weight form)."""
        return self.layers * self.kv_heads * self.head_dim * 2 * element

    def padded_vocab(self) -> int:
        """The LM head's rows, padded to a multiple of 64 for aligned GEMMs."""
        return -(-self.vocab // 64) * 64


HUNYUAN_7B = Shape("7B", 32, 4096, 14336, 32, 8, 128, 128167)
HUNYUAN_1_8B = Shape("1.8B", 32, 2048, 6144, 16, 4, 128, 120818)

FORMS = ("bf16", "fp8", "fp8+head", "int8", "int8+head", "int4", "int4+head")
GPTQ_GROUP = 128  # inputs per scale and zero point of an int4 weight


def weight_bytes(shape: Shape, form: str) -> int:
    """The bytes the fast engine keeps for ``shape`` in ``form``, counted as its describe()
    counts them (``weight_bytes``): projections in the form; fp8's one fp32 scale per fused
    product (four a layer, and as many input scales for an FP8 checkpoint: left out, 512 bytes);
    int8's fp32 scale per output row; int4 packed two to a byte with fp16 scales and zero points
    per 128 inputs (GPTQ's layout); norms in bf16; the embedding bf16 unless ``+head``, where
    the tied table is the LM head's quantized one (int8 beside int4), whose scale tensor is
    counted twice, as the engine's sum counts it (once for the head, once for the embedding)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    projections = shape.projection_params()
    norms = 2 * shape.norm_params()
    kind, _, head = form.partition("+")
    if kind == "bf16":
        return 2 * shape.params()
    if kind == "fp8":
        body = projections + 4 * 4 * shape.layers
    elif kind == "int8":
        body = projections + 4 * shape.projection_rows()
    else:
        body = projections // 2 + 2 * 2 * projections // GPTQ_GROUP
    if not head:
        return body + norms + 2 * shape.embed_params()
    if kind == "fp8":  # one e4m3 table, one fp32 scale for head and embedding
        return body + norms + shape.embed_params() + 2 * 4
    return body + norms + shape.embed_params() + 2 * 4 * shape.padded_vocab()


def runs_on(card: Card, form: str) -> str | None:
    """Why the engine refuses ``form`` on ``card`` (None when it runs): FP8 needs FP8 tensor
    cores (compute capability 8.9+, checked at load); the weight-only int8 and int4 kernels are
    Triton with PTX of compute capability 8.0 (prmt, bf16x2 arithmetic)."""
    if form.startswith("fp8") and card.capability < (8, 9):
        return f"refused: FP8 needs compute capability 8.9+, this card has {card.capability}"
    if card.capability < (8, 0):
        return "not planned: the engine's kernels assume compute capability 8.0+"
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """The fast engine's KV-cache sizing (``runners.build.cache_rows``): rows of
    ``positions + 16`` tokens in KV_SHARE of the free memory, after ``prefix_entries`` kept
    prompt beginnings of 256 tokens, at most ``wanted``."""

    positions: int = 1536  # max_input_tokens 1024 + max_new_tokens 512 (the GPU profile)
    headroom: int = 16  # the runner's STEP_HEADROOM
    prefix_entries: int = 64  # the GPU profile's prefix_cache_entries
    prefix_tokens: int = 256  # PREFIX_TOKENS
    wanted: int = 256  # the GPU profile's max_batch_rows
    kv_share: float = 0.8  # KV_CACHE_SHARE


def free_before_cache(card: Card, resident: int) -> int:
    """Free device memory when the KV cache is sized, with ``resident`` bytes of weights."""
    return card.total_bytes - DRIVER_RESERVED - CONTEXT - resident


GPU_PROFILE = MemoryPlan()


def kv_slots(card: Card, shape: Shape, resident: int, plan: MemoryPlan = GPU_PROFILE) -> int:
    """Rows the memory plan gives with ``resident`` weight bytes on the card (0: none fits)."""
    per_token = shape.kv_bytes_per_token()
    budget = int(free_before_cache(card, resident) * plan.kv_share)
    budget -= plan.prefix_entries * plan.prefix_tokens * per_token
    rows = budget // (per_token * (plan.positions + plan.headroom))
    return max(0, min(plan.wanted, rows))


def cache_bytes(shape: Shape, rows: int, plan: MemoryPlan = GPU_PROFILE) -> int:
    """What the runner allocates for ``rows``: one more row (its scratch slot) of
    ``positions + 16`` tokens, and the kept prefixes."""
    per_token = shape.kv_bytes_per_token()
    slots = (rows + 1) * (plan.positions + plan.headroom) * per_token
    return slots + plan.prefix_entries * min(plan.prefix_tokens, plan.positions) * per_token


@dataclass(frozen=True)
class Mix:
    """The sentence mix per request: prompt and output tokens (means)."""

    prompt: float
    output: float

    def live_positions(self) -> float:
        """Mean positions in a running row's cache: the prompt and half the output."""
        return self.prompt + self.output / 2

    def tokens_per_row_step(self) -> float:
        """Tokens a step computes per running row: its new one and, in steady state, the
        prompt tokens of the rows that join (each row's prompt spread over its output
        steps)."""
        return 1.0 + self.prompt / self.output


@dataclass(frozen=True)
class Step:
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)


def roofline_step(card: Card, shape: Shape, form: str, batch: float, mix: Mix) -> Step:
    """A decode step at ``batch`` rows: read the weights and the live KV cache once at the
    card's bandwidth, or compute every token's products at its tensor rate (FP8 forms at the
    FP8 rate), whichever takes longer."""
    kv = batch * mix.live_positions() * shape.kv_bytes_per_token()
    memory = (weight_bytes(shape, form) + kv) / card.bandwidth
    rate = card.fp8_flops if form.startswith("fp8") else card.bf16_flops
    flops = batch * mix.tokens_per_row_step() * shape.flops_per_token()
    return Step(memory, flops / rate)


def roofline_requests(card: Card, shape: Shape, form: str, batch: float, mix: Mix) -> float:
    """Requests/s of the mix at ``batch`` running rows: each takes its output's steps."""
    if batch <= 0:
        return 0.0
    return batch / (mix.output * roofline_step(card, shape, form, batch, mix).seconds)


def interpolate(points: dict[int, float], batch: float) -> float:
    """Piecewise linear in the batch through measured ``points``, flat past both ends."""
    xs = sorted(points)
    if batch <= xs[0]:
        return points[xs[0]]
    for low, high in itertools.pairwise(xs):
        if batch <= high:
            share = (batch - low) / (high - low)
            return points[low] + share * (points[high] - points[low])
    return points[xs[-1]]
