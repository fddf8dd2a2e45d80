"""What one call costs: wall-clock time, memory (saved for backward, peak, live tensors), FLOPs.

    seconds = time_fn(lambda: model(x))            # median of 5 runs after a warm-up, GPU synchronised
    a, b = time_interleaved([f, g])                # fastest of 7 alternating runs each: close ratios
    saved = saved_tensor_bytes(lambda: model(x))   # activations autograd keeps for backward
    flops = count_flops(lambda: model(x))          # matmul-type FLOPs, a multiply-add counts 2
    shares = profile_breakdown(lambda: step(x))    # where the time goes: matmuls, attention, ...

How a cost grows with the sequence length (sweeps, log-log slopes, crossovers) is in
:mod:`tfm_course.experiments.scaling`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import statistics
import sys
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

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


def time_interleaved(fns: Sequence[Callable[[], Any]], repeats: int = 7, warmup: int = 1,
                     device: torch.device | str | None = None) -> list[float]:
    """Fastest wall-clock seconds of each of ``fns``, timed in alternation: round ``r`` runs
    ``fns[0]()``, ``fns[1]()``, ... once each, for ``repeats`` rounds after ``warmup`` untimed ones.

    Use it to compare functions whose times differ by a few per cent: a burst of load from other
    programs then slows every function of a round alike instead of all the runs of just one.
    Returns a list of seconds, one per function, in the order given.
    """
    if len(fns) == 0:
        raise ValueError("time_interleaved needs at least one function, got none")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns:
            fn()
    synchronize(device)
    best = [math.inf] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            synchronize(device)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


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


# --------------------------------------------------------------------------- where the time goes
BREAKDOWN = ("matrix multiplies", "attention kernel", "cross-entropy", "optimiser", "other operators",
             "Python and dispatch")
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot",
            "_addmm_activation"}
_KINDS = [  # (category, pattern of an aten op's name without "aten::", or of an autograd node)
    ("attention kernel", re.compile(r"scaled_dot_product|flash_attention|efficient_attention|"
                                    r"cudnn_attention|ScaledDotProduct\w*Backward")),
    ("cross-entropy", re.compile(r"cross_entropy|log_softmax|nll_loss|LogSoftmaxBackward|"
                                 r"NllLoss\w*Backward")),
    ("optimiser", re.compile(r"^Optimizer\.|_foreach_|adam", re.IGNORECASE)),
    ("matrix multiplies", re.compile(r"(^|\b)(Mm|Addmm|Bmm|Baddbmm|Addmv|Mv|Dot)Backward\d*$")),
]


def _kind(name: str) -> str | None:
    """The category an event's own name puts it in, or ``None``."""
    op = name.removeprefix("aten::")
    if name.startswith("aten::") and op in _MATMULS:
        return "matrix multiplies"
    return next((kind for kind, pattern in _KINDS if pattern.search(op)), None)


def _category(event: Any) -> str:
    """The category of the *outermost* categorised event around ``event`` (itself included), so
    that the ``aten::bmm`` inside a math-backend attention counts as attention, the ``aten::t``
    inside ``aten::linear`` as a matrix multiply, and everything under ``Optimizer.step`` as the
    optimiser; "other operators" when nothing around it has a category."""
    found = "other operators"
    while event is not None:
        found = _kind(event.name) or found
        event = event.cpu_parent
    return found


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 to /dev/null for the block (Python's own
    ``sys.stderr`` is flushed first and is untouched otherwise)."""
    sys.stderr.flush()
    try:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no file descriptor 2 here: nothing to silence
        yield
        return
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_breakdown(fn: Callable[[], Any], device: torch.device | str | None = None,
                      repeats: int = 3, warmup: int = 1) -> dict[str, float]:
    """Where the wall time of ``fn()`` goes: the share of each category in :data:`BREAKDOWN`,
    measured with ``torch.profiler`` over ``repeats`` runs after ``warmup`` untimed ones.

    The shares sum to 1. Each aten operator's **self** time (its own time, without the operators it
    calls) is counted once, in the category of the outermost categorised operator around it:

    * "matrix multiplies": ``aten::mm``, ``addmm``, ``bmm``, ``matmul``, ``linear`` (and
      ``baddbmm``, ``addmv``, ``mv``, ``dot``) with what runs inside them (a ``linear``'s
      transpose), and the operators of their backward nodes (``MmBackward0``: the transposes, the
      gradient's matrix multiplies, a bias gradient's sum);
    * "attention kernel": ``scaled_dot_product_attention`` and its flash / memory-efficient /
      cuDNN / math variants, forward and backward. The math variant's forward ``bmm`` and softmax
      count here, but its backward runs as the backward nodes of those operators and counts as
      matrix multiplies and other operators; attention written out of ``matmul`` and ``softmax``
      counts as those too;
    * "cross-entropy": ``cross_entropy``, ``log_softmax``, ``nll_loss`` and their backward;
    * "optimiser": everything inside ``Optimizer.step`` / ``zero_grad`` (PyTorch names these
      ranges), and any ``_foreach_*`` or fused Adam operator;
    * "other operators": the rest of the aten operators (layer norms, GELU, additions, copies,
      embeddings, views);
    * "Python and dispatch": the wall time left over — Python, the autograd engine's bookkeeping,
      the dispatcher, allocations outside an operator, and the profiler's own cost.

    On the CPU the categories hold the operators' self CPU time (elapsed time on the thread that ran
    them; intra-op threads are inside it). On a GPU (``device`` a CUDA device, or ``None`` with
    CUDA in use) they hold the time of the **kernels** each operator launched, and "Python and
    dispatch" is the time the GPU sat idle, waiting for the CPU to queue work: the fixed cost that
    a bigger batch hides. Limits: the profiler adds a few microseconds per operator, so a program
    of many tiny operators looks more Python-bound than it is unprofiled; kernels on several CUDA
    streams that overlap are summed (the total is then capped at the wall time: the shares are
    divided by the larger of the two); time spent in other threads of the process is not seen.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if device is None:
        on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    else:
        on_gpu = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    synchronize(device)
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else []))
    with _quiet_native_stderr():  # the profiler's C++ side prints "profiler_start" lines there
        prof.start()
    try:
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        synchronize(device)
        wall = (time.perf_counter() - start) * 1e6  # microseconds, the profiler's unit
    finally:
        with _quiet_native_stderr():
            prof.stop()
    spent = dict.fromkeys(BREAKDOWN[:-1], 0.0)
    for event in prof.events():
        if event.device_type != DeviceType.CPU or event.is_async:
            continue  # a kernel's own record: its time is already attached to the operator
        if on_gpu:
            us = event.self_device_time_total
        else:
            us = event.self_cpu_time_total if event.name.startswith("aten::") else 0.0
        if us > 0:
            spent[_category(event)] += us
    busy = sum(spent.values())
    total = max(wall, busy)
    shares = {kind: t / total for kind, t in spent.items()}
    shares["Python and dispatch"] = 1.0 - busy / total
    return shares
