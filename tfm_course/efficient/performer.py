"""Performer (FAVOR+): softmax attention approximated with positive random features.

Choromanski et al. (2021). The softmax kernel is an expectation over Gaussian ω:

    exp(q · k) = E_ω[ exp(ω·q − ‖q‖²/2) · exp(ω·k − ‖k‖²/2) ],   ω ~ N(0, I_d)

so with m draws ω_1..ω_m, ``φ(x) = exp(ω_i·x − ‖x‖²/2) / √m`` gives ``exp(q·k) ≈ φ(q)·φ(k)``.
Applied to ``q·d^(−1/4)`` and ``k·d^(−1/4)`` this approximates softmax(q kᵀ/√d), and the output

    out = D⁻¹ φ(Q) (φ(K)ᵀ V),   D = diag(φ(Q) φ(K)ᵀ 1)

costs O(n·m·d) instead of O(n²·d): the n × n matrix is never formed. Details that matter:

* **positive** features (exp, not sin/cos) keep every estimated weight ≥ 0, so D never vanishes;
* **orthogonal** ω's (blocks of a random orthogonal matrix, rows rescaled to Gaussian norms) lower
  the variance for the same m;
* a **max subtraction** before exp: per query row (it cancels in D⁻¹); for keys one constant for
  all of them in the non-causal form, and in the causal form the maximum over the keys *so far*
  (row i's constant depends on keys j ≤ i only, so it cancels in row i and a later key cannot move
  row i's output) — without it exp overflows for large logits;
* **causal** attention uses prefix sums of φ(k_j) v_jᵀ and φ(k_j) (here per chunk, so that memory
  stays O(n·m)).

The estimator's variance grows like exp(‖q + k‖²): it is accurate for small logits and poor for
sharp attention, whatever m.

Where this code deliberately differs from the authors' code (google-research ``performer/
fast_attention``) and the most-used PyTorch port (lucidrains ``performer-pytorch``):

* **no feature eps.** Both add a constant (1e-4) to every feature, ``φ = (exp(…) + eps)/√m``, to
  keep the denominator away from 0. That adds nearly the same amount to every estimated weight,
  pulling rows towards uniform (most where the true weights are small); here the features are exact, the row maximum keeps each query's largest
  feature at 1/√m, and only the final denominator is clamped to the smallest positive float.
* **the stabilisers include −‖x‖²/2** (see :func:`positive_random_features`); the reference code
  subtracts the maximum of ω·x alone, so large-norm rows underflow to zero in float32.
* **a causal key stabiliser that is causal.** Both subtract from every key the maximum over the
  *whole sequence*, in the causal form too. That cancels in exact arithmetic, but in float32 a
  large later key pushes the earlier keys' features below the smallest float and changes earlier
  outputs (by 1.36 in ``tests/test_efficient_performer.py``), and the parallel form disagrees with
  a token-by-token decoder. Here the causal form uses the prefix maximum, as
  :meth:`~tfm_course.efficient.causal_performer.CausalPerformer.step` does with its running one.
* **the QR sign fix.** ``Q`` of a QR decomposition is not uniformly (Haar) distributed unless each
  column is multiplied by the sign of R's diagonal; the reference code skips this (the port has it
  as an option, ``qr_uniform_q``, off by default). :func:`draw_projection` always applies it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["draw_projection", "positive_random_features", "favor_attention", "PerformerAttention"]


def draw_projection(num_features: int, dim: int, orthogonal: bool = True,
                    generator: torch.Generator | None = None,
                    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Random directions ω, shape ``(num_features, dim)``, each row distributed like N(0, I).

    ``orthogonal=True`` stacks independent random orthogonal d × d blocks (QR of a Gaussian
    matrix) and rescales every row to the norm of an independent Gaussian vector (χ_d-distributed),
    so each row is still N(0, I) but rows within a block are exactly orthogonal.
    Drawn on the generator's device (CPU by default) and moved to ``device``.
    """
    if num_features < 1 or dim < 1:
        raise ValueError(f"num_features and dim must be positive, got {num_features} and {dim}")
    gen_device = generator.device if generator is not None else torch.device("cpu")

    def gaussian(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, device=gen_device, dtype=torch.float32)

    if not orthogonal:
        omega = gaussian(num_features, dim)
    else:
        q, r = torch.linalg.qr(gaussian(math.ceil(num_features / dim), dim, dim))  # all blocks at once
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]  # sign fix: Haar rows
        directions = q.transpose(-2, -1).reshape(-1, dim)[:num_features]  # rows of each block
        omega = directions * gaussian(num_features, dim).norm(dim=1, keepdim=True)
    return omega.to(device=device, dtype=dtype)


def positive_random_features(x: Tensor, projection: Tensor, is_query: bool,
                             stabilise: bool = True) -> Tensor:
    """φ(x) = exp(ω·x' − ‖x'‖²/2 − c) / √m with x' = x · d^(−1/4); ``(..., n, d) → (..., n, m)``.

    ``projection`` is ``(m, d)``, or ``(..., m, d)`` broadcasting against x's leading dims (an
    independent draw per batch element or head).

    The stabiliser c is the maximum of the whole exponent ω·x' − ‖x'‖²/2: over the features of
    each row for queries, over the whole sequence (and features) for keys — right for
    non-causal attention only; the causal form in :func:`favor_attention` stabilises each key
    by the maximum over the keys up to it instead. A query's c scales
    its numerator and its denominator alike, and the keys' c is one constant for all of them, so
    both cancel in the normalised attention. Keeping −‖x'‖²/2 *inside* the maximum matters: for a
    large-norm query every exp(ω·x' − c − ‖x'‖²/2) would otherwise underflow to 0 in float32 and
    the row would come out all zeros; this way its largest feature is exactly 1/√m.
    ``stabilise=False`` gives the textbook formula (c = 0): then φ(q)·φ(k) is an unbiased estimate
    of exp(q·k/√d) itself.
    """
    dim, m = x.shape[-1], projection.shape[-2]
    x = x * dim ** -0.25
    logits = x @ projection.transpose(-2, -1)  # (..., n, m)
    exponent = logits - (x * x).sum(-1, keepdim=True) / 2  # ω·x' − ‖x'‖²/2
    if not stabilise:
        return torch.exp(exponent) / math.sqrt(m)
    if is_query:
        stabiliser = exponent.amax(dim=-1, keepdim=True)  # per row: cancels in D⁻¹
    else:
        stabiliser = exponent.amax(dim=(-2, -1), keepdim=True)  # one constant for all keys
    return torch.exp(exponent - stabiliser.detach()) / math.sqrt(m)


def _log_features(x: Tensor, projection: Tensor) -> Tensor:
    """log(√m · φ(x)) = ω·x' − ‖x'‖²/2 with x' = x · d^(−1/4): ``(..., n, d) → (..., n, m)``."""
    x = x * x.shape[-1] ** -0.25
    return x @ projection.transpose(-2, -1) - (x * x).sum(-1, keepdim=True) / 2


def _causal_linear_attention(phi_q: Tensor, log_k: Tensor, v: Tensor, chunk_size: int) -> Tensor:
    """out_i = Σ_{j≤i} (φ(q_i)·φ(k_j)) v_j / Σ_{j≤i} φ(q_i)·φ(k_j), with φ(k_j) = exp(log_k_j).

    Stabilised by the **prefix maximum** c_i = max_{j≤i} max_f log_k_jf, which depends on keys
    j ≤ i only: every term of row i is multiplied by the same e^(−c_i), so it cancels exactly
    between numerator and denominator, and a later key cannot change row i (a maximum over the
    whole sequence cancels too, but only in exact arithmetic: a large later key pushes the earlier
    keys' features below float32's range and the earlier rows change). Written as
    e^(log_k_j − c_i) = e^(log_k_j − c_j) · e^(c_j − c_i), both factors ≤ 1, so nothing overflows.
    These are the numbers :meth:`CausalPerformer.step` computes with its running maximum.

    Inside a chunk the masked quadratic form; across chunks each chunk's sums Σ φ(k) vᵀ and Σ φ(k)
    are kept relative to the prefix maximum at its last token, C_s, and chunk t reads
    Σ_{s<t} e^(C_s − C_{t−1}) · (sums of s) — a (chunks × chunks) lower-triangular mix in place of
    a cumsum, since the factors differ per chunk — then multiplies by e^(C_{t−1} − c_i).
    Shapes: phi_q, log_k ``(..., n, m)``, v ``(..., n, d_v)`` → ``(..., n, d_v)``.
    """
    n = phi_q.shape[-2]
    pad = (-n) % chunk_size
    c = log_k.amax(-1).cummax(-1).values  # (..., n): prefix maximum over keys and features
    phi_k = torch.exp(log_k - c[..., None])  # φ(k_j) · e^(−c_j), every entry ≤ 1
    c = torch.cat([c, c[..., -1:].expand(*c.shape[:-1], pad)], -1)  # padded rows: cut off below

    def chunks(t: Tensor) -> Tensor:  # (..., n, f) → (..., n_chunks, chunk, f)
        return F.pad(t, (0, 0, 0, pad)).unflatten(-2, (-1, chunk_size))

    pq, pk, vv = chunks(phi_q), chunks(phi_k), chunks(v)  # padded keys: zero features
    cc = c.unflatten(-1, (-1, chunk_size))  # (..., n_chunks, chunk)
    tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    rescale = (cc[..., None, :] - cc[..., :, None]).masked_fill(~tril, float("-inf")).exp()
    local = (pq @ pk.transpose(-2, -1)) * rescale  # e^(c_j − c_i) for j ≤ i, 0 above the diagonal
    last = cc[..., -1]  # C_s, (..., n_chunks)
    pk_last = pk * torch.exp(cc - last[..., None])[..., None]  # relative to C_s
    kv = pk_last.transpose(-2, -1) @ vv  # per chunk Σ φ(k) vᵀ: (..., n_chunks, m, d_v)
    ksum = pk_last.sum(-2)  # (..., n_chunks, m)
    # C_{t−1}; chunk 0 reads nothing, and its first c keeps e^(C_{t−1} − c_i) ≤ 1 there too
    before = torch.cat([cc[..., :1, 0], last[..., :-1]], -1)
    n_chunks = last.shape[-1]
    strict = torch.ones(n_chunks, n_chunks, dtype=torch.bool, device=v.device).tril(-1)
    mix = (last[..., None, :] - before[..., :, None]).masked_fill(~strict, float("-inf")).exp()
    kv_before = (mix @ kv.flatten(-2)).view_as(kv)  # Σ_{s<t} e^(C_s − C_{t−1}) kv_s
    ksum_before = mix @ ksum
    row = torch.exp(before[..., None] - cc)[..., None]  # e^(C_{t−1} − c_i) ≤ 1, (..., chunks, chunk, 1)
    num = local @ vv + row * (pq @ kv_before)
    den = local.sum(-1) + row[..., 0] * (pq @ ksum_before[..., None]).squeeze(-1)
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]
    return out.flatten(-3, -2)[..., :n, :]


def favor_attention(q: Tensor, k: Tensor, v: Tensor, num_features: int, causal: bool = False,
                    orthogonal: bool = True, generator: torch.Generator | None = None,
                    projection: Tensor | None = None, chunk_size: int = 64) -> Tensor:
    """FAVOR+ approximation of softmax(q kᵀ / √d) v, optionally causal.

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, d_v)`` (usually ``(batch, heads, n, d)``).
        num_features: m, the number of random features.
        causal: attend only to keys j ≤ i (prefix-sum form).
        orthogonal, generator: how to draw the projection when none is given.
        projection: a fixed ``(num_features, d)`` draw (from :func:`draw_projection`), so that
            repeated calls (or a module) use the same features; ``(..., num_features, d)``
            broadcasting against q's leading dims gives each batch element / head its own draw.
        chunk_size: block length of the causal prefix sums (memory vs. loop length; same result).

    Returns ``(..., n, d_v)`` in q's dtype; features are computed in float32 even under autocast.
    """
    if q.dim() < 2 or q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (..., n, d); got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must be (..., n, d_v) with (..., n) = {tuple(k.shape[:-1])}; "
                         f"got {tuple(v.shape)}")
    if projection is None:
        projection = draw_projection(num_features, q.shape[-1], orthogonal, generator, q.device)
    lead = q.shape[:-2]
    try:
        fits = torch.broadcast_shapes(projection.shape[:-2], lead) == lead
    except RuntimeError:
        fits = False
    if projection.dim() < 2 or projection.shape[-2:] != (num_features, q.shape[-1]) or not fits:
        raise ValueError(f"projection must be (num_features, d) = {(num_features, q.shape[-1])}, "
                         f"optionally with leading dims broadcasting to {tuple(lead)}; "
                         f"got {tuple(projection.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, projection = q.to(work), k.to(work), v.to(work), projection.to(work)
        phi_q = positive_random_features(q, projection, is_query=True)  # (..., n, m)
        if causal:  # keys stabilised by their prefix maximum (see _causal_linear_attention)
            out = _causal_linear_attention(phi_q, _log_features(k, projection), v, chunk_size)
        else:
            phi_k = positive_random_features(k, projection, is_query=False)
            num = phi_q @ (phi_k.transpose(-2, -1) @ v)  # (n, m)(m, d_v): never n × n
            den = phi_q @ phi_k.sum(-2)[..., None]  # (..., n, 1)
            out = num / den.clamp_min(torch.finfo(den.dtype).tiny)
    return out.to(dtype)


class PerformerAttention(nn.Module):
    """Multi-head self-attention whose softmax is replaced by FAVOR+.

    ``(batch, n, d_model) → (batch, n, d_model)``. The random projection is a buffer (saved with
    the model, moved with ``.to()``); call :meth:`redraw_features` to draw a fresh one, e.g. every
    few hundred training steps as the paper does.
    """

    def __init__(self, d_model: int, num_heads: int, num_features: int = 64, causal: bool = False,
                 orthogonal: bool = True, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.num_features, self.causal, self.orthogonal = num_features, causal, orthogonal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.register_buffer("projection", draw_projection(num_features, self.d_head, orthogonal,
                                                           generator))

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Replace the random projection by a fresh draw (same shape, device and dtype)."""
        new = draw_projection(self.num_features, self.d_head, self.orthogonal, generator)
        self.projection.copy_(new)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.d_head).permute(2, 0, 3, 1, 4)
        out = favor_attention(q, k, v, self.num_features, causal=self.causal,
                              projection=self.projection)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, self.d_model))
