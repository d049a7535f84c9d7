"""Model folders that ship only ``hy.tiktoken`` and remote tokenizer code load without running
it, and tokenise exactly like that code would (tiktoken with the family's pattern, after NFC)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.checkpoints.tiktoken_folder import PATTERN, RANKS_FILE, read_ranks
from hymt_serve.engine.codec import TokenCodec, encode_user_turn, read_tokenizer
from hymt_serve.ops.tiny_model import build_fallback_tokenizer, write_tiktoken_tokenizer

SAMPLES = [
    "Hello, world 12345!",
    "你好，世界。日本語、ひらがな カタカナ",
    "e\u0301 cafe\u0301 Å",  # NFC composes these, as the remote code does before encoding
    "  spaces\n\nnew  lines\t end\r\n",
    "<|eos|> <|extra_0|> are text here 🙂 ١٢٣",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's fallback tokenizer written in the remote-code shape."""
    out = tmp_path_factory.mktemp("tiktoken-folder")
    write_tiktoken_tokenizer(build_fallback_tokenizer(), out)
    return out


@pytest.fixture(scope="module")
def reference(folder: Path) -> tiktoken.Encoding:
    """What the remote HYTokenizer builds from the folder: a tiktoken encoding."""
    ranks = read_ranks(folder / RANKS_FILE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    specials = {v["content"]: int(k) for k, v in config["added_tokens_decoder"].items()}
    return tiktoken.Encoding("hy", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def test_the_folder_has_the_remote_code_shape(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "HYTokenizer" and "auto_map" in config
    assert not (folder / "tokenizer.json").exists()
    assert "raise RuntimeError" in (folder / "tokenization_hy.py").read_text()


def test_it_loads_without_remote_code_and_encodes_like_tiktoken(
    folder: Path, reference: tiktoken.Encoding
) -> None:
    tokenizer = read_tokenizer(folder)  # the remote code raises if it ever runs
    for text in SAMPLES:
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert ids == reference.encode_ordinary(unicodedata.normalize("NFC", text))
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    codec = TokenCodec(tokenizer)
    assert codec.stop_ids == {reference.encode_single_token("<|eos|>")}
    turn = encode_user_turn(tokenizer, "<|eos|>")  # user text is never a control token
    assert reference.encode_single_token("<|eos|>") not in turn[1:-1]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_any_text_encodes_like_tiktoken(
    folder: Path, reference: tiktoken.Encoding, text: str
) -> None:
    tokenizer = read_tokenizer(folder)
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ids == reference.encode_ordinary(unicodedata.normalize("NFC", text))


def test_the_real_vocabulary_gives_the_official_ids(
    shared_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The 7B-family vocabulary in the tiktoken shape encodes like the official tokenizer.json
    (exactly, for text that NFC leaves alone; like it on the NFC form otherwise)."""
    official = read_tokenizer(shared_tokenizer_dir)
    write_tiktoken_tokenizer(official, tmp_path)
    tokenizer = read_tokenizer(tmp_path)
    cases = json.loads((shared_tokenizer_dir / "token_vectors.json").read_text())["cases"]
    for case in cases:
        text = case["rendered"]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if unicodedata.normalize("NFC", text) == text:
            assert ids == case["tokens"]
        nfc = unicodedata.normalize("NFC", text)
        assert ids == official(nfc, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|eos|>") == 127960


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        (RANKS_FILE, "not base64!! 0\n", "line 1"),
        (RANKS_FILE, "\n", "no BPE ranks"),
        ("tokenizer_config.json", "{", "not valid JSON"),
        ("tokenizer_config.json", '{"added_tokens_decoder": {"5": "<|eos|>"}}', "do not follow"),
    ],
)
def test_broken_folders_are_configuration_errors(
    folder: Path, tmp_path: Path, name: str, content: str, match: str
) -> None:
    for path in folder.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigurationError, match=match):
        read_tokenizer(tmp_path)


def test_a_tiny_model_in_that_shape_serves(tmp_path: Path) -> None:
    from hymt_serve.core.settings import Settings
    from hymt_serve.core.types import GenerationRow
    from hymt_serve.engine.engine import load_engine
    from hymt_serve.ops.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", None, tokenizer_format="tiktoken")
    engine = load_engine(Settings.from_mapping({"model_path": str(model)}, environ={}))
    try:
        ids = engine.encode_prompt("Hello")
        assert ids[0] == engine.codec.tokenizer.convert_tokens_to_ids("<|startoftext|>")
        [result] = engine.generate([GenerationRow(tuple(ids), 4, None)])
        assert 1 <= result.output_tokens <= 4
    finally:
        engine.close()


def test_a_tokenizer_json_beside_a_remote_code_config_loads_without_it(tmp_path: Path) -> None:
    """Some repositories ship tokenizer.json and still name HYTokenizer with an auto_map:
    transformers would ask to run that code; the folder loads as a plain fast tokenizer."""
    fallback = build_fallback_tokenizer()
    fallback.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "HYTokenizer"
    config["auto_map"] = {"AutoTokenizer": ["tokenization_hy.HYTokenizer", None]}
    config_path.write_text(json.dumps(config))
    (tmp_path / "tokenization_hy.py").write_text("raise RuntimeError('remote code ran')\n")
    tokenizer = read_tokenizer(tmp_path)
    assert tokenizer("Hello")["input_ids"] == fallback("Hello")["input_ids"]
    assert tokenizer.chat_template == fallback.chat_template
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ConfigurationError, match=r"neither tokenizer\.json nor hy\.tiktoken"):
        read_tokenizer(tmp_path)
