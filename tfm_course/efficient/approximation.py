"""How close are the approximate attentions to softmax attention? Small, seeded experiments.

Each function draws random queries, keys and values whose logits ``q·k/√d`` have a chosen
standard deviation (the *logit scale*: small = nearly uniform attention, large = sharp attention),
and returns the relative error of one approximation per draw:

* :func:`performer_error` — FAVOR+ positive random features vs the exact attention matrix, as a
  function of the number of features m, i.i.d. or orthogonal, and the logit scale;
* :func:`linformer_error` — the Linformer output (or attention matrix) with a fixed projection
  E = F (segment means, or the random Gaussian projection of the paper's analysis) vs the exact
  one, as a function of k;
* :func:`low_rank_error` — the best any rank-k matrix can do (Eckart–Young, from the singular
  values): Linformer's premise, for random or *trained* attention weights;
* :func:`fixed_subspace_error` — the best rank-k approximation whose rows lie in *one* k-dim
  subspace shared by every input: what a fixed E, F can reach at best;
* :func:`kernel_estimates` — single estimates of exp(x·y) by positive or trigonometric random
  features, to see why FAVOR+ uses positive ones.

The relative error is ``‖Â − A‖_F / ‖A‖_F`` per draw. Nothing here trains anything.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from .performer import draw_projection, positive_random_features

__all__ = ["random_qkv", "uniform_error", "performer_error", "linformer_error", "low_rank_error",
           "fixed_subspace_error", "projection_errors",
           "segment_mean_projection", "relative_error", "trigonometric_random_features",
           "kernel_estimates"]


def random_qkv(n: int, d: int, logit_std: float, draws: int = 4, seed: int = 0,
               dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of shape ``(draws, n, d)`` with ``std(q·k/√d) = logit_std``.

    Entries of q and k are N(0, σ²) with σ² = logit_std (then q·k/√d has variance σ⁴); v is N(0, 1).
    Drawn on the CPU from ``seed`` (the same numbers on every device), then moved to ``device``.
    """
    if n < 1 or d < 1 or draws < 1:
        raise ValueError(f"n, d and draws must be positive, got n={n}, d={d}, draws={draws}")
    if logit_std <= 0:
        raise ValueError(f"logit_std must be positive, got {logit_std}")
    g = torch.Generator().manual_seed(seed)
    sigma = math.sqrt(logit_std)
    q, k, v = (torch.randn(draws, n, d, generator=g, dtype=dtype) for _ in range(3))
    return (sigma * q).to(device), (sigma * k).to(device), v.to(device)


def relative_error(approx: Tensor, exact: Tensor) -> Tensor:
    """``‖approx − exact‖_F / ‖exact‖_F`` over the last two dims: ``(..., a, b) → (...)``."""
    if approx.shape != exact.shape:
        raise ValueError(f"shapes differ: approx {tuple(approx.shape)}, exact {tuple(exact.shape)}")
    diff = (approx - exact).flatten(-2).norm(dim=-1)
    return diff / exact.flatten(-2).norm(dim=-1)


def _softmax_weights(q: Tensor, k: Tensor) -> Tensor:
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def uniform_error(logit_std: float = 0.25, n: int = 256, d: int = 64, draws: int = 4, seed: int = 0,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """The trivial baseline of every approximation: the relative error of *uniform* attention (each
    query averages all values, weights 1/n) against softmax attention on :func:`random_qkv`'s
    inputs, one value per draw ``(draws,)``. An approximation worse than this has learned nothing
    about which keys matter."""
    q, k, _ = random_qkv(n, d, logit_std, draws, seed, dtype)
    exact = _softmax_weights(q, k)
    return relative_error(torch.full_like(exact, 1 / n), exact)


def performer_error(num_features: int, logit_std: float = 0.25, orthogonal: bool = True,
                    n: int = 256, d: int = 64, draws: int = 4, seed: int = 0,
                    dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> Tensor:
    """Relative error of FAVOR+'s attention matrix ``D⁻¹ φ(Q) φ(K)ᵀ``, one value per draw ``(draws,)``.

    Each draw has its own inputs and its own projection (orthogonal blocks or i.i.d. rows).
    The estimator's variance grows like exp(‖q' + k'‖²) with q' = q·d^(−1/4), so at a large logit
    scale the error stays large whatever ``num_features`` is — and at a fixed logit scale it grows
    with d (‖q'‖² ≈ √d · logit_std).
    """
    q, k, _ = random_qkv(n, d, logit_std, draws, seed, dtype, device)
    g = torch.Generator().manual_seed(seed + 1)
    projection = torch.stack([draw_projection(num_features, d, orthogonal, g, device, dtype)
                              for _ in range(draws)])  # (draws, m, d)
    phi_q = positive_random_features(q, projection, is_query=True)  # (draws, n, m)
    phi_k = positive_random_features(k, projection, is_query=False)
    estimate = phi_q @ phi_k.transpose(-2, -1)
    estimate = estimate / estimate.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    return relative_error(estimate, _softmax_weights(q, k))


def segment_mean_projection(k_proj: int, n: int, dtype: torch.dtype = torch.float32,
                            device: torch.device | str | None = None) -> Tensor:
    """``(k_proj, n)``: row r averages the r-th of k_proj near-equal consecutive segments.

    As E = F in Linformer, each projected key (value) is the mean of a segment of keys (values);
    k_proj = n gives the identity, i.e. exact softmax attention.
    """
    if not 1 <= k_proj <= n:
        raise ValueError(f"k_proj must be in [1, n={n}], got {k_proj}")
    segment = torch.arange(n, device=device) * k_proj // n  # which segment each position is in
    E = (segment[None, :] == torch.arange(k_proj, device=device)[:, None]).to(dtype)
    return E / E.sum(-1, keepdim=True)


def linformer_error(k_proj: int, logit_std: float = 0.25, projection: str = "segment-mean",
                    n: int = 256, d: int = 64, draws: int = 4, seed: int = 0,
                    dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None, measure: str = "output") -> Tensor:
    """Relative error of Linformer with E = F against softmax attention, per draw ``(draws,)``.

    ``projection``: ``"segment-mean"`` (:func:`segment_mean_projection`, exact at k = n) or
    ``"gaussian"`` (entries N(0, 1/k), the random projection of the paper's analysis: untrained,
    it does not approximate softmax attention at any k — in a model E and F are learned).

    ``measure``: ``"output"`` compares ``softmax(Q (E K)ᵀ/√d) (F V)`` with the exact output;
    ``"matrix"`` compares Linformer's attention matrix ``P̄ F`` (n × n, rank ≤ k) with the exact
    weights, the same measure as :func:`low_rank_error`, which is therefore a floor under it.
    """
    if projection not in ("segment-mean", "gaussian"):
        raise ValueError(f"projection must be 'segment-mean' or 'gaussian', got {projection!r}")
    if measure not in ("output", "matrix"):
        raise ValueError(f"measure must be 'output' or 'matrix', got {measure!r}")
    q, k, v = random_qkv(n, d, logit_std, draws, seed, dtype, device)
    if projection == "segment-mean":
        E = segment_mean_projection(k_proj, n, dtype, device)
    else:
        if k_proj < 1:
            raise ValueError(f"k_proj must be positive, got {k_proj}")
        g = torch.Generator().manual_seed(seed + 1)
        E = (torch.randn(k_proj, n, generator=g, dtype=dtype) / math.sqrt(k_proj)).to(device)
    return projection_errors(q, k, v, E)[measure]


def projection_errors(q: Tensor, k: Tensor, v: Tensor, E: Tensor, F: Tensor | None = None) -> dict[str, Tensor]:
    """Linformer with fixed projections ``E`` (keys) and ``F`` (values; default ``E``), each
    ``(k_proj, n)``, against softmax attention on given ``q, k, v`` of shape ``(..., n, d)``.

    Returns relative errors of shape ``(...)``: ``"matrix"``, Linformer's attention matrix ``P̄ F``
    against the exact weights (bounded below by :func:`low_rank_error`), and ``"output"``,
    ``P̄ (F V)`` against ``softmax(q kᵀ/√d) V``: what the layer passes on. Every output row is a
    convex combination of the ``k_proj`` rows of ``F V``.
    """
    if q.shape[-2] != E.shape[-1] or k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"need q, k (..., n, d), v (..., n, d_v) and E (k_proj, n); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, E {tuple(E.shape)}")
    F = E if F is None else F
    exact = _softmax_weights(q, k)
    p_bar = torch.softmax(q @ (E @ k).transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # (..., n, k)
    return {"matrix": relative_error(p_bar @ F, exact), "output": relative_error(p_bar @ (F @ v), exact @ v)}


def _energies(a: Tensor) -> Tensor:
    """Squared singular values of each ``(..., r, c)`` matrix, descending: the eigenvalues of the
    smaller Gram matrix (aᵀa or a aᵀ), much faster than an SVD for the tall row stacks above."""
    gram = a.transpose(-2, -1) @ a if a.shape[-2] >= a.shape[-1] else a @ a.transpose(-2, -1)
    return torch.linalg.eigvalsh(gram).flip(-1).clamp_min(0)


def _tail_error(energy: Tensor, rank: int | Sequence[int]) -> Tensor:
    """sqrt(Σ_{i ≥ rank} e_i / Σ e_i) from descending energies ``(..., r)``; ranks add a last dim."""
    ranks = [rank] if isinstance(rank, int) else list(rank)
    if any(r < 0 for r in ranks):
        raise ValueError(f"rank must be non-negative, got {rank}")
    total = energy.sum(-1)
    errors = torch.stack([(energy[..., r:].sum(-1) / total).clamp_min(0).sqrt() for r in ranks], -1)
    return errors[..., 0] if isinstance(rank, int) else errors


def low_rank_error(weights: Tensor, rank: int | Sequence[int]) -> Tensor:
    """Relative error of the best rank-``rank`` approximation of each ``(..., n, n)`` matrix.

    By Eckart–Young it is ``sqrt(Σ_{i>rank} s_i² / Σ_i s_i²)`` from the singular values s: the
    floor under any rank-``rank`` method (Linformer's k), for random or trained attention weights.
    Returns ``(...)``, or ``(..., len(rank))`` for a sequence of ranks (one decomposition for all).
    """
    if weights.dim() < 2:
        raise ValueError(f"weights must be (..., n, n), got {tuple(weights.shape)}")
    return _tail_error(_energies(weights.double()), rank).to(weights.dtype)


def fixed_subspace_error(weights: Tensor, rank: int | Sequence[int]) -> Tensor:
    """Relative error of the best approximation of a *set* of matrices by one shared row space.

    ``weights``: ``(..., batch, n_q, n_k)``, e.g. one head's attention matrices for ``batch``
    inputs. All ``batch · n_q`` rows are projected onto the best ``rank``-dim subspace of R^n_k for
    all of them together (their top right singular vectors, stacked), and the error
    ``sqrt(Σ_b ‖A_b − A_b P‖² / Σ_b ‖A_b‖²)`` is returned, shape ``(...)`` (or ``(..., len(rank))``
    for a sequence of ranks).

    Why this matters for Linformer: its output is ``P̄ (F V)`` with P̄ of shape (n, k), so its
    attention matrix ``P̄ F`` has rows in the row space of F — a *fixed* k-dim subspace, the same
    for every input (E and F are weights, not functions of the input). No Linformer layer can be
    closer to these matrices than this. With ``batch = 1`` it equals :func:`low_rank_error`.
    """
    if weights.dim() < 3:
        raise ValueError(f"weights must be (..., batch, n_q, n_k), got {tuple(weights.shape)}")
    rows = weights.double().flatten(-3, -2)  # (..., batch · n_q, n_k): every row of every input
    return _tail_error(_energies(rows), rank).to(weights.dtype)


def trigonometric_random_features(x: Tensor, projection: Tensor) -> Tensor:
    """φ(x) = exp(‖x‖²/2) [sin(ω·x), cos(ω·x)] / √m: ``(..., d) → (..., 2m)``, projection ``(m, d)``.

    Random Fourier features (Rahimi & Recht, 2007) for the softmax kernel: φ(x)·φ(y) averages
    exp((‖x‖² + ‖y‖²)/2) cos(ω·(x − y)), whose expectation is exp(x·y) — but single terms can be
    negative, so the estimate of a small exp(x·y) can be negative or far off.
    """
    angles = x @ projection.transpose(-2, -1)
    scale = torch.exp((x * x).sum(-1, keepdim=True) / 2) / math.sqrt(projection.shape[-2])
    return scale * torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def kernel_estimates(x: Tensor, y: Tensor, num_features: int, draws: int = 200,
                     kind: str = "positive", orthogonal: bool = False, seed: int = 0) -> Tensor:
    """``(draws, p)`` estimates of exp(x_i · y_i) for ``p`` pairs, x and y ``(p, d)``, one fresh
    projection of ``num_features`` rows per draw. No 1/√d scaling: the kernel itself.

    ``kind``: ``"positive"`` (FAVOR+, :func:`positive_random_features` with ``stabilise=False``)
    or ``"trigonometric"`` (:func:`trigonometric_random_features`). Both are unbiased; compare
    their spread (and sign) where exp(x·y) is small.
    """
    if kind not in ("positive", "trigonometric"):
        raise ValueError(f"kind must be 'positive' or 'trigonometric', got {kind!r}")
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must both be (pairs, d); got {tuple(x.shape)} and {tuple(y.shape)}")
    d = x.shape[-1]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(draws):
        omega = draw_projection(num_features, d, orthogonal, g, x.device, x.dtype)
        if kind == "positive":  # positive_random_features scales by d^(-1/4): undo it
            phi_x = positive_random_features(x * d ** 0.25, omega, True, stabilise=False)
            phi_y = positive_random_features(y * d ** 0.25, omega, False, stabilise=False)
        else:
            phi_x = trigonometric_random_features(x, omega)
            phi_y = trigonometric_random_features(y, omega)
        out.append((phi_x * phi_y).sum(-1))
    return torch.stack(out)
