"""Exact attention, tile by tile: the online softmax behind FlashAttention, in plain PyTorch.

Dao et al. (2022). Softmax attention needs every score of a row before it can normalise, which
seems to force the n × n matrix into memory. It does not: keep, for each query row, a running
maximum ``m``, a running sum ``l = Σ exp(s − m)`` and a running output ``acc = Σ exp(s − m) v``.
A new tile of scores s' with values V' updates them as

    m_new = max(m, max s')                      (the largest score seen so far)
    l     = exp(m − m_new) · l   + Σ exp(s' − m_new)
    acc   = exp(m − m_new) · acc + exp(s' − m_new) V'

and after the last tile ``out = acc / l`` equals softmax(s) V exactly (up to rounding): the factor
``exp(m − m_new)`` re-expresses what was summed against the old maximum against the new one.
Only a (block × block) tile of scores exists at any time, so memory is O(n·d), not O(n²).

:func:`tiled_attention` loops over query blocks and key blocks. Its backward pass is written by
hand, as in the paper: the forward saves only q, k, v, the output and each row's log-sum-exp
``m + log l``; the backward recomputes each tile's probabilities from them instead of storing the
n × n matrix, so training memory is O(n·d) too. What this file does *not* have is the speed: the
real kernels fuse the loop into one GPU program that keeps tiles in on-chip SRAM; a Python loop of
small matmuls is slower than the naive path. It shows the algorithm, not the kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["tiled_attention", "online_softmax_step"]


def online_softmax_step(m: Tensor, l: Tensor, acc: Tensor, scores: Tensor,
                        values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one tile of keys into the running softmax state of each query row.

    Args:
        m, l: ``(..., n_q, 1)`` running maximum and running sum Σ exp(s − m) (start: −inf and 0).
        acc: ``(..., n_q, d_v)`` running Σ exp(s − m) v (start: 0).
        scores: ``(..., n_q, t)`` this tile's scaled scores (−inf where masked).
        values: ``(..., t, d_v)`` this tile's values.

    Returns the new ``(m, l, acc)``; after the last tile, ``acc / l`` is the attention output.
    A row whose scores so far are all −inf keeps m = −inf and l = acc = 0 (no NaN).
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    shift = m_new.masked_fill(m_new == -math.inf, 0.0)  # all −inf so far: exp(−inf − 0) = 0
    rescale = torch.exp(m - shift)  # re-express the old sums against the new maximum
    p = torch.exp(scores - shift)  # (..., n_q, t): this tile's unnormalised weights
    return m_new, rescale * l + p.sum(dim=-1, keepdim=True), rescale * acc + p @ values


def _tile_scores(q_blk: Tensor, k_blk: Tensor, scale: float, causal: bool, q_start: int,
                 k_start: int) -> Tensor:
    """Scaled scores of one (query block, key block) tile, −inf above the diagonal if causal."""
    scores = (q_blk @ k_blk.transpose(-2, -1)) * scale  # (..., bq, bk)
    if causal and k_start + k_blk.shape[-2] - 1 > q_start:  # the tile reaches above the diagonal
        rows = torch.arange(q_start, q_start + q_blk.shape[-2], device=q_blk.device)
        cols = torch.arange(k_start, k_start + k_blk.shape[-2], device=q_blk.device)
        scores = scores.masked_fill(cols[None, :] > rows[:, None], -math.inf)
    return scores


def _key_blocks(q_start: int, q_len: int, n_k: int, block: int, causal: bool) -> range:
    """Start indices of the key blocks a query block needs (causal: none past its last row)."""
    stop = min(n_k, q_start + q_len) if causal else n_k
    return range(0, stop, block)


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, block: int,
             scale: float) -> tuple[Tensor, Tensor]:
    """Output ``(..., n_q, d_v)`` and per-row log-sum-exp ``(..., n_q, 1)``, tile by tile."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    outs, lses = [], []
    for i in range(0, n_q, block):
        q_blk = q[..., i:i + block, :]
        m = q_blk.new_full((*q_blk.shape[:-1], 1), -math.inf)
        l = q_blk.new_zeros((*q_blk.shape[:-1], 1))
        acc = q_blk.new_zeros((*q_blk.shape[:-1], v.shape[-1]))
        for j in _key_blocks(i, q_blk.shape[-2], n_k, block, causal):
            scores = _tile_scores(q_blk, k[..., j:j + block, :], scale, causal, i, j)
            m, l, acc = online_softmax_step(m, l, acc, scores, v[..., j:j + block, :])
        outs.append(acc / l)
        lses.append(m + torch.log(l))
    if not outs:  # no query rows
        return q.new_zeros((*q.shape[:-1], v.shape[-1])), q.new_zeros((*q.shape[:-1], 1))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)


def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              causal: bool, block: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv by recomputing each tile's probabilities P = exp(S − lse).

    With O = P V: dV = Pᵀ dO, dP = dO Vᵀ, and the softmax backward dS = P ⊙ (dP − δ) where
    δ_i = Σ_j P_ij dP_ij = dO_i · O_i; then dQ = dS K · scale and dK = dSᵀ Q · scale.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., n_q, 1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(0, n_q, block):
        q_blk, do_blk = q[..., i:i + block, :], grad_out[..., i:i + block, :]
        lse_blk, delta_blk = lse[..., i:i + block, :], delta[..., i:i + block, :]
        for j in _key_blocks(i, q_blk.shape[-2], n_k, block, causal):
            k_blk, v_blk = k[..., j:j + block, :], v[..., j:j + block, :]
            p = torch.exp(_tile_scores(q_blk, k_blk, scale, causal, i, j) - lse_blk)
            dv[..., j:j + block, :] += p.transpose(-2, -1) @ do_blk
            ds = p * (do_blk @ v_blk.transpose(-2, -1) - delta_blk)
            dq[..., i:i + block, :] += (ds @ k_blk) * scale
            dk[..., j:j + block, :] += (ds.transpose(-2, -1) @ q_blk) * scale
    return dq, dk, dv


class _TiledAttention(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, out and the log-sum-exp, never the n × n weights."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, block: int,  # noqa: ANN001
                scale: float) -> Tensor:
        out, lse = _forward(q, k, v, causal, block, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block, ctx.scale = causal, block, scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(grad_out.contiguous(), q, k, v, out, lse, ctx.causal, ctx.block,
                               ctx.scale)
        return dq, dk, dv, None, None, None


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                    block_size: int = 64) -> Tensor:
    """softmax(q kᵀ / √d) v computed tile by tile with the online softmax; exact.

    Args:
        q: ``(..., n_q, d)``; k: ``(..., n_k, d)``; v: ``(..., n_k, d_v)``, the same leading dims
            (e.g. ``(batch, heads)``).
        causal: query i attends to keys j ≤ i (needs n_q = n_k).
        block_size: rows per query block and per key block; need not divide n.

    Returns ``(..., n_q, d_v)`` in q's dtype; the arithmetic runs in float32 (float64 stays
    float64). Peak memory holds one ``(..., block, block)`` tile of scores, in the forward and in
    the hand-written backward alike (it recomputes the tiles; see the module docstring).
    """
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(f"q, k, v must be (..., n, d); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or v.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading dims (...); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d: q {tuple(q.shape)} (..., n_q, d), "
                         f"k {tuple(k.shape)} (..., n_k, d)")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys: k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs n_q = n_k; got n_q = {q.shape[-2]}, "
                         f"n_k = {k.shape[-2]}")
    if k.shape[-2] == 0:
        raise ValueError(f"attention needs at least one key; got k {tuple(k.shape)}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=q.device.type, enabled=False):
        out = _TiledAttention.apply(q.to(work), k.to(work), v.to(work), causal, block_size,
                                    1.0 / math.sqrt(q.shape[-1]))
    return out.to(dtype)
