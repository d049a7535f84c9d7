"""Build a tiny random-weight ``hunyuan_v1_dense`` model folder for demos and tests.

A set-up tool, not part of the serving path. Its translations are meaningless (random weights);
it exists so that the whole stack runs on any machine without downloads. With the real Hunyuan
7B-family tokenizer folder it tokenises exactly like Hunyuan-MT-7B; without it, a small byte-level
BPE tokenizer with the same special tokens and an equivalent chat template is trained here.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hymt_serve.core.types import TINY_MODEL_MARKER
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import build_prompt

TOKENIZER_ENV = "HYMT_TOKENIZER_DIR"
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|startoftext|>",
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    *(f"<|extra_{i}|>" for i in range(205)),
)
# Renders turns like the Hunyuan 7B template: a user turn is <|startoftext|>...<|extra_0|>.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|startoftext|>{{ m['content'] }}<|extra_4|>"
    "{% elif m['role'] == 'user' %}"
    "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}{{ m['content'] }}<|extra_0|>"
    "{% else %}<|startoftext|>{{ m['content'] }}<|extra_0|>{% endif %}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}<|eos|>{% endif %}"
    "{% endfor %}"
)
FAMILIES = ("hunyuan", "hy-mt2-moe")
TINY_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "use_qk_norm": True,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    "tie_word_embeddings": True,
}
# Hunyuan-MT-7B's shape (7.5 B parameters, 15 GB in bf16), for benchmarks with random weights:
# speed does not depend on the values of the weights.
SEVEN_B_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128167,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "use_qk_norm": True,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    "bos_token_id": 127958,
    "eos_token_id": 127960,
    "pad_token_id": 127961,
    "tie_word_embeddings": True,
}
_SAMPLE_TEXT = (
    "Hello, world. How are you today? The weather is nice. Machine translation is useful.",
    "你好，世界。今天天气很好。机器翻译很有用。我们一起去吃饭吧。",
    "こんにちは、世界。今日はいい天気ですね。",
    "안녕하세요, 세계. 오늘 날씨가 좋네요.",
    "Bonjour le monde. Il fait beau aujourd'hui.",
    "Hallo Welt. Das Wetter ist heute schön.",
    "Привет, мир. Сегодня хорошая погода.",
    "مرحبا بالعالم. الطقس جميل اليوم.",
    "שלום עולם. מזג האוויר יפה היום.",
    "Xin chào thế giới. Hôm nay trời đẹp.",
    "สวัสดีชาวโลก วันนี้อากาศดี",
    "नमस्ते दुनिया। आज मौसम अच्छा है।",
    "😀👍🌍",
)


def default_tokenizer_dir() -> Path | None:
    """The real tokenizer folder: ``$HYMT_TOKENIZER_DIR``, else ``../shared/hunyuan-tokenizer``
    beside the current folder or beside this project's checkout; None when absent."""
    candidates = [os.environ.get(TOKENIZER_ENV, "")]
    candidates += [str(Path.cwd().parent / "shared" / "hunyuan-tokenizer")]
    candidates += [str(Path(__file__).resolve().parents[4] / "shared" / "hunyuan-tokenizer")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    return None


def build_fallback_tokenizer() -> Any:
    """A small byte-level BPE tokenizer with Hunyuan's special tokens and chat template."""
    # transformers takes seconds: hymt imports this module for every command
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_byte_bpe(SPECIAL_TOKENS),
        bos_token="<|startoftext|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
    )


def train_byte_bpe(special_tokens: Sequence[str]) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on the languages' sample prompts, with
    ``special_tokens`` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # seconds

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    return tokenizer


def _training_corpus() -> list[str]:
    english, chinese = LANGUAGES["en"], LANGUAGES["zh"]
    corpus = list(_SAMPLE_TEXT)
    for language in LANGUAGES.values():
        corpus.append(build_prompt(_SAMPLE_TEXT[0], english, language)[0])
        corpus.append(build_prompt(_SAMPLE_TEXT[1], chinese, language)[0])
    return corpus


class _AlphaIsUsed(logging.Filter):
    """Drops transformers' warning "Unrecognized keys in `rope_parameters` ... {'alpha'}": the
    family's dynamic RoPE carries ``alpha``, which transformers' own ``hunyuan_v1_dense`` reads,
    but its RoPE validator does not list it. Any other key is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(_ROPE_WARNING) and message.endswith("{'alpha'}"))


_ROPE_WARNING = "Unrecognized keys in `rope_parameters`"
_ALPHA_FILTER = _AlphaIsUsed()


def _quiet_alpha_warning() -> None:
    """Install the filter on the logger that warns (adding the same filter twice is a no-op)."""
    logging.getLogger("transformers.modeling_rope_utils").addFilter(_ALPHA_FILTER)


def random_7b_model(device: str = "cuda", seed: int = 0) -> Any:
    """The 7B-shaped ``hunyuan_v1_dense`` with random bf16 weights, built on ``device``."""
    import torch  # seconds: see build_fallback_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet_alpha_warning()
    config = AutoConfig.for_model(model_type="hunyuan_v1_dense", **SEVEN_B_SHAPE)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def mute_unprintable_tokens(model: Any, tokenizer: Any, keep: set[int]) -> None:
    """Zero the (tied) embedding rows of special tokens and of tokens that decode to no whole
    character, so that the random model's demo output is visible text, not nothing or U+FFFD."""
    import torch  # seconds: see build_fallback_tokenizer

    special = (
        set(tokenizer.all_special_ids)
        | set(tokenizer.added_tokens_decoder)
        | {
            i
            for i, token in enumerate(tokenizer.convert_ids_to_tokens(range(len(tokenizer))))
            if token.startswith("<|") and token.endswith("|>")
        }
    )
    broken = {i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])}
    rows = sorted((special | broken) - keep)
    with torch.no_grad():
        model.get_input_embeddings().weight[rows] = 0.0


def build_tiny_model(
    out_dir: Path,
    tokenizer_dir: Path | None = None,
    seed: int = 0,
    tokenizer_format: str = "json",
) -> Path:
    """Write a tiny random-weight model folder (config, safetensors, tokenizer) to ``out_dir``.

    ``tokenizer_format`` "tiktoken" writes the tokenizer the way older repositories of the
    family ship it: ``hy.tiktoken`` and a remote-code ``tokenizer_config.json``, no
    ``tokenizer.json`` (special tokens then follow the BPE ranks, as there). Hy-MT2-30B-A3B's
    form is :func:`hymt_serve.ops.tiny_moe.build_tiny_moe_model`.
    """
    import torch  # seconds: see build_fallback_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    from hymt_serve.engine.checkpoints.tiktoken_folder import load_tiktoken_folder  # seconds
    from hymt_serve.engine.codec import read_tokenizer

    tokenizer = read_tokenizer(tokenizer_dir) if tokenizer_dir else build_fallback_tokenizer()
    if tokenizer_format == "tiktoken":
        out_dir.mkdir(parents=True, exist_ok=True)
        write_tiktoken_tokenizer(tokenizer, out_dir)
        tokenizer = load_tiktoken_folder(out_dir)
    _quiet_alpha_warning()
    ids: dict[str, int] = {
        name: int(tokenizer.convert_tokens_to_ids(name))
        for name in ("<|startoftext|>", "<|eos|>", "<|pad|>")
    }
    config = AutoConfig.for_model(
        model_type="hunyuan_v1_dense",
        vocab_size=len(tokenizer),
        bos_token_id=ids["<|startoftext|>"],
        eos_token_id=ids["<|eos|>"],
        pad_token_id=ids["<|pad|>"],
        **TINY_SHAPE,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    mute_unprintable_tokens(model, tokenizer, keep={ids["<|eos|>"]})
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    if tokenizer_format != "tiktoken":
        tokenizer.save_pretrained(out_dir)
    about = {
        "random_weights": True,
        "tokenizer": str(tokenizer_dir) if tokenizer_dir else "fallback",
        "note": "random weights: its translations are meaningless; serve a real model folder",
    }
    (out_dir / TINY_MODEL_MARKER).write_text(json.dumps(about, indent=2) + "\n")
    return out_dir


# What a remote-code tokenizer folder names; the file is written so that running it would fail.
_REMOTE_CODE = "tokenization_hy.py"
_REMOTE_CODE_TEXT = (
    '"""Stands in for the remote tokenizer code of the family\'s older repositories."""\n\n'
    'raise RuntimeError("remote code ran: the folder must load without it")\n'
)


def write_tiktoken_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    """Write a byte-level BPE ``tokenizer`` as a ``hy.tiktoken`` remote-code folder: its
    ordinary tokens become ranks in id order, its added tokens follow them in id order."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # seconds, as above

    from hymt_serve.engine.checkpoints.tiktoken_folder import RANKS_FILE, write_ranks  # seconds

    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    added = dict(sorted(tokenizer.added_tokens_decoder.items()))
    ordinary = sorted(
        (index, token) for token, index in tokenizer.get_vocab().items() if index not in added
    )
    ranks = {bytes(to_byte[c] for c in token): rank for rank, (_, token) in enumerate(ordinary)}
    write_ranks(out_dir / RANKS_FILE, ranks)
    specials = {
        str(len(ranks) + i): {"content": token.content, "special": True}
        for i, token in enumerate(added.values())
    }
    config = {
        "tokenizer_class": "HYTokenizer",
        "auto_map": {"AutoTokenizer": [f"{_REMOTE_CODE[:-3]}.HYTokenizer", None]},
        "bos_token": "<|startoftext|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "added_tokens_decoder": specials,
        "chat_template": tokenizer.chat_template,
        "model_max_length": 32768,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    (out_dir / _REMOTE_CODE).write_text(_REMOTE_CODE_TEXT)
