"""Sparse attention patterns (Longformer, BigBird) as boolean masks.

Each function returns a ``(n, n)`` bool mask, **True = may attend** (row = query, column = key),
that plugs straight into :func:`tfm_course.attention.scaled_dot_product_attention` or
:func:`tfm_course.attention.fused_attention`. A dense mask shows the pattern and its density but
still costs O(n²); real implementations compute only the allowed blocks (that is where the
O(n·w) cost of the papers comes from).

* sliding window — query i sees keys j with |i − j| ≤ window (2·window + 1 keys);
* global tokens (Longformer, Beltagy et al., 2020) — a few positions see everything and are seen
  by everyone;
* random keys (BigBird, Zaheer et al., 2020) — each query also sees ``num_random`` random keys.

``causal=True`` keeps only j ≤ i everywhere (a global token then sees its past only).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["sliding_window_mask", "longformer_mask", "bigbird_mask", "density"]


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
