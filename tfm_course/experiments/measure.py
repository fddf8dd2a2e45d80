"""What one call costs: wall-clock time, memory (saved for backward, peak, live tensors), FLOPs.

    seconds = time_fn(lambda: model(x))            # median of 5 runs after a warm-up, GPU synchronised
    saved = saved_tensor_bytes(lambda: model(x))   # activations autograd keeps for backward
    flops = count_flops(lambda: model(x))          # matmul-type FLOPs, a multiply-add counts 2

How a cost grows with the sequence length (sweeps, log-log slopes, crossovers) is in
:mod:`tfm_course.experiments.scaling`.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work so that wall-clock timings mean something (no-op on CPU).

    A GPU runs what Python queues *later*: without this wait a timer measures only the queueing.
    ``device=None`` waits for the current CUDA device whenever CUDA has been used in this process
    (and for Apple's MPS when it is available), so a timing cannot forget it.
    """
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            torch.mps.synchronize()
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_fn(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1,
            device: torch.device | str | None = None, max_seconds: float | None = None,
            stat: str = "median") -> float:
    """Median (or, with ``stat="min"``, fastest) wall-clock seconds of ``fn()`` over ``repeats``
    runs after ``warmup`` untimed runs.

    ``max_seconds`` stops repeating once that much time has been spent (at least one run counts).
    The fastest run is the steadier statistic on a busy machine: other programs only ever add time.
    Every run ends with :func:`synchronize` (``device=None``: any CUDA device in use), so a GPU's
    queued work is inside the timing.
    """
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
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
    return min(times) if stat == "min" else statistics.median(times)


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


# --------------------------------------------------------------------------- memory on any device
class _LiveTensorBytes(TorchDispatchMode):
    """Follows every storage an op creates: adds its bytes, subtracts them when it is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        existing = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                    if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()  # one Python object per live storage
            key = id(storage)
            if key in existing or key in self._sizes:  # a view / in-place result: no new memory
                continue
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out


def peak_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes of tensors created by ``fn()`` and alive at the same time, on any device.

    Every op's new output storage is counted until Python frees it (views and in-place results
    share memory and are not counted again). Buffers a fused kernel allocates internally and frees
    before returning are invisible, and allocator caching/fragmentation is not included, so this is
    a lower bound on the process's real peak — but unlike RSS it is exact and repeatable. It works
    on CUDA tensors too (the same count, so CPU and GPU runs compare); on CUDA,
    :func:`cuda_peak_bytes` asks the allocator itself and also sees the kernels' workspaces.
    """
    tracker = _LiveTensorBytes()
    with tracker:
        fn()
    return tracker.peak


# --------------------------------------------------------------------------- FLOPs
def count_flops(fn: Callable[[], Any]) -> int:
    """Matmul-type FLOPs of ``fn()`` (a multiply–add counts 2), as ``FlopCounterMode`` sees them.

    ``F.scaled_dot_product_attention`` runs under the MATH backend here: FlopCounterMode counts
    0 FLOPs for the default CPU flash kernel. Only matmul / convolution / attention ops are
    counted: element-wise work (softmax, an element-wise scan such as Mamba's) counts nothing, and
    a causal mask does not reduce the count.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3

    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        fn()
    return counter.get_total_flops()
