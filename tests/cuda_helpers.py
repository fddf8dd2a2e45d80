"""``@needs_cuda``: a test that runs on real CUDA hardware (``pytest -m gpu``, tools/gpu_check.py)
and is skipped where there is none (CI, laptops)."""

from __future__ import annotations

from typing import Callable, TypeVar

import pytest
import torch

F = TypeVar("F", bound=Callable)

_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def needs_cuda(test: F) -> F:
    """Mark ``test`` as a GPU test (``-m gpu`` selects it) and skip it without CUDA."""
    return pytest.mark.gpu(_skip_without_cuda(test))
