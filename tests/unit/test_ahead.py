"""Compiling the weight-only kernels ahead (hymt_serve.engine.kernels.ahead) without a GPU: what a
plan records (Triton's real kernels, never launched: a launch would fail here), and the
bookkeeping around the threads. On the GPU: tests/gpu/test_weight_only_gpu.py."""

from __future__ import annotations

import importlib.util
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from hymt_serve.engine.kernels import ahead, weight_only
from hymt_serve.engine.kernels.quantized import QUANTIZERS

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton")


@needs_triton
def test_a_plan_records_one_launch_per_compile_and_runs_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)  # the kernels' path
    torch.manual_seed(0)
    weights = {form: QUANTIZERS[form](torch.randn(256, 512)) for form in ("int8", "int4")}

    def plan() -> None:
        for q, scale in weights.values():
            for rows in weight_only.ROW_CLASSES:
                weight_only.linear(torch.zeros(rows, 512, dtype=torch.float16), q, scale)

    launches = ahead.record(plan)
    names = Counter(kernel.fn.__name__ for kernel, *_ in launches)
    # int8: one row and 2-16 rows share the tiles (16 by 64 by 256), then 32, 64, 128-row
    # tiles; int4: its fp16 one row, 16 rows, 32 and 64 deep, the tall tiles, the sum over
    # splits, and the widening above 256 rows
    assert names == {
        "weight_only_kernel": 8, "one_row_kernel": 1, "sum_splits_kernel": 1,
        "widen_int4_kernel": 1,
    }  # fmt: skip
    tiles = sorted(
        (kwargs["KIND"], kwargs["BLOCK_M"])
        for kernel, _, _, kwargs in launches
        if kernel.fn.__name__ == "weight_only_kernel"
    )
    assert tiles == [(0, 16), (0, 32), (0, 64), (0, 128), (2, 16), (2, 32), (2, 64), (2, 128)]
    # the plan's buffers are not kept: aligned tensors go to Triton's warmup as their dtypes
    assert not any(isinstance(a, torch.Tensor) for _, _, args, _ in launches for a in args)


@needs_triton
def test_the_rows_and_alignment_make_a_compile_only_where_triton_specialises() -> None:
    from hymt_serve.engine.kernels import weight_only_triton as kernels

    kernel = kernels.sum_splits_kernel  # (parts, out, SIZE, SPLITS: not specialised)
    parts, out = torch.zeros(4, 64), torch.zeros(64, dtype=torch.bfloat16)
    key = ahead.spec_key(kernel, (parts, out, 64, 4), {"BLOCK": 1024})
    assert ahead.spec_key(kernel, (parts, out, 64, 16), {"BLOCK": 1024}) == key  # SPLITS
    assert ahead.spec_key(kernel, (parts, out, 48, 4), {"BLOCK": 1024}) == key  # 16 | both
    assert ahead.spec_key(kernel, (parts, out, 65, 4), {"BLOCK": 1024}) != key
    assert ahead.spec_key(kernel, (parts, out[1:], 64, 4), {"BLOCK": 1024}) != key  # aligned
    assert ahead.spec_key(kernel, (parts, out.half(), 64, 4), {"BLOCK": 1024}) != key
    assert ahead.spec_key(kernel, (parts, out, 64, 4), {"BLOCK": 512}) != key


def test_nothing_compiles_ahead_off_cuda() -> None:
    planned = []
    with ahead.compile_ahead(lambda: planned.append(1), torch.device("cpu")) as kernels:
        assert kernels == 0
    assert planned == [] and ahead._pending == []


def test_a_plan_inside_a_plan_is_refused() -> None:
    with pytest.raises(RuntimeError, match="already recording"):
        ahead.record(lambda: ahead.record(lambda: None) and None)
    assert ahead._recording is None


def test_a_kernel_that_failed_to_compile_ahead_is_logged_and_not_waited_for_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed: Future[None] = Future()
    failed.set_exception(RuntimeError("ptxas died"))
    done: Future[None] = Future()
    done.set_result(None)
    ahead._pending.extend([failed, done])
    with caplog.at_level(logging.WARNING, logger="hymt_serve.engine.kernels.ahead"):
        ahead.wait_ahead()
    assert ahead._pending == []
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [failed.exception()]


def test_the_first_launch_waits_for_the_threads_and_the_wait_is_added_up() -> None:
    launched = []

    class Kernel:  # kernel[grid](*args): what Triton's kernels take
        def __getitem__(self, grid: tuple[int]) -> Callable[..., None]:
            return lambda *args: launched.append((grid, args))

    with ThreadPoolExecutor(1) as pool, ahead.compile_ahead(lambda: None, torch.device("cpu")):
        assert ahead.waited_s == 0.0  # (reset as compiling ahead begins)
        ahead._pending.append(pool.submit(time.sleep, 0.2))
        ahead.run(Kernel(), (3,), "x")
        waited = ahead.waited_s
        ahead.run(Kernel(), (4,), "y")  # nothing more to wait for
    assert launched == [((3,), ("x",)), ((4,), ("y",))]
    assert 0.15 < waited == ahead.waited_s < 5 and ahead._pending == []


def test_a_failing_plan_costs_the_compiles_ahead_not_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def plan() -> None:
        raise ValueError("a weight the plan does not know")

    logger = "hymt_serve.engine.kernels.ahead"
    with (
        caplog.at_level(logging.ERROR, logger),
        ahead.compile_ahead(plan, torch.device("cuda")) as n,
    ):
        assert n == 0
    assert "the plan failed" in caplog.text and ahead._recording is None


@needs_triton
@pytest.mark.parametrize("form", ["int8", "int4"])
def test_the_engines_plan_covers_every_launch_its_steps_make(
    form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastRunner's plan against the launches of real generation, the head quantized too:
    four rows prefill together, then rows of 50, 100 and 300 tokens join the running batch
    in mixed steps, and the batch decodes at 1-4 rows. Every launch the steps make is one
    the plan compiled, so none compiles at its launch on the GPU."""
    from runner_helpers import generate
    from test_fast_engine import tiny_model

    from hymt_serve.core.types import GenerationRow
    from hymt_serve.engine.runners.build import build_fast_runner

    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)  # the kernels' path
    monkeypatch.setattr(weight_only, "bf16_pairs", lambda x: x.dtype == torch.bfloat16)
    model = tiny_model(hidden_size=256, intermediate_size=512, head_dim=64)
    runner = build_fast_runner(
        model.to(torch.bfloat16), max_batch_size=4, max_seq_len=400, quantize=form,
        quantize_head=True,
    )  # fmt: skip
    plan = ahead.record(runner._weight_only_launches)
    planned = {ahead.spec_key(kernel, args, kwargs) for kernel, _, args, kwargs in plan}
    lengths = [(5, 9), (10, 4), (7, 12), (3, 15), (50, 3), (100, 6), (300, 2), (1, 2)]
    rows = [GenerationRow(tuple(range(3, 3 + n)), new) for n, new in lengths]
    launches = ahead.record(lambda: generate(runner, rows))  # (the outputs: empty tensors)
    # the steps take every class of rows: the tiles of 16 (one row of int8 included), 32, 64
    # and 128 rows; int4 also its own one row, the sum over its splits and the widening
    tiles = {(kernel.fn.__name__, kwargs.get("BLOCK_M")) for kernel, _, _, kwargs in launches}
    assert {("weight_only_kernel", m) for m in (16, 32, 64, 128)} <= tiles
    int4 = {("int4_chain_kernel", None), ("sum_splits_kernel", None), ("widen_int4_kernel", None)}
    assert int4 <= tiles if form == "int4" else not int4 & tiles
    missed = [
        (kernel.fn.__name__, kwargs) for kernel, _, args, kwargs in launches
        if ahead.spec_key(kernel, args, kwargs) not in planned
    ]  # fmt: skip
    assert missed == []
