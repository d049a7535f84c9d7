"""A child process for tests/unit/test_compile_cache.py: compiles the tiny model's step
functions with inductor on the CPU inside the compile cache under ``argv[1]``, then prints the
cache's report as JSON (``reused``, inductor's FX graph cache hits and misses)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hymt_serve.engine.compile_cache import open_cache
from hymt_serve.engine.runners.build import build_fast_runner


def main() -> None:
    config = AutoConfig.for_model(
        model_type="hunyuan_v1_dense", num_hidden_layers=2, hidden_size=64,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-5, use_qk_norm=True,
        rope_theta=10000.0, rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    runner = build_fast_runner(model, max_batch_size=1, max_seq_len=32)  # one bucket
    cache = open_cache(Path(sys.argv[1]), {"test": "tiny model, CPU"})
    cache.apply()
    # what the runner's capture does on CUDA before capturing: compile the steps, run each
    runner.fns = runner.architecture.step_functions(runner.shape, compile_=True)
    with torch.inference_mode():
        for bucket in runner.buckets:
            runner._forward(bucket)
    print(json.dumps(cache.finish()))


if __name__ == "__main__":
    main()
