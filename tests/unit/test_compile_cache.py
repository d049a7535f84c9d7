"""The compile cache (hymt_serve.engine.compile_cache): its key changes with each input and
only then, a folder whose manifest differs is never used, concurrent builders share one folder
without corrupting it, old folders are pruned, and a second start reuses inductor's compiled
graphs (on the CPU, with gcc, in two fresh processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.engine import compile_cache as cc
from hymt_serve.engine.runners.build import _compile_cache
from hymt_serve.ops.operate import compile_cache_line

REPO = Path(__file__).resolve().parents[2]
HANDLER = REPO / "handler"


def inputs(**changes: dict[str, Any]) -> dict[str, Any]:
    parts: dict[str, dict[str, Any]] = {
        "model": {"config_sha256": "a" * 64, "weights": {"model.safetensors": {"bytes": 10}}},
        "card": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},
        "precision": {"dtype": "bfloat16", "quantization": "none", "quantize_lm_head": False},
        "engine": {"max_batch_rows": 128, "max_seq_len": 1536, "mixed_step_tokens": 256},
        "code": {"hymt_serve": "0.1.0", "engine_sources": "b" * 64, "torch": "2.11.0"},
    }
    for section, values in changes.items():
        parts[section] = {**parts[section], **values}
    return cc.key_inputs(**parts)


@pytest.mark.parametrize(
    "changes",
    [
        {"model": {"config_sha256": "c" * 64}},
        {"model": {"weights": {"model.safetensors": {"bytes": 11}}}},
        {"card": {"name": "NVIDIA A10"}},
        {"card": {"capability": [8, 6]}},
        {"precision": {"quantization": "fp8"}},
        {"precision": {"quantize_lm_head": True}},
        {"precision": {"dtype": "float16"}},
        {"engine": {"max_batch_rows": 64}},
        {"engine": {"max_seq_len": 2048}},
        {"engine": {"mixed_step_tokens": 0}},
        {"code": {"engine_sources": "d" * 64}},
        {"code": {"torch": "2.13.0"}},
        {"code": {"hymt_serve": "0.2.0"}},
    ],
)
def test_the_key_changes_with_each_input(changes: dict[str, Any]) -> None:
    assert cc.cache_key(inputs(**changes)) != cc.cache_key(inputs())


def test_the_key_is_the_same_for_the_same_inputs_in_any_order() -> None:
    shuffled = dict(reversed(list(inputs().items())))
    assert cc.cache_key(shuffled) == cc.cache_key(inputs())
    assert cc.cache_key(inputs()) == cc.cache_key(inputs())


def write_safetensors(path: Path, header: dict[str, Any], payload: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + payload)


def test_the_model_identity_follows_config_and_shapes_not_values_or_times(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    header = {"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}
    write_safetensors(tmp_path / "model.safetensors", header, b"\0" * 8)
    (tmp_path / "tokenizer.json").write_text("{}")  # not something compiling sees
    first = cc.model_identity(tmp_path)
    assert list(first["weights"]) == ["model.safetensors"]

    write_safetensors(tmp_path / "model.safetensors", header, b"\1" * 8)  # other values
    os.utime(tmp_path / "model.safetensors", (1, 1))  # a copied folder: other times
    (tmp_path / "tokenizer.json").write_text('{"x": 1}')
    assert cc.model_identity(tmp_path) == first

    header["w"]["dtype"] = "F16"  # same size, another dtype
    write_safetensors(tmp_path / "model.safetensors", header, b"\1" * 8)
    assert cc.model_identity(tmp_path) != first
    write_safetensors(tmp_path / "model.safetensors", {**header, "w": {**header["w"]}}, b"\1" * 8)
    (tmp_path / "config.json").write_text('{"hidden_size": 128}')
    assert cc.model_identity(tmp_path)["config_sha256"] != first["config_sha256"]


def test_the_source_hash_follows_the_engine_s_code(tmp_path: Path) -> None:
    (tmp_path / "runners").mkdir()
    (tmp_path / "runners" / "fast.py").write_text("x = 1\n")
    before = cc.source_hash(tmp_path)
    assert cc.source_hash(tmp_path) == before
    (tmp_path / "runners" / "fast.py").write_text("x = 2\n")
    assert cc.source_hash(tmp_path) != before
    assert cc.source_hash() == cc.source_hash()  # the real package: stable within a run


def test_a_new_folder_is_not_reused_until_a_build_finishes_on_it(tmp_path: Path) -> None:
    first = cc.open_cache(tmp_path, inputs())
    assert (first.reused, first.dir.parent) == (False, tmp_path)
    assert "no cache" in str(first.why_not)
    assert json.loads((first.dir / cc.MANIFEST).read_text()) == inputs()
    again = cc.open_cache(tmp_path, inputs())  # a build stopped before it finished
    assert (again.dir, again.reused) == (first.dir, False)
    assert "incomplete" in str(again.why_not)
    again.apply(environ={})
    again.finish()
    reused = cc.open_cache(tmp_path, inputs())
    assert (reused.dir, reused.reused, reused.why_not) == (first.dir, True, None)


def test_a_folder_whose_manifest_differs_is_not_used(tmp_path: Path) -> None:
    opened = cc.open_cache(tmp_path, inputs())
    opened.finish()
    (opened.dir / "inductor").mkdir()
    (opened.dir / "inductor" / "entry").write_text("from another model")
    manifest = json.loads((opened.dir / cc.MANIFEST).read_text())
    manifest["card"]["name"] = "NVIDIA A10"  # e.g. a folder copied from another machine
    (opened.dir / cc.MANIFEST).write_text(json.dumps(manifest))
    again = cc.open_cache(tmp_path, inputs())
    assert again.reused is False
    assert "differs (card)" in str(again.why_not)
    assert not (again.dir / "inductor" / "entry").exists()  # nothing of it is left
    assert json.loads((again.dir / cc.MANIFEST).read_text()) == inputs()
    (again.dir / cc.MANIFEST).write_text("{not json")
    third = cc.open_cache(tmp_path, inputs())
    assert (third.reused, "no readable manifest" in str(third.why_not)) == (False, True)


def test_folders_beyond_the_bound_are_pruned_least_recently_used_first(tmp_path: Path) -> None:
    made = []
    for rows in range(5):
        opened = cc.open_cache(tmp_path, inputs(engine={"max_batch_rows": rows}), keep=3)
        os.utime(opened.dir, (1000 + rows, 1000 + rows))
        made.append(opened.dir)
    kept = sorted(p for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert kept == sorted(made[-3:])


def test_apply_points_inductor_and_triton_into_the_folder(tmp_path: Path) -> None:
    opened = cc.open_cache(tmp_path, inputs())
    environ: dict[str, str] = {}
    opened.apply(environ)
    assert environ == {
        "TORCHINDUCTOR_CACHE_DIR": str(opened.dir / "inductor"),
        "TRITON_CACHE_DIR": str(opened.dir / "triton"),
    }


BUILDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from hymt_serve.engine import compile_cache as cc
    root, start = Path(sys.argv[1]), float(sys.argv[2])
    while time.time() < start:
        pass
    for n in range(40):
        opened = cc.open_cache(root, {"n": n % 4, "layout": 1})
        (opened.dir / "inductor").mkdir(exist_ok=True)
        (opened.dir / "inductor" / f"{n}.{sys.argv[3]}").write_text("entry")
        opened.apply(environ={})
        opened.finish()
    """
)


def test_two_builders_at_once_share_folders_without_corrupting_them(tmp_path: Path) -> None:
    environ = {**os.environ, "PYTHONPATH": str(HANDLER)}
    start = str(time.time() + 2)  # both begin at once, past their imports
    command = [sys.executable, "-c", BUILDER, str(tmp_path), start]
    builders = [
        subprocess.Popen([*command, name], env=environ, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    for builder in builders:
        _, errors = builder.communicate(timeout=120)
        assert builder.returncode == 0, errors
    folders = sorted(tmp_path.iterdir())
    assert [p.name for p in folders] == sorted(
        cc.cache_key({"n": n, "layout": 1}) for n in range(4)
    )  # one per key, no temporary folder left
    for folder in folders:
        manifest = json.loads((folder / cc.MANIFEST).read_text())
        assert folder.name == cc.cache_key(manifest)
        json.loads((folder / cc.COMPLETE).read_text())
        assert len(list((folder / "inductor").iterdir())) == 20  # both builders' entries


def test_the_root_follows_the_setting_the_environment_and_the_work_folder(tmp_path: Path) -> None:
    work = {"HYMT_WORK_DIR": str(tmp_path)}
    assert cc.resolve_root("auto", work) == tmp_path / "compile-cache"
    assert cc.resolve_root("off", work) is None
    assert cc.resolve_root("/cache", work) == Path("/cache")
    assert cc.resolve_root("kept", work) == tmp_path / "kept"
    assert cc.resolve_root("auto", {**work, cc.DIR_ENV: "/volume"}) == Path("/volume")
    assert cc.resolve_root("/cache", {**work, cc.DIR_ENV: "off"}) is None
    home = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cc.resolve_root("auto", home) == tmp_path / "xdg" / "hymt" / "compile-cache"


def test_the_build_reports_why_no_cache_is_used(tmp_path: Path) -> None:
    def unwritable() -> cc.CompileCache:
        raise PermissionError("read-only file system")

    assert _compile_cache(None, graphs=True)[1]["why_not"] == "compile_cache_dir is off"
    assert _compile_cache(lambda: None, graphs=True)[1]["why_not"] == "compile_cache_dir is off"
    assert "read-only" in _compile_cache(unwritable, graphs=True)[1]["why_not"]
    assert "nothing compiles" in _compile_cache(lambda: None, graphs=False)[1]["why_not"]


def test_hymt_start_s_line_says_what_was_reused() -> None:
    def described(cache: dict[str, Any]) -> dict[str, Any]:
        return {"engine": {"engine": "fast", "fast": {"compile_cache": cache}}}

    reused = {"dir": "/w/compile-cache/k", "reused": True, "why_not": None, "fx_graph_hits": 6,
              "fx_graph_misses": 0, "files_added": 0}  # fmt: skip
    assert compile_cache_line("mt", described(reused)) == (
        "mt: compile cache reused in /w/compile-cache/k (6 graphs from the cache, 0 compiled; "
        "0 files added)"
    )
    cold = {"dir": "/w/c/k", "reused": False, "why_not": "no cache for this model, card, "
            "precision and code yet"}  # fmt: skip
    assert compile_cache_line("mt", described(cold)) == (
        "mt: compile cache not reused in /w/c/k: no cache for this model, card, precision and "
        "code yet"
    )
    hf = {"engine": {"engine": "hf", "fallback_reason": "auto: no CUDA device"}}
    assert compile_cache_line("mt", hf) == (
        "mt: compile cache: none (its engine is not the fast engine)"
    )
    assert compile_cache_line("mt", {}) == "mt: compile cache: none (unknown)"


def run_child(root: Path, elsewhere: Path) -> dict[str, Any]:
    """The child's report; torch's caches are pointed at ``elsewhere`` (a fresh folder each
    time) in its environment, so only the compile cache's own folder can give a hit."""
    environ = {
        **os.environ,
        "PYTHONPATH": str(HANDLER),
        "TORCHINDUCTOR_CACHE_DIR": str(elsewhere / "inductor"),
        "TRITON_CACHE_DIR": str(elsewhere / "triton"),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "tests/compile_cache_child.py"), str(root)],
        env=environ, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_second_start_reuses_inductor_s_compiled_graphs(tmp_path: Path) -> None:
    """Two fresh processes compile the tiny model's steps with inductor on the CPU in the same
    cache: the first compiles every graph, the second takes every one from the cache."""
    cold = run_child(tmp_path / "root", tmp_path / "first")
    assert (cold["reused"], cold["fx_graph_hits"]) == (False, 0)
    assert cold["fx_graph_misses"] > 0 and cold["files_added"] > 0
    warm = run_child(tmp_path / "root", tmp_path / "second")
    assert (warm["reused"], warm["dir"]) == (True, cold["dir"])
    assert warm["fx_graph_hits"] == cold["fx_graph_misses"]
    assert (warm["fx_graph_misses"], warm["files_added"]) == (0, 0)
