"""Checkers for chapter 11, "Beyond attention: RetNet and Mamba".

>>> from tfm_course.exercises import ch11
>>> ch11.check_parallel_retention(my_fn)    # fn(q, k, v, gamma) -> (Q Kᵀ ⊙ D) V
>>> ch11.check_retention_step(my_fn)        # fn(q_t, k_t, v_t, gamma, state) -> (out_t, new_state)
>>> ch11.check_cross_chunk(my_fn)           # fn(q_chunk, state, gamma) -> (Q R_{i−1}) ⊙ ξ
>>> ch11.check_discretisation(my_fn)        # fn(delta, A, B) -> (A_bar, B_bar)
>>> ch11.check_selective_scan_step(my_fn)   # fn(h, x_t, delta_t, A, B_t, C_t, D) -> (y_t, new_h)

Shapes (batch first): retention q, k ``(batch, heads, L, d_k)``, v ``(batch, heads, L, d_v)``,
gamma ``(heads,)``, state ``(batch, heads, d_k, d_v)``; Mamba h ``(batch, d_inner, N)``, x_t and
delta_t ``(batch, d_inner)``, A ``(d_inner, N)``, B_t and C_t ``(batch, N)``, D ``(d_inner,)``.
Each checker prints what is wrong in words and returns True or False; none raises because of
your answer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..efficient.retnet import decay_mask, retention, retention_step
from ._checking import Failed, Mistakes, attempt, compare_with_mistakes, run_checks, seeded

__all__ = ["check_parallel_retention", "check_retention_step", "check_cross_chunk",
           "check_discretisation", "check_selective_scan_step"]

OUTER_ORDER = ("the outer product is the wrong way round: k_tᵀ v_t is (d_k, d_v), entry (i, j) = "
               "k_i v_j, so that out_t = q_t S has d_v entries")


def _pair(got: Any, what: str, first: Tensor, second: Tensor,
          names: tuple[str, str]) -> tuple[Tensor, Tensor]:
    """Unpack a returned ``(first, second)`` pair, naming a swapped order."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Failed(f"{what} should return a pair ({names[0]}, {names[1]}), got {type(got).__name__}")
    a, b = got
    if (isinstance(a, Tensor) and isinstance(b, Tensor) and first.shape != second.shape
            and a.shape == second.shape and b.shape == first.shape):
        raise Failed(f"the pair is in the wrong order: return ({names[0]}, {names[1]})")
    return a, b


def _retention_inputs(batch: int, heads: int, length: int, d_k: int, d_v: int, seed: int
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = seeded(seed)
    q, k = torch.randn(2, batch, heads, length, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(batch, heads, length, d_v, generator=g, dtype=torch.float64)
    gamma = 0.5 + 0.45 * torch.rand(heads, generator=g, dtype=torch.float64)  # clearly below 1
    return q, k, v, gamma


RETENTION_CASES = [("2 heads, L = 6, d_k = 4, d_v = 3", (2, 2, 6, 4, 3, 0)),
                   ("3 heads, L = 9, d_k = d_v = 4", (1, 3, 9, 4, 4, 1)),
                   ("1 head, L = 1", (2, 1, 1, 2, 5, 2))]


# --------------------------------------------------------------------------- parallel retention
def check_parallel_retention(fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> bool:
    """``fn(q, k, v, gamma)`` must return ``(Q Kᵀ ⊙ D) V`` with ``D[h, n, m] = γ_h^(n−m)`` for
    n ≥ m and 0 above the diagonal; q, k ``(batch, heads, L, d_k)``, v ``(batch, heads, L, d_v)``."""

    def case(sizes: tuple[int, ...]) -> Callable[[], None]:
        def check() -> None:
            q, k, v, gamma = _retention_inputs(*sizes)
            length = q.shape[2]
            D = decay_mask(gamma, length)  # (h, L, L)
            scores = q @ k.transpose(-2, -1)
            want = retention(q, k, v, gamma)
            got = attempt(fn, q.clone(), k.clone(), v.clone(), gamma.clone())
            pos = torch.arange(length, dtype=torch.float64)
            distance = (pos[:, None] - pos[None, :]).abs()
            mistakes: Mistakes = [
                (lambda: (scores @ D) @ v,
                 "D is multiplied as a matrix: the decay is applied element-wise, (Q Kᵀ ⊙ D) V — "
                 "write `*`, not `@` (a tutorial's `Q * K^T * D` is ambiguous here)"),
                (lambda: (scores * gamma[:, None, None] ** distance) @ v,
                 "D is not causal: D[n, m] = γ^(n−m) only for m ≤ n, and 0 for future keys m > n"),
                (lambda: (scores * D.transpose(-2, -1)) @ v,
                 "D is transposed: row n (the query) holds γ^(n−m) for the keys m ≤ n, "
                 "i.e. D is lower-triangular"),
                (lambda: (scores * (D > 0)) @ v,
                 "no decay: that is causal linear attention; multiply entry (n, m) by γ^(n−m)"),
                (lambda: (scores / q.shape[-1] ** 0.5 * D) @ v,
                 "scaled by 1/√d_k: the retention here has no scaling (the layer scales k before)"),
                (lambda: torch.softmax((scores * D).masked_fill(D == 0, float("-inf")), -1) @ v,
                 "a softmax: retention uses the decayed scores Q Kᵀ ⊙ D directly, no softmax"),
            ]
            compare_with_mistakes(got, want, mistakes, "the retention output")
        return check

    return run_checks("parallel retention", [(name, case(s)) for name, s in RETENTION_CASES])


# --------------------------------------------------------------------------- one recurrent step
def check_retention_step(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """``fn(q_t, k_t, v_t, gamma, state)`` → ``(out_t, new_state)``: ``S = γ S + k_tᵀ v_t`` (an
    outer product per head), ``out_t = q_t S``. q_t, k_t ``(batch, heads, d_k)``, v_t ``(batch,
    heads, d_v)``, gamma ``(heads,)``, state ``(batch, heads, d_k, d_v)``."""

    def case(sizes: tuple[int, ...], zero_state: bool) -> Callable[[], None]:
        def check() -> None:
            q, k, v, gamma = _retention_inputs(*sizes)
            b, h, _, d_k = q.shape
            g = gamma[:, None, None]
            state = (torch.zeros(b, h, d_k, v.shape[-1], dtype=torch.float64) if zero_state
                     else torch.randn(b, h, d_k, v.shape[-1], generator=seeded(9), dtype=torch.float64))
            q_t, k_t, v_t = q[:, :, 0], k[:, :, 0], v[:, :, 0]
            want_out, want_state = retention_step(q_t, k_t, v_t, gamma, state)
            got = attempt(fn, q_t.clone(), k_t.clone(), v_t.clone(), gamma.clone(), state.clone())
            out, new_state = _pair(got, "the step", want_out, want_state, ("out_t", "new_state"))
            outer = k_t[..., :, None] * v_t[..., None, :]
            if isinstance(new_state, Tensor) and new_state.shape == want_state.transpose(-2, -1).shape \
                    and new_state.shape != want_state.shape:
                raise Failed(OUTER_ORDER + f"; your state is {tuple(new_state.shape)}")
            state_mistakes: Mistakes = [
                (lambda: state + outer, "the old state is not decayed: S = γ S + k_tᵀ v_t"),
                (lambda: g * (state + outer),
                 "γ also multiplies the new token's k_tᵀ v_t: only the old state decays, "
                 "S = γ S + k_tᵀ v_t"),
                (lambda: g * state + outer.transpose(-2, -1), OUTER_ORDER),
                (lambda: g * state + (k_t * v_t).sum(-1)[..., None, None],
                 "k_t · v_t is a dot product: the state update is the *outer* product k_tᵀ v_t"),
            ]
            compare_with_mistakes(new_state, want_state, state_mistakes, "the new state")
            out_mistakes: Mistakes = [
                (lambda: (q_t[..., None, :] @ state).squeeze(-2),
                 "the output reads the old state: first update S, then out_t = q_t S"),
                (lambda: (q_t[..., None, :] @ (state + outer)).squeeze(-2),
                 "the output uses an undecayed state: out_t = q_t (γ S + k_tᵀ v_t)"),
            ]
            compare_with_mistakes(out, want_out, out_mistakes, "out_t")
        return check

    return run_checks("one retention step", [
        ("2 heads, d_k = 4, d_v = 3", case((2, 2, 1, 4, 3, 0), False)),
        ("3 heads, d_k = d_v = 4", case((1, 3, 1, 4, 4, 1), False)),
        ("first token (state of zeros)", case((2, 2, 1, 3, 2, 2), True)),
    ])


# --------------------------------------------------------------------------- chunkwise: cross-chunk
def check_cross_chunk(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> bool:
    """``fn(q_chunk, state, gamma)``: what the chunks before contribute to chunk i's outputs,
    ``(Q_[i] R_{i−1}) ⊙ ξ`` with ``ξ_j = γ^(j+1)`` for row j of the chunk (j = 0, 1, ...).
    q_chunk ``(batch, heads, B, d_k)``, state R_{i−1} ``(batch, heads, d_k, d_v)``, gamma ``(heads,)``;
    returns ``(batch, heads, B, d_v)``."""

    def case(sizes: tuple[int, ...]) -> Callable[[], None]:
        def check() -> None:
            q, k, v, gamma = _retention_inputs(*sizes)
            size = q.shape[2]
            state = k.transpose(-2, -1) @ v  # any (b, h, d_k, d_v) state
            g, j = gamma[:, None, None], torch.arange(size, dtype=torch.float64)[:, None]
            plain = q @ state
            want = plain * g ** (j + 1)
            got = attempt(fn, q.clone(), state.clone(), gamma.clone())
            mistakes: Mistakes = [
                (lambda: plain * g ** j,
                 "off by one: row j is j + 1 steps after the last token of the previous chunk, "
                 "so ξ_j = γ^(j+1), not γ^j"),
                (lambda: plain * g ** (size - 1 - j),
                 "that is ζ_j = γ^(B−j−1), the decay *into* the next state; the outputs use "
                 "ξ_j = γ^(j+1), the decay since the previous chunk ended"),
                (lambda: plain, "no decay: scale row j by ξ_j = γ^(j+1)"),
                (lambda: plain * g ** size, "every row decayed by γ^B: row j needs its own "
                 "ξ_j = γ^(j+1)"),
                (lambda: (q @ state.transpose(-2, -1)) * g ** (j + 1),  # raises unless d_k = d_v
                 "the state is transposed: R_{i−1} is (d_k, d_v), multiply Q_[i] R_{i−1}"),
            ]
            compare_with_mistakes(got, want, mistakes, "the cross-chunk term")
        return check

    return run_checks("chunkwise cross-chunk term", [
        ("chunk of 4, 2 heads, d_k = 4, d_v = 3", case((2, 2, 4, 4, 3, 0))),
        ("chunk of 6, 3 heads, d_k = d_v = 4", case((1, 3, 6, 4, 4, 1))),
        ("chunk of 1", case((2, 1, 1, 2, 2, 2))),
    ])


# --------------------------------------------------------------------------- Mamba
def _mamba_inputs(batch: int, d_inner: int, n: int, seed: int, length: int | None = None) -> dict:
    g = seeded(seed)
    lead = (batch,) if length is None else (batch, length)
    return dict(
        x=torch.randn(*lead, d_inner, generator=g, dtype=torch.float64),
        delta=F.softplus(torch.randn(*lead, d_inner, generator=g, dtype=torch.float64)) + 0.05,
        A=-torch.arange(1, n + 1, dtype=torch.float64).repeat(d_inner, 1)
          * (0.5 + torch.rand(d_inner, 1, generator=g, dtype=torch.float64)),
        B=torch.randn(*lead, n, generator=g, dtype=torch.float64),
        C=torch.randn(*lead, n, generator=g, dtype=torch.float64),
        D=torch.randn(d_inner, generator=g, dtype=torch.float64),
        h=torch.randn(batch, d_inner, n, generator=g, dtype=torch.float64))


def check_discretisation(fn: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> bool:
    """``fn(delta, A, B)`` → ``(A_bar, B_bar)``, both ``(batch, L, d_inner, N)``, as in Mamba:
    ``A_bar = exp(Δ A)`` (zero-order hold) and ``B_bar = Δ B`` (the simplification Mamba's code
    uses). delta ``(batch, L, d_inner)``, A ``(d_inner, N)``, B ``(batch, L, N)``."""

    def case(batch: int, length: int, d_inner: int, n: int, seed: int) -> Callable[[], None]:
        def check() -> None:
            t = _mamba_inputs(batch, d_inner, n, seed, length)
            delta, A, B = t["delta"], t["A"], t["B"]
            dA = delta[..., None] * A  # (b, L, d, N)
            want_a, want_b = torch.exp(dA), delta[..., None] * B[:, :, None, :]
            got = attempt(fn, delta.clone(), A.clone(), B.clone())
            a_bar, b_bar = _pair(got, "the discretisation", want_a, want_b, ("A_bar", "B_bar"))
            compare_with_mistakes(a_bar, want_a, [
                (lambda: 1 + dA, "A_bar = 1 + Δ A is Euler's first-order step; Mamba uses the "
                 "zero-order hold A_bar = exp(Δ A), which stays in (0, 1) for every Δ > 0"),
                (lambda: torch.exp(A).expand_as(want_a), "Δ is missing: A_bar = exp(Δ A)"),
                (lambda: dA, "the exponential is missing: A_bar = exp(Δ A)"),
                (lambda: torch.exp(-dA), "wrong sign: A is already negative, A_bar = exp(Δ A) < 1"),
            ], "A_bar")
            compare_with_mistakes(b_bar, want_b, [
                (lambda: B[:, :, None, :].expand_as(want_b), "Δ is missing: B_bar = Δ B"),
                (lambda: (torch.exp(dA) - 1) / A * B[:, :, None, :],
                 "that is the exact zero-order-hold B_bar = (exp(Δ A) − 1) / A · B; Mamba's code "
                 "simplifies it to Δ B (the two agree when Δ A is small)"),
                (lambda: (torch.exp(dA) - 1) / dA * B[:, :, None, :],
                 "the Δ before B is missing from the zero-order hold; Mamba uses B_bar = Δ B"),
                (lambda: torch.exp(dA) * B[:, :, None, :], "B_bar is not exp(Δ A) B: Mamba uses Δ B"),
            ], "B_bar")
        return check

    return run_checks("discretisation", [
        ("batch 2, L = 5, d_inner = 3, N = 4", case(2, 5, 3, 4, 0)),
        ("batch 1, L = 7, d_inner = 6, N = 2", case(1, 7, 6, 2, 1)),
        ("batch 3, L = 1, d_inner = 2, N = 5", case(3, 1, 2, 5, 2)),
    ])


def check_selective_scan_step(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """``fn(h, x_t, delta_t, A, B_t, C_t, D)`` → ``(y_t, new_h)``: one step of the selective scan,
    ``h_t = exp(Δ_t A) ⊙ h_{t−1} + (Δ_t x_t) B_t`` and ``y_t = h_t · C_t + D x_t`` (per channel).
    h ``(batch, d_inner, N)``, x_t and delta_t ``(batch, d_inner)``, A ``(d_inner, N)``, B_t and C_t
    ``(batch, N)``, D ``(d_inner,)``."""

    def case(batch: int, d_inner: int, n: int, seed: int) -> Callable[[], None]:
        def check() -> None:
            t = _mamba_inputs(batch, d_inner, n, seed)
            h, x, delta, A, B, C, D = (t[key] for key in ("h", "x", "delta", "A", "B", "C", "D"))
            decay = torch.exp(delta[..., None] * A)
            drive = (delta * x)[..., None] * B[:, None, :]
            want_h = decay * h + drive
            want_y = (want_h * C[:, None, :]).sum(-1) + D * x
            got = attempt(fn, h.clone(), x.clone(), delta.clone(), A.clone(), B.clone(), C.clone(), D.clone())
            y, new_h = _pair(got, "the step", want_y, want_h, ("y_t", "new_h"))
            compare_with_mistakes(new_h, want_h, [
                (lambda: torch.exp(A) * h + drive, "the decay is exp(Δ_t A), not exp(A)"),
                (lambda: (1 + delta[..., None] * A) * h + drive,
                 "the decay 1 + Δ A is Euler's step; Mamba's decay is exp(Δ_t A)"),
                (lambda: decay * h + x[..., None] * B[:, None, :], "the input is not scaled by "
                 "Δ_t: the state gains (Δ_t x_t) B_t"),
                (lambda: decay * h + (delta * x)[..., None] * C[:, None, :],
                 "B and C are swapped: B_t writes the input into the state, C_t reads it out"),
                (lambda: h + drive, "the old state is not decayed: multiply it by exp(Δ_t A)"),
            ], "the new state")
            compare_with_mistakes(y, want_y, [
                (lambda: (want_h * C[:, None, :]).sum(-1), "the skip term D x_t is missing"),
                (lambda: (h * C[:, None, :]).sum(-1) + D * x,
                 "y_t reads the old state: first update h, then y_t = h_t · C_t + D x_t"),
                (lambda: (want_h * B[:, None, :]).sum(-1) + D * x,
                 "the output reads the state with B_t: C_t is the read-out, y_t = h_t · C_t + D x_t"),
                (lambda: (want_h * C[:, None, :]).sum(-1) + D * delta * x,
                 "the skip term is D x_t, without Δ"),
            ], "y_t")
        return check

    return run_checks("one selective-scan step", [
        ("batch 2, d_inner = 3, N = 4", case(2, 3, 4, 0)),
        ("batch 1, d_inner = 5, N = 2", case(1, 5, 2, 1)),
        ("batch 3, d_inner = 4, N = 4", case(3, 4, 4, 2)),
    ])
