"""Model folders that ship their tokenizer as ``hy.tiktoken`` with remote code
(``tokenizer_class: HYTokenizer``, ``auto_map`` to ``tokenization_hy.py``) instead of a
``tokenizer.json``: older and some quantized repositories of the family.

Their tokenizer is read without running that code: the BPE ranks (one ``base64-token rank``
line each; the remote code numbers unique tokens in file order) become a fast tokenizer with
transformers' ``TikTokenConverter`` and the remote code's pre-tokenizer pattern (one digit per
token), special tokens numbered after the ranks as the remote code numbers them, the remote
code's NFC normalisation, and the chat template and special-token roles from
``tokenizer_config.json`` (or ``chat_template.jinja``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from hymt_serve.core.errors import ConfigurationError

RANKS_FILE = "hy.tiktoken"
# The remote code's split pattern: like cl100k's, but digits one at a time.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The remote code's special tokens, numbered from the first id after the ranks.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|startoftext|>",
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    *(f"<|extra_{i}|>" for i in range(205)),
)


def has_tiktoken_only(folder: Path) -> bool:
    """Whether ``folder`` has ``hy.tiktoken`` and no ``tokenizer.json``."""
    return (folder / RANKS_FILE).is_file() and not (folder / "tokenizer.json").is_file()


def names_remote_tokenizer(folder: Path) -> bool:
    """Whether the folder's ``tokenizer_config.json`` maps AutoTokenizer to remote code."""
    try:
        auto_map = _tokenizer_config(folder).get("auto_map")
    except ConfigurationError:
        return False  # the loader that reads it reports what is wrong
    return isinstance(auto_map, dict) and "AutoTokenizer" in auto_map


def read_ranks(path: Path) -> dict[bytes, int]:
    """The BPE ranks of a ``hy.tiktoken`` file, numbered as the remote code numbers them."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token = base64.b64decode(line.split()[0], validate=True)
        except (ValueError, IndexError) as error:
            raise ConfigurationError(f"{path}: line {number} is not 'base64-token rank'") from error
        ranks.setdefault(token, len(ranks))
    if not ranks:
        raise ConfigurationError(f"{path} holds no BPE ranks")
    return ranks


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    """Write ``ranks`` in the ``hy.tiktoken`` format (the order of their ranks)."""
    lines = (f"{base64.b64encode(token).decode()} {rank}" for token, rank in _by_rank(ranks))
    path.write_text("\n".join(lines) + "\n")


def _by_rank(ranks: dict[bytes, int]) -> list[tuple[bytes, int]]:
    return sorted(ranks.items(), key=lambda item: item[1])


class _Converter(TikTokenConverter):
    """The converter, given ranks already read: its "vocab file" is the ranks themselves (it
    hands its vocab_file to this loader, which would otherwise need the tiktoken package)."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: Any) -> dict[bytes, int]:
        assert isinstance(tiktoken_url, dict)
        return tiktoken_url


def load_tiktoken_folder(folder: Path) -> Any:
    """A fast tokenizer equivalent to the folder's remote ``HYTokenizer`` (no code run)."""
    ranks = read_ranks(folder / RANKS_FILE)
    config = _tokenizer_config(folder)
    special = _special_tokens(config, len(ranks))
    converter = _Converter(vocab_file=ranks, pattern=PATTERN, extra_special_tokens=special)
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    roles = {
        role: _content(config[role])
        for role in ("bos_token", "eos_token", "pad_token", "unk_token")
        if config.get(role)
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=template,
        model_max_length=config.get("model_max_length", 32768),
        **roles,
    )


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError as error:
        raise ConfigurationError(f"{path} is not valid JSON") from error
    if not isinstance(config, dict):
        raise ConfigurationError(f"{path} does not hold a JSON object")
    return config


def _special_tokens(config: dict[str, Any], first_id: int) -> list[str]:
    """The special tokens in id order from ``first_id``: the config's ``added_tokens_decoder``
    where it lists them, else the remote code's list."""
    listed = config.get("added_tokens_decoder")
    if not isinstance(listed, dict) or not listed:
        return list(SPECIAL_TOKENS)
    by_id = {int(key): _content(value) for key, value in listed.items()}
    expected = list(range(first_id, first_id + len(by_id)))
    if sorted(by_id) != expected:
        raise ConfigurationError(
            "tokenizer_config.json's added tokens do not follow the BPE ranks "
            f"(ids {min(by_id)}..{max(by_id)}, ranks end at {first_id})"
        )
    return [by_id[i] for i in expected]


def _content(token: Any) -> str:
    """A special token's text: a string, or an added-token object's ``content``."""
    return str(token["content"] if isinstance(token, dict) else token)
