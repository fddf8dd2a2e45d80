"""Checkers for chapter 10, "The cost of attention and the efficient variants".

>>> from tfm_course.exercises import ch10
>>> ch10.check_online_softmax(my_step)          # fn(m, l, acc, scores, values) -> (m, l, acc)
>>> ch10.check_sliding_window_mask(my_mask)     # fn(n, window) -> (n, n) bool
>>> ch10.check_linformer_attention(my_attn)     # fn(q, k, v, E, F) -> (batch, heads, n, d_v)
>>> ch10.check_positive_features(my_features)   # fn(x, omega) -> (..., n, m)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ..efficient.sparse import sliding_window_mask
from ._checking import Failed, attempt, close, compare_with_mistakes, expect_tensor, run_checks, seeded

__all__ = ["check_online_softmax", "check_sliding_window_mask", "check_linformer_attention",
           "check_positive_features"]


# --------------------------------------------------------------------------- online softmax
Step = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def _no_rescale(rescale_l: bool, rescale_acc: bool) -> Step:
    def step(m, l, acc, scores, values):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p, factor = torch.exp(scores - m_new), torch.exp(m - m_new)
        return (m_new, (factor * l if rescale_l else l) + p.sum(-1, keepdim=True),
                (factor * acc if rescale_acc else acc) + p @ values)
    return step


def _per_tile_softmax(m, l, acc, scores, values):
    return torch.maximum(m, scores.amax(-1, keepdim=True)), l + 1, acc + torch.softmax(scores, -1) @ values


def _tiles(fn: Step, scores: Tensor, values: Tensor, sizes: list[int],
           check_state: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Fold the tiles in order with ``fn``; return the final (m, l, acc)."""
    n_q, d_v = scores.shape[0], values.shape[1]
    m = torch.full((n_q, 1), -math.inf, dtype=scores.dtype)
    l, acc = torch.zeros(n_q, 1, dtype=scores.dtype), torch.zeros(n_q, d_v, dtype=scores.dtype)
    start = 0
    for size in sizes:
        s, v = scores[:, start:start + size], values[start:start + size]
        state = attempt(fn, m, l, acc, s.clone(), v.clone()) if check_state else fn(m, l, acc, s, v)
        if check_state:
            if not (isinstance(state, (tuple, list)) and len(state) == 3
                    and all(isinstance(t, Tensor) for t in state)):
                raise Failed("return the new state as a tuple of three tensors (m, l, acc)")
            for name, t, shape in zip(("m", "l", "acc"), state, ((n_q, 1), (n_q, 1), (n_q, d_v))):
                if tuple(t.shape) != shape:
                    raise Failed(f"{name} has shape {tuple(t.shape)}, expected {shape}: keep "
                                 f"m and l as (n_q, 1) columns (keepdim=True) and acc as (n_q, d_v)")
        m, l, acc = (t.detach().double() for t in state)
        start += size
    return m, l, acc


def check_online_softmax(fn: Step) -> bool:
    """``fn(m, l, acc, scores, values) -> (m, l, acc)``: fold one tile of keys into the state.

    m, l: ``(n_q, 1)`` running maximum and Σ exp(s − m); acc: ``(n_q, d_v)`` running Σ exp(s − m) v;
    scores: ``(n_q, t)`` this tile's scores; values: ``(t, d_v)``. Start: m = −inf, l = 0, acc = 0.
    The checker folds the tiles in order and compares ``acc / l`` with softmax(scores) @ values.
    """
    def case(scores: Tensor, values: Tensor, sizes: list[int]) -> Callable[[], None]:
        def check() -> None:
            m, l, acc = _tiles(fn, scores, values, sizes, check_state=True)
            want = torch.softmax(scores, -1) @ values
            got = acc / l
            large = float(scores.max()) > 100
            if not bool(torch.isfinite(got).all()):
                if large:
                    raise Failed("exp overflowed (inf/NaN) for scores around 500: subtract the "
                                 "running maximum before exp, p = exp(scores − m_new)")
                raise Failed("the output contains inf or NaN with ordinary scores: did you use the "
                             "old m (−inf before the first tile) in exp? Compute m_new = max(m, "
                             "scores.max) first, then exp(scores − m_new) and exp(m − m_new)")
            mistakes = [
                (lambda: _final(_no_rescale(False, False)), "neither l nor acc is rescaled when the "
                 "maximum grows: multiply both by exp(m − m_new) before adding the new tile"),
                (lambda: _final(_no_rescale(True, False)), "acc is not rescaled: it was summed "
                 "against the old maximum — multiply it by exp(m − m_new) before adding p @ values"),
                (lambda: _final(_no_rescale(False, True)), "l is not rescaled: it was summed against "
                 "the old maximum — multiply it by exp(m − m_new) before adding p.sum(-1)"),
                (lambda: _final(_per_tile_softmax), "each tile was normalised on its own and the "
                 "results averaged: keep the unnormalised sums l and acc and divide once, at the end"),
            ]
            compare_with_mistakes(got, want, mistakes, "acc / l after the last tile")
            if not close(m, scores.amax(-1, keepdim=True)):
                last = scores[:, -sizes[-1]:].amax(-1, keepdim=True)
                if close(m, last):
                    raise Failed("m is only the last tile's maximum: the running maximum is "
                                 "max(m, scores.max(-1)), over every tile seen so far")
                raise Failed("m should be the running maximum of all scores seen so far")
            if close(l, torch.exp(scores).sum(-1, keepdim=True)):
                raise Failed("l is Σ exp(s) with no maximum subtracted: it overflows once scores "
                             "pass ~88 (float32) or ~709 (float64) — keep l = Σ exp(s − m) and "
                             "acc = Σ exp(s − m) v, rescaling by exp(m − m_new)")
            if not close(l, torch.exp(scores - m).sum(-1, keepdim=True)):
                raise Failed("acc / l is right but l is not Σ exp(s − m) over the keys seen so "
                             "far (with m the running maximum)")

        def _final(step: Step) -> Tensor:
            _, l_wrong, acc_wrong = _tiles(step, scores, values, sizes, check_state=False)
            return acc_wrong / l_wrong
        return check

    g = seeded(10)
    small = torch.randn(3, 8, generator=g, dtype=torch.float64) * 2
    small[:, 4:] += torch.tensor([[3.0], [-2.0], [4.0]], dtype=torch.float64)  # max moves (or not)
    values = torch.randn(8, 5, generator=g, dtype=torch.float64)
    ragged = torch.randn(4, 7, generator=g, dtype=torch.float64) * 3
    large = 500 + 3 * torch.randn(2, 8, generator=g, dtype=torch.float64)
    return run_checks("online softmax", [
        ("two tiles of 4 keys, 3 query rows", case(small, values, [4, 4])),
        ("two tiles of 5 and 2 keys", case(ragged, values[:7], [5, 2])),
        ("three tiles of 3, 1 and 4 keys", case(small.flip(-1), values, [3, 1, 4])),
        ("scores around 500, two tiles", case(large, values, [4, 4])),
    ])


# --------------------------------------------------------------------------- sliding window
def check_sliding_window_mask(fn: Callable[[int, int], Tensor]) -> bool:
    """``fn(n, window)``: ``(n, n)`` bool, True where key j is within ``window`` of query i, |i − j| ≤ window."""
    def case(n: int, window: int) -> Callable[[], None]:
        def check() -> None:
            want = sliding_window_mask(n, window)
            got = expect_tensor(attempt(fn, n, window), want, "the mask")
            if got.dtype != torch.bool:
                raise Failed(f"the mask should be a bool tensor (True = may attend), got {got.dtype}")
            if torch.equal(got, want):
                return
            distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i − j
            known = [
                (~want, "the mask is inverted: in this book True = may attend"),
                (distance.abs() < window, "off by one: the window includes distance `window` "
                 "itself (|i − j| ≤ window, 2·window + 1 keys per row), not only |i − j| < window"),
                (want & (distance >= 0), "that is a causal window (keys j ≤ i only); the sliding "
                 "window here looks both ways, |i − j| ≤ window"),
                (distance.abs() <= window // 2, "`window` is the half-width: each side gets "
                 "`window` keys (|i − j| ≤ window), not window / 2"),
            ]
            for wrong, message in known:
                if torch.equal(got, wrong):
                    raise Failed(message)
            rows = (got != want).any(-1).nonzero().flatten().tolist()
            raise Failed(f"rows {rows[:5]} differ from |i − j| ≤ {window}")
        return check

    return run_checks("sliding-window mask", [
        ("n = 9, window = 3", case(9, 3)),
        ("n = 7, window = 1", case(7, 1)),
        ("n = 5, window = 0 (only the diagonal)", case(5, 0)),
        ("n = 6, window = 10 (wider than the sequence)", case(6, 10)),
    ])


# --------------------------------------------------------------------------- Linformer
def _linformer(q: Tensor, k: Tensor, v: Tensor, E: Tensor, F: Tensor, scale: float,
               dim: int = -1) -> Tensor:
    n = q.shape[-2]
    scores = q @ (E[:, :n] @ k).transpose(-2, -1) * scale
    return torch.softmax(scores, dim=dim) @ (F[:, :n] @ v)


def check_linformer_attention(fn: Callable[..., Tensor]) -> bool:
    """``fn(q, k, v, E, F)``: softmax(q (E k)ᵀ / √d) (F v).

    q, k: ``(batch, heads, n, d)``; v: ``(batch, heads, n, d_v)``; E, F: ``(k_proj, n_max)``
    with n ≤ n_max (use the first n columns). Returns ``(batch, heads, n, d_v)``.
    """
    def case(b: int, h: int, n: int, d: int, d_v: int, k_proj: int, n_max: int) -> Callable[[], None]:
        def check() -> None:
            g = seeded(n + d + k_proj)
            q, k = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(2))
            v = torch.randn(b, h, n, d_v, generator=g, dtype=torch.float64)
            E, F = (torch.randn(k_proj, n_max, generator=g, dtype=torch.float64) / math.sqrt(k_proj)
                    for _ in range(2))
            want = _linformer(q, k, v, E, F, d ** -0.5)
            try:
                got = attempt(fn, q.clone(), k.clone(), v.clone(), E.clone(), F.clone())
            except Failed as problem:
                if n < n_max and "size" in str(problem).lower():
                    raise Failed(f"{problem}. Hint: E and F have n_max = {n_max} columns but the "
                                 f"input has n = {n} positions; use E[:, :n] and F[:, :n]") from None
                raise
            if isinstance(got, Tensor) and got.shape == (b, h, k_proj, d_v) != want.shape:
                raise Failed(f"the output has k_proj = {k_proj} rows: only the keys and values are "
                             f"projected; the queries keep all n = {n} positions")
            expect_tensor(got, want, "the output")
            mistakes = [
                (lambda: _linformer(q, k, v, E, F, 1.0), "the scores are not scaled: divide "
                 "q (E k)ᵀ by √d, as in softmax attention"),
                (lambda: _linformer(q, k, v, E, F, k_proj ** -0.5), f"scaled by √k_proj = √{k_proj}; "
                 f"the scale is √d = √{d}, the width of a head, as in softmax attention"),
                (lambda: _linformer(q, k, v, E, F, 1 / d), "divided by d instead of √d"),
                (lambda: _linformer(q, k, v, F, E, d ** -0.5), "E and F are swapped: the keys go "
                 "through E, the values through F"),
                (lambda: _linformer(q, k, v, E, E, d ** -0.5), "the values were projected with E; "
                 "use F for the values"),
                (lambda: _linformer(q, k, v, E, F, d ** -0.5, dim=-2), "softmax over the wrong "
                 "axis: normalise each query's scores over the k_proj projected keys (dim=-1)"),
            ]
            compare_with_mistakes(got, want, mistakes, "the output")
        return check

    return run_checks("Linformer attention", [
        ("batch 2, heads 2, n = 12, d = 8, k_proj = 4", case(2, 2, 12, 8, 8, 4, 12)),
        ("d_v = 5 differs from d = 6, k_proj = 3", case(1, 3, 10, 6, 5, 3, 10)),
        ("an input shorter than E: n = 9, n_max = 16", case(2, 1, 9, 4, 4, 5, 16)),
    ])


# --------------------------------------------------------------------------- positive features
def _features(x: Tensor, omega: Tensor, x_scale: float | None = None, sq_sign: float = -1.0,
              squared: bool = True, m_norm: float | None = None, per_row: bool = True) -> Tensor:
    d, m = x.shape[-1], omega.shape[0]
    x = x * (d ** -0.25 if x_scale is None else x_scale)
    norm = x.norm(dim=-1, keepdim=True) if per_row else x.norm()
    return torch.exp(x @ omega.T + sq_sign * (norm ** 2 if squared else norm) / 2) / (
        math.sqrt(m) if m_norm is None else m_norm)


def _stabilised(features: Tensor) -> Tensor:
    """The features with each row's largest exponent subtracted (the package's query stabiliser)."""
    exponent = features.log()
    return torch.exp(exponent - exponent.amax(dim=-1, keepdim=True)) / math.sqrt(features.shape[-1])


def check_positive_features(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """``fn(x, omega)``: φ(x) = exp(ω·x' − ‖x'‖²/2) / √m with x' = x · d^(−1/4).

    x: ``(..., n, d)``; omega: ``(m, d)``, rows ω_i ~ N(0, I). Returns ``(..., n, m)``, and
    φ(q)·φ(k) is then an unbiased estimate of exp(q·k/√d). No stabilising maximum here.
    """
    def case(x: Tensor, m: int) -> Callable[[], None]:
        def check() -> None:
            d = x.shape[-1]
            omega = torch.randn(m, d, generator=seeded(m + d), dtype=torch.float64)
            want = _features(x, omega)
            got = attempt(fn, x.clone(), omega.clone())
            if isinstance(got, Tensor) and got.shape == (*x.shape[:-1], 2 * m):
                raise Failed(f"{2 * m} features from m = {m} directions: those look like "
                             "trigonometric features (sin and cos), which can be negative; "
                             "FAVOR+ uses one positive feature exp(ω·x' − ‖x'‖²/2) per direction")
            expect_tensor(got, want, "the features")
            if bool((got < 0).any()):
                raise Failed("some features are negative: positive random features are exp(...), "
                             "so every estimated attention weight stays ≥ 0")
            mistakes = [
                (lambda: _features(x, omega, x_scale=1.0), "x is not scaled: use x' = x · d^(−1/4) "
                 "(for q and k alike, so that φ(q)·φ(k) estimates exp(q·k/√d))"),
                (lambda: _features(x, omega, x_scale=d ** -0.5), "x was scaled by 1/√d; scale each "
                 "of q and k by d^(−1/4): together they make the 1/√d of softmax attention"),
                (lambda: _features(x, omega, sq_sign=0.0), "the −‖x'‖²/2 term is missing: without "
                 "it E[φ(q)·φ(k)] = exp(q'·k' + (‖q'‖² + ‖k'‖²)/2), not exp(q'·k')"),
                (lambda: _features(x, omega, sq_sign=1.0), "the sign of the norm term is wrong: "
                 "subtract ‖x'‖²/2"),
                (lambda: _features(x, omega, squared=False), "use the squared norm: "
                 "exp(ω·x' − ‖x'‖²/2), not ‖x'‖/2"),
                (lambda: _features(x, omega, m_norm=1.0), f"divide by √m = √{m}, so that the dot "
                 "product φ(q)·φ(k) averages over the m features"),
                (lambda: _features(x, omega, m_norm=float(m)), f"divided by m = {m}; divide each "
                 f"feature vector by √m (the dot product of two of them then carries 1/m)"),
                (lambda: _features(x, omega, per_row=False), "‖x'‖² is the squared norm of each "
                 "row: sum over the last dim (one position's vector), not over the whole tensor"),
                (lambda: _stabilised(want), "a maximum was subtracted in the exponent (as a model "
                 "does for stability): it cancels in attention, but here return the textbook "
                 "φ(x) = exp(ω·x' − ‖x'‖²/2)/√m, whose dot products estimate exp(q·k/√d) itself"),
            ]
            compare_with_mistakes(got, want, mistakes, "the features", atol=1e-6)
        return check

    g = seeded(3)
    return run_checks("positive random features", [
        ("x of shape (5, 8), m = 16", case(torch.randn(5, 8, generator=g, dtype=torch.float64), 16)),
        ("x of shape (2, 3, 6, 4), m = 10",
         case(0.7 * torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64), 10)),
        ("x of shape (4, 16), m = 3", case(torch.randn(4, 16, generator=g, dtype=torch.float64), 3)),
    ])
