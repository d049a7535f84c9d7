"""Compiling the weight-only kernels ahead (hymt_serve.engine.ahead) without a GPU: what a
plan records (Triton's real kernels, never launched: a launch would fail here), and the
bookkeeping around the threads. On the GPU: tests/gpu/test_weight_only_gpu.py."""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from concurrent.futures import Future

import pytest
import torch

from hymt_serve.engine import ahead, weight_only
from hymt_serve.engine.quantized import QUANTIZERS

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
    from hymt_serve.engine import weight_only_kernels as kernels

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
    with caplog.at_level(logging.WARNING, logger="hymt_serve.engine.ahead"):
        ahead.wait_ahead()
    assert ahead._pending == []
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [failed.exception()]


def test_a_failing_plan_costs_the_compiles_ahead_not_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def plan() -> None:
        raise ValueError("a weight the plan does not know")

    logger = "hymt_serve.engine.ahead"
    with (
        caplog.at_level(logging.ERROR, logger),
        ahead.compile_ahead(plan, torch.device("cuda")) as n,
    ):
        assert n == 0
    assert "the plan failed" in caplog.text and ahead._recording is None
