"""How a cost grows with the sequence length: sweeps over lengths, log-log slopes, crossovers.

    rows = sweep(cases, lengths=[256, 512, 1024])          # cases: tfm_course.efficient.cases
    loglog_slope([256, 512, 1024], [r["train_s"] for r in rows if r["method"] == "softmax"])
    print(metric_table(rows, "train_s", lambda s: "—" if s is None else f"{s * 1e3:.1f}"))

Each cell of a sweep is measured with :mod:`tfm_course.experiments.measure`; the tables are
markdown (methods × lengths), for a notebook's ``display(Markdown(...))`` or a file.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from .measure import count_flops, cuda_peak_bytes, peak_tensor_bytes, saved_tensor_bytes, time_fn


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



# --------------------------------------------------------------------------- tables
def metric_table(rows: Sequence[dict], key: str, fmt: Callable, title: str | None = None) -> str:
    """Methods as rows, lengths as columns, plus the log–log slope over the measured lengths.

    ``rows`` come from :func:`sweep`; ``key`` is one of its measurements
    (``"train_s"``, ``"peak_bytes"``, ...) and ``fmt`` formats one value (None = not measured).
    """
    lengths = sorted({r["n"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = [f"### {title}", ""] if title else []
    lines += ["| method | " + " | ".join(str(n) for n in lengths) + " | slope |",
              "|---|" + "---:|" * (len(lengths) + 1)]
    for m in methods:
        mine = {r["n"]: r for r in rows if r["method"] == m}
        cells = []
        for n in lengths:
            r = mine.get(n)
            cells.append(r["skipped"] if r and r["skipped"] else fmt(r[key] if r else None))
        slope = loglog_slope(lengths, [mine[n][key] if n in mine else None for n in lengths])
        cells.append("—" if slope is None else f"{slope:.2f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def crossover_table(rows: Sequence[dict], key: str, baselines: Sequence[str],
                    title: str | None = None) -> str:
    """From which length each method is cheaper than each baseline (log–log interpolation,
    :func:`crossover`): a length, "always (≥ n)" or "never (≤ n)"."""
    lengths = sorted({r["n"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def series(m: str) -> list[float | None]:
        mine = {r["n"]: r[key] for r in rows if r["method"] == m}
        return [mine.get(n) for n in lengths]

    lines = [f"### {title}", ""] if title else []
    lines += ["| method | " + " | ".join(f"vs {b}" for b in baselines) + " |",
              "|---|" + "---:|" * len(baselines)]
    for m in methods:
        if m in baselines:
            continue
        cells = []
        for b in baselines:
            a_ys, b_ys = series(m), series(b)
            shared = [n for n, a, c in zip(lengths, a_ys, b_ys) if a is not None and c is not None]
            x = crossover(lengths, a_ys, b_ys)
            if not shared:
                cells.append("no shared length")
            elif x is None:
                cells.append(f"never (≤ {shared[-1]})")
            elif x == shared[0]:
                cells.append(f"always (≥ {shared[0]})")
            else:
                cells.append(f"{x:.0f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
