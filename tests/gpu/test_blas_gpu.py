"""``blas_library``: the dense products of the engine's process go to cuBLAS or cuBLASLt
(GPU only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hymt_serve.core.settings import Settings
from hymt_serve.engine.checkpoints.loading import load_model
from hymt_serve.ops.tiny_model import build_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def restore_blas() -> Iterator[None]:
    before = torch.backends.cuda.preferred_blas_library()
    yield
    torch.backends.cuda.preferred_blas_library(before)


@pytest.mark.parametrize("rows", [1, 64, 300])
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336)])  # qkv, down
def test_cublaslt_products_match_cublas(
    rows: int, shape: tuple[int, int], restore_blas: None
) -> None:
    torch.manual_seed(rows)
    x = torch.randn(rows, shape[1], device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
    residual = torch.randn(rows, shape[0], device="cuda", dtype=torch.bfloat16)
    reference = (residual.float() + x.float() @ weight.float().T).cpu()
    results = {}
    for library in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(library)
        results[library] = (residual + F.linear(x, weight)).float().cpu()
    for library, ours in results.items():
        error = (ours - reference).norm() / reference.norm()
        assert error < 1e-2, library  # bf16 rounding of the product and of the sum


def test_load_model_sets_the_library_for_the_process(tmp_path: Path, restore_blas: None) -> None:
    folder = build_tiny_model(tmp_path / "tiny", None)
    settings = Settings.from_mapping(
        {"model_path": str(folder), "device": "cuda", "blas_library": "cublaslt"}
    )
    loaded = load_model(settings)
    assert loaded.plan.describe()["blas_library"] == "cublaslt"
    assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
