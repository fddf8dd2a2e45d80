"""Sparse attention patterns (Longformer, BigBird) as boolean masks.

Each function returns a ``(n, n)`` bool mask, **True = may attend** (row = query, column = key),
that plugs straight into :func:`tfm_course.attention.scaled_dot_product_attention` or
:func:`tfm_course.attention.fused_attention`. A dense mask shows the pattern and its density but
still costs O(n²): the kernel computes every score and then throws most away. Real
implementations compute only the allowed blocks (that is where the O(n·w) cost of the papers
comes from); :func:`sliding_window_attention` does so for the window, in plain PyTorch.

* sliding window — query i sees keys j with |i − j| ≤ window (2·window + 1 keys);
* global tokens (Longformer, Beltagy et al., 2020) — a few positions see everything and are seen
  by everyone;
* random keys (BigBird, Zaheer et al., 2020) — each query also sees ``num_random`` random keys.

``causal=True`` keeps only j ≤ i everywhere (a global token then sees its past only).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sliding_window_mask", "longformer_mask", "bigbird_mask", "density",
           "sliding_window_attention"]


def _check_n(n: int, window: int) -> None:
    if n < 1:
        raise ValueError(f"sequence length n must be positive, got {n}")
    if window < 0:
        raise ValueError(f"window must be non-negative (|i − j| ≤ window), got {window}")


def _global_index(global_tokens: int | Sequence[int] | Tensor, n: int,
                  device: torch.device | str | None) -> Tensor:
    if isinstance(global_tokens, int):
        if not 0 <= global_tokens <= n:
            raise ValueError(f"the number of global tokens must be in [0, n={n}], "
                             f"got {global_tokens}")
        return torch.arange(global_tokens, device=device)
    index = torch.as_tensor(global_tokens, dtype=torch.long, device=device).flatten()
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
        raise ValueError(f"global token positions must lie in [0, {n}), got {index.tolist()}")
    return index


def sliding_window_mask(n: int, window: int, causal: bool = False,
                        device: torch.device | str | None = None) -> Tensor:
    """``(n, n)``: True where |i − j| ≤ window (and j ≤ i if causal)."""
    _check_n(n, window)
    pos = torch.arange(n, device=device)
    distance = pos[:, None] - pos[None, :]  # i − j
    mask = distance.abs() <= window
    return mask & (distance >= 0) if causal else mask


def longformer_mask(n: int, window: int, global_tokens: int | Sequence[int] | Tensor = 1,
                    causal: bool = False, device: torch.device | str | None = None) -> Tensor:
    """Sliding window plus global tokens: ``(n, n)`` bool.

    ``global_tokens`` is a count (the first positions, e.g. [CLS]) or a list of positions. Global
    rows attend to every key and global columns are visible to every query; without ``causal`` the
    mask is symmetric.
    """
    mask = sliding_window_mask(n, window, device=device)
    index = _global_index(global_tokens, n, device)
    mask[index, :] = True  # global tokens see everything
    mask[:, index] = True  # everyone sees the global tokens
    return mask & torch.ones_like(mask).tril() if causal else mask


def bigbird_mask(n: int, window: int, global_tokens: int | Sequence[int] | Tensor = 1,
                 num_random: int = 2, causal: bool = False,
                 generator: torch.Generator | None = None, device: torch.device | str | None = None) -> Tensor:
    """Window + global + random: ``(n, n)`` bool.

    Each query row gets ``num_random`` extra keys drawn uniformly, without replacement, from the
    keys the window-and-global pattern does not already allow (from j ≤ i when causal), or all
    of them if fewer remain. Random keys are drawn per row, so the mask is not symmetric.
    Drawn on the CPU with ``generator`` (reproducible), then moved to ``device``.
    """
    if num_random < 0:
        raise ValueError(f"num_random must be non-negative, got {num_random}")
    base = longformer_mask(n, window, global_tokens, causal=causal)  # CPU
    candidates = ~base
    if causal:
        candidates &= torch.ones_like(base).tril()
    # a random score per candidate key; the num_random largest per row are the chosen keys
    scores = torch.rand(n, n, generator=generator).masked_fill(~candidates, -1.0)
    take = min(num_random, n)
    chosen = torch.zeros_like(base)
    if take:
        top = scores.topk(take, dim=-1).indices  # (n, take)
        chosen.scatter_(1, top, True)
        chosen &= candidates  # rows with fewer candidates than num_random take all they have
    return (base | chosen).to(device)


def density(mask: Tensor) -> float:
    """Fraction of (query, key) pairs allowed: 1.0 for dense attention, ~(2w + 1)/n for a window."""
    return float(mask.float().mean())


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool = False,
                             block_size: int | None = None) -> Tensor:
    """Exact attention restricted to |i − j| ≤ window (j ≤ i too if causal), in O(n·w) memory.

    The same output as ``fused_attention(q, k, v, sliding_window_mask(n, window, causal))``, but
    only the scores inside the band are computed: the queries are cut into blocks of
    ``block_size`` rows (default ``max(window, 1)``), and block b reads the ``block_size + 2·window``
    keys from ``b·block_size − window`` on — one strided view (``unfold``) of the zero-padded keys,
    no Python loop. Scores: ``(..., n / block_size, block_size, block_size + 2·window)``, i.e.
    about 3·n·window numbers instead of n².

    Args:
        q, k: ``(..., n, d)``; v: ``(..., n, d_v)`` (e.g. ``(batch, heads, n, d)``).
        window: half-width w ≥ 0 (each query sees up to 2w + 1 keys; w + 1 if causal).
        block_size: query rows per block (memory ~ n·(block_size + 2w); any positive size gives
            the same result).

    Returns ``(..., n, d_v)``.
    """
    if q.dim() < 2 or q.shape != k.shape or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"q and k must be (..., n, d) and v (..., n, d_v) with the same (..., n); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative integer (|i − j| ≤ window), got {window!r}")
    block = max(window, 1) if block_size is None else block_size
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    n = q.shape[-2]
    if n == 0:
        return q.new_zeros((*q.shape[:-1], v.shape[-1]))
    blocks = -(-n // block)  # ceil(n / block)
    span = block + 2 * window  # keys one query block reads

    def key_windows(x: Tensor) -> Tensor:  # (..., n, c) → (..., blocks, span, c), a strided view
        padded = F.pad(x, (0, 0, window, blocks * block - n + window))
        return padded.unfold(-2, span, block).transpose(-2, -1)

    q_blocks = F.pad(q, (0, 0, 0, blocks * block - n)).unflatten(-2, (blocks, block))
    scores = (q_blocks / math.sqrt(q.shape[-1])) @ key_windows(k).transpose(-2, -1)
    # row r of block b is query i = b·block + r; column c is key j = b·block + c − window
    r = torch.arange(block, device=q.device)[:, None]
    c = torch.arange(span, device=q.device)[None, :]
    offset = c - r  # j − i + window
    allowed = (offset >= 0) & (offset <= (window if causal else 2 * window))
    j = torch.arange(blocks, device=q.device)[:, None, None] * block + c - window
    allowed = allowed & (j >= 0) & (j < n)  # (blocks, block, span): no padding keys
    # a finite minimum, not −inf: padded query rows past n may have no key left; their (unused)
    # softmax is then uniform instead of NaN, which would leak into the keys' gradients
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    work = torch.promote_types(scores.dtype, torch.float32)  # softmax in at least float32
    weights = torch.softmax(scores.to(work), dim=-1).to(v.dtype)
    out = weights @ key_windows(v)  # (..., blocks, block, d_v)
    return out.flatten(-3, -2)[..., :n, :]
