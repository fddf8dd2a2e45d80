"""Timing, memory and FLOP-counting helpers shared by the chapters' measurements."""

from __future__ import annotations

import math
import statistics
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

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


# --------------------------------------------------------------------------- sweeps
def loglog_slope(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """Least-squares slope of log y against log x (2 ≈ quadratic, 1 ≈ linear).

    Points with a missing, NaN or non-positive y are left out; None if fewer than two remain.
    """
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys)
           if y is not None and not math.isnan(y) and y > 0 and x > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    if var == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var


def crossover(xs: Sequence[float], ys_a: Sequence[float | None],
              ys_b: Sequence[float | None]) -> float | None:
    """The x from which ``a`` is cheaper than ``b`` and stays so, interpolated on log–log axes.

    Only xs where both are measured count. Returns None when ``a`` is never cheaper at the largest
    measured x, ``xs[0]`` (the first shared x) when it is cheaper everywhere.
    """
    pts = [(x, a, b) for x, a, b in zip(xs, ys_a, ys_b)
           if a is not None and b is not None and a > 0 and b > 0]
    if not pts or pts[-1][1] >= pts[-1][2]:
        return None
    gap = [math.log(a / b) for _, a, b in pts]  # < 0 where a is cheaper
    i = len(pts) - 1
    while i > 0 and gap[i - 1] < 0:
        i -= 1
    if i == 0:
        return float(pts[0][0])
    (x0, g0), (x1, g1) = (pts[i - 1][0], gap[i - 1]), (pts[i][0], gap[i])
    t = g0 / (g0 - g1)  # g0 ≥ 0 > g1
    return float(math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0))))


def _predict(history: list[tuple[int, float]], n: int, min_slope: float = 1.0,
             max_slope: float = 3.0) -> float | None:
    """Extrapolate a cost to length n from the last two (length, cost) points on log–log axes.

    The slope is clamped to [min_slope, max_slope]: tiny, noisy timings must not predict
    absurd growth (none of the methods measured here is worse than cubic).
    """
    if not history:
        return None
    n1, c1 = history[-1]
    slope = 2.0
    if len(history) >= 2:
        n0, c0 = history[-2]
        if c0 > 0 and c1 > 0 and n1 != n0:
            slope = min(max_slope, max(min_slope, math.log(c1 / c0) / math.log(n1 / n0)))
    return c1 * (n / n1) ** slope


def sweep(cases: Mapping[str, Callable[[int], Callable[[], torch.Tensor]]],
          lengths: Sequence[int], *,
          backward: bool = True, repeats: int = 3, time_cap_s: float = 10.0,
          memory_cap_bytes: float = 2e9, cell_budget_s: float = 3.0, flops: bool = True,
          device: torch.device | str | None = None,
          progress: Callable[[dict], Any] | None = None) -> list[dict]:
    """Time and measure memory of several methods as the sequence length grows.

    ``cases`` maps a name to ``make(n)``, which builds inputs of length n (requiring grad when
    ``backward``) and returns ``run()`` computing the forward output. For each (name, n) the row has

    * ``fwd_s`` — median seconds of ``run()`` under ``torch.no_grad()``;
    * ``train_s`` — median seconds of ``run().sum().backward()`` (if ``backward``);
    * ``peak_bytes`` — peak memory of the no-grad forward: :func:`cuda_peak_bytes` when
      ``device`` is CUDA, :func:`peak_tensor_bytes` otherwise; ``memory_kind`` says which (pass
      ``device`` so that a GPU run asks the allocator);
    * ``saved_bytes`` — :func:`saved_tensor_bytes`, activations kept for the backward pass;
    * ``flops`` — :func:`count_flops` of the forward (matmul-type ops only);
    * ``skipped`` — None, or why the cell was not run.

    Before running a cell, its training time and memory are extrapolated from the two previous
    lengths (log–log); if either would exceed ``time_cap_s`` / ``memory_cap_bytes`` the cell and all
    longer ones are skipped ("skipped (>cap)"), which bounds the sweep's total time. Timing stops
    repeating after ``cell_budget_s`` seconds, and skips the warm-up run when a call is predicted to
    take over a second.
    ``progress(row)`` is called after every row (e.g. to print it).
    """
    on_cuda = device is not None and torch.device(device).type == "cuda"
    rows: list[dict] = []
    for name, make in cases.items():
        times: list[tuple[int, float]] = []
        mems: list[tuple[int, float]] = []
        skip_reason: str | None = None
        for n in lengths:
            row: dict = {"method": name, "n": n, "fwd_s": None, "train_s": None, "peak_bytes": None,
                         "saved_bytes": None, "flops": None, "skipped": skip_reason,
                         "memory_kind": "cuda_peak" if on_cuda else "live_tensors"}
            if skip_reason is None:
                t_pred, m_pred = _predict(times, n), _predict(mems, n)
                if t_pred is not None and t_pred > time_cap_s:
                    skip_reason = f"skipped (>{time_cap_s:g} s)"
                elif m_pred is not None and m_pred > memory_cap_bytes:
                    skip_reason = f"skipped (>{memory_cap_bytes / 1e9:g} GB)"
                row["skipped"] = skip_reason
            if skip_reason is not None:
                rows.append(row)
                if progress:
                    progress(row)
                continue
            warmup = 0 if t_pred is not None and t_pred > 1.0 else 1
            run = make(n)

            def forward() -> None:
                with torch.no_grad():
                    run()

            if on_cuda:
                row["peak_bytes"] = cuda_peak_bytes(forward, device)
            else:
                row["peak_bytes"] = peak_tensor_bytes(forward)
            row["fwd_s"] = time_fn(forward, repeats=repeats, warmup=warmup, device=device,
                                   max_seconds=cell_budget_s)
            memory = row["peak_bytes"]
            cost = row["fwd_s"]
            if backward:
                def train_step() -> None:
                    run().float().sum().backward()

                row["saved_bytes"] = saved_tensor_bytes(run)
                row["train_s"] = time_fn(train_step, repeats=repeats, warmup=warmup, device=device,
                                         max_seconds=cell_budget_s)
                memory, cost = max(memory, row["saved_bytes"]), row["train_s"]
            if flops:
                row["flops"] = count_flops(forward)
            times.append((n, cost))
            mems.append((n, float(memory)))
            del run
            rows.append(row)
            if progress:
                progress(row)
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   headers: Sequence[str] | None = None) -> str:
    """A GitHub-style markdown table of ``rows`` (dicts) restricted to ``columns``."""
    headers = list(headers or columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)
