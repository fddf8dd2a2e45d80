"""Timing, memory and FLOP-counting helpers shared by the chapters' measurements."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work so that wall-clock timings mean something (no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1,
            device: torch.device | str | None = None, max_seconds: float | None = None) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed runs.

    ``max_seconds`` stops repeating once that much time has been spent (at least one run counts).
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
        spent += times[-1]
        if max_seconds is not None and spent > max_seconds:
            break
    return statistics.median(times)


def saved_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Bytes of the distinct tensors autograd saves for the backward pass while running ``fn()``.

    This is the activation memory a training step must hold (for attention: the n × n weights),
    measured the same way on CPU and GPU. Run ``fn`` with inputs that require grad.
    """
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), t.device.index or 0)] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def cuda_peak_bytes(fn: Callable[[], Any], device: torch.device | str) -> int:
    """Peak CUDA memory allocated while running ``fn()``, above what was allocated before."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"cuda_peak_bytes needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
