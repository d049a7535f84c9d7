"""Model FLOP utilisation for the serving benchmarks: the model's FLOPs per token from its
config.json, and the card's bf16 matrix rate measured on the spot (no vendor peak figure)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any


def flops_per_token(config: Mapping[str, Any]) -> float:
    """2 x the weights one token multiplies: each layer's q, k, v, o, gate, up and down
    projections (in a mixture of experts: the experts it chooses, the shared one and the
    router) and the LM head. Attention over the context is left out (4 x layers x heads x
    head_dim FLOPs per context position: about 0.2 % of the total at the sentence mix's
    60-position contexts, 3 % at 1,000)."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, k, v in; o out
    layers = int(config["num_hidden_layers"])
    mlp = 3 * hidden * int(config["intermediate_size"])
    kinds = config.get("mlp_layer_types")
    if config.get("num_experts") and kinds:  # a mixture: the dense layers, then per token
        # the chosen experts and the shared one, and the router
        width = int(config["moe_intermediate_size"])
        chosen = int(config["num_experts_per_tok"]) + int(config.get("num_shared_experts") or 0)
        sparse = sum(kind == "sparse" for kind in kinds[:layers])
        per_mixture = 3 * hidden * width * chosen + hidden * int(config["num_experts"])
        mlps = (layers - sparse) * mlp + sparse * per_mixture
    else:
        mlps = layers * mlp
    return 2.0 * (layers * attention + mlps + config["vocab_size"] * hidden)


def bf16_matmul_rate(size: int = 8192, repeats: int = 20) -> float | None:
    """FLOP/s of a ``size``-cubed bf16 matrix product on the current CUDA device (median of
    ``repeats``); None without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    seconds = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * size**3 / statistics.median(seconds)


def utilisation(row: Mapping[str, Any], flops: float, rate: float | None) -> dict[str, Any]:
    """A result row's model TFLOP/s (prompt and output tokens alike) and its share of the
    measured matrix rate; the prompt's share needs ``prompt_tokens_per_s`` in the row."""
    prompt = row.get("prompt_tokens_per_s")
    if prompt is None:
        return {"model_tflops": None, "mfu_pct": None}
    model = (prompt + row["output_tokens_per_s"]) * flops
    return {
        "model_tflops": round(model / 1e12, 1),
        "mfu_pct": None if rate is None else round(100 * model / rate, 1),
    }
