"""``@needs_cuda``: a test that runs on real CUDA hardware (``pytest -m gpu``, tools/gpu_check.py)
and is skipped where there is none (CI, laptops)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

import pytest
import torch

F = TypeVar("F", bound=Callable)

_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def needs_cuda(test: F) -> F:
    """Mark ``test`` as a GPU test (``-m gpu`` selects it) and skip it without CUDA."""
    return pytest.mark.gpu(_skip_without_cuda(test))


@contextlib.contextmanager
def fp32_matmuls() -> Iterator[None]:
    """Full fp32 matmuls inside the block. On Ampere and newer, PyTorch may compute fp32 matmuls in
    TF32 (10-bit mantissa, errors ~1e-3) once anything sets ``set_float32_matmul_precision("high")``
    or ``allow_tf32``; a parity test with fp32 tolerances must not depend on that global switch."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
