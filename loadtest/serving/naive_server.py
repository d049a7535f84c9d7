"""BASELINE, NOT OUR SERVER: the naive recipe that field reports on Hunyuan-MT-7B start from.

One Flask process, the model in fp16, a global lock, one ``generate`` per request, no batching.
It is here only so that the serving benchmark can run it on the same GPU under the same load.
It takes the same prompt template and, like every system in the benchmark, a fixed output
length (``min_new_tokens = max_new_tokens``: random weights never choose EOS on purpose).

    python loadtest/serving/naive_server.py --model-path DIR --port 5000
    POST /translate {"text", "src_lang", "tgt_lang", "max_new_tokens"} -> {"translation"}
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import torch
from flask import Flask, jsonify, request
from transformers import AutoModelForCausalLM, AutoTokenizer

from hymt_serve.request.languages import lookup
from hymt_serve.request.prompts import build_prompt


def create_app(model_path: str) -> Flask:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only for smoke tests
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    model.eval()
    lock = threading.Lock()
    app = Flask(__name__)

    @app.post("/translate")
    def translate() -> Any:
        body = request.get_json(force=True)
        source, target = lookup(body.get("src_lang") or ""), lookup(body["tgt_lang"])
        assert target is not None
        prompt, _ = build_prompt(body["text"], source, target)
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(rendered, add_special_tokens=False, return_tensors="pt").to(device)
        n = int(body.get("max_new_tokens", 256))
        with lock, torch.inference_mode():
            out = model.generate(
                **ids,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[0, ids["input_ids"].shape[1] :]
        return jsonify(
            translation=tokenizer.decode(new, skip_special_tokens=True),
            output_tokens=int(new.shape[0]),
            input_tokens=int(ids["input_ids"].shape[1]),
        )

    @app.get("/health")
    def health() -> Any:
        return jsonify(status="ok")

    return app


if __name__ == "__main__":
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    create_app(args.model_path).run(host="127.0.0.1", port=args.port, threaded=True)
