"""Linformer: self-attention with keys and values projected from length n down to k.

Wang et al. (2020) observe that the n × n attention matrix is approximately low-rank, and project
the *sequence* axis of the keys and values with learned matrices E, F ∈ R^(k×n):

    head = softmax( Q (E K)ᵀ / √d ) (F V)        scores (n × k) instead of (n × n): O(n·k)

Consequences worth knowing before using it:

* it is **not causal**: each projected key mixes all positions, future ones included;
* it is tied to a **maximum length n** (E and F have n columns). Shorter inputs use the first
  columns — the same as padding the keys and values with zeros;
* with k = n and E = F = I it is exactly softmax attention.

Sharing (as in the paper): ``"none"`` — an E_h and F_h per head; ``"headwise"`` — one E and one F
per layer; ``"kv"`` — one matrix for both E and F; ``"layerwise"`` — pass the same ``projection``
parameter to every layer's constructor (one matrix for all layers, heads, keys and values).

Where this code deliberately differs from the authors' fairseq code
(``examples/linformer/.../multihead_linear_attention.py``):

* **initialisation of E and F.** fairseq stores them as ``nn.Linear(n, k)`` weights drawn
  Xavier-uniform with gain 1/√2, i.e. U(±√(3/(n + k))), variance 1/(n + k). Here entries are
  N(0, 1/k), the random projection of the paper's proof (Johnson–Lindenstrauss): ‖E x‖ ≈ ‖x‖
  for every column x ∈ Rⁿ of K or V.
* **where E is applied.** fairseq projects the layer input along the sequence and applies the key
  and value projections afterwards, ``(E X) W_K + b``; here ``E (X W_K + b)``. The two are equal
  without the bias and differ by ``(E 1 − 1) b`` with it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["linformer_attention", "LinformerSelfAttention", "SHARING"]

SHARING = ("none", "headwise", "kv")


def _project(x: Tensor, proj: Tensor) -> Tensor:
    """Project the sequence axis: x ``(b, h, n, d)``, proj ``(k, n_max)`` or ``(h, k, n_max)``."""
    return proj[..., : x.shape[-2]] @ x  # (…, k, n) @ (b, h, n, d) → (b, h, k, d)


def linformer_attention(q: Tensor, k: Tensor, v: Tensor, E: Tensor,
                        F: Tensor | None = None) -> Tensor:
    """softmax(q (E k)ᵀ / √d) (F v) for every head.

    Args:
        q, k: ``(batch, heads, n, d)``; v: ``(batch, heads, n, d_v)``.
        E: ``(k_proj, n_max)`` shared by all heads, or ``(heads, k_proj, n_max)`` one per head.
        F: the same shape as E; default E (key = value sharing).

    Inputs shorter than ``n_max`` use E[..., :n]; longer ones raise ``ValueError``.
    Returns ``(batch, heads, n, d_v)``.
    """
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be (batch, heads, n, d); got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (batch, heads, n, d_v) = {tuple(q.shape[:3])} + (d_v,); "
                         f"got {tuple(v.shape)}")
    F = E if F is None else F
    heads, n = q.shape[1], q.shape[2]
    for name, P in (("E", E), ("F", F)):
        if P.shape != E.shape or not (P.dim() == 2 or (P.dim() == 3 and P.shape[0] == heads)):
            raise ValueError(f"{name} must be (k_proj, n_max) or (heads={heads}, k_proj, n_max) "
                             f"and E, F must match; got E {tuple(E.shape)}, F {tuple(F.shape)}")
    if n > E.shape[-1]:
        raise ValueError(f"sequence length {n} exceeds the Linformer's configured n_max = "
                         f"{E.shape[-1]} (E is {tuple(E.shape)})")
    k_low, v_low = _project(k, E), _project(v, F)  # (b, h, k_proj, d)
    scores = q @ k_low.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, h, n, k_proj)
    work = torch.promote_types(scores.dtype, torch.float32)  # softmax in at least fp32
    return torch.softmax(scores.to(work), dim=-1).to(v.dtype) @ v_low


class LinformerSelfAttention(nn.Module):
    """Multi-head Linformer self-attention: ``(batch, n, d_model) → (batch, n, d_model)``, n ≤ seq_len

    Args:
        d_model, num_heads: as for :class:`tfm_course.attention.MultiHeadAttention`.
        seq_len: the maximum length n the projections are built for.
        k: the projected length (the paper uses 128–256).
        sharing: ``"none"`` (E_h, F_h per head), ``"headwise"`` (E, F per layer), ``"kv"`` (E = F).
        projection: an existing ``(k, seq_len)`` parameter to use as E = F (layerwise sharing:
            create it once and pass it to every layer); overrides ``sharing``.
        causal: must stay False — Linformer cannot be causal, so True raises ``ValueError``.
    """

    def __init__(self, d_model: int, num_heads: int, seq_len: int, k: int = 128,
                 sharing: str = "headwise", projection: nn.Parameter | None = None, causal: bool = False) -> None:
        super().__init__()
        if causal:
            raise ValueError("Linformer cannot be causal: its projection E mixes every position, "
                             "future ones included, into each projected key")
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        if sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {sharing!r}")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.seq_len, self.k, self.sharing = seq_len, k, sharing
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

        def new(*shape: int) -> nn.Parameter:  # JL-style init: entries N(0, 1/k)
            return nn.Parameter(torch.randn(*shape) / math.sqrt(k))

        self.E: nn.Parameter | None = None
        self.F: nn.Parameter | None = None
        if projection is not None:
            if projection.shape != (k, seq_len):
                raise ValueError(f"a shared projection must be (k, seq_len) = {(k, seq_len)}, "
                                 f"got {tuple(projection.shape)}")
            self.E, self.sharing = projection, "layerwise"
        elif sharing == "none":
            self.E, self.F = new(num_heads, k, seq_len), new(num_heads, k, seq_len)
        elif sharing == "headwise":
            self.E, self.F = new(k, seq_len), new(k, seq_len)
        else:
            self.E = new(k, seq_len)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:
            raise ValueError("Linformer takes no attention mask: it cannot be causal, and a key "
                             "mask means nothing once E has mixed the keys (pad with zeros instead)")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.d_head).permute(2, 0, 3, 1, 4)
        out = linformer_attention(q, k, v, self.E, self.F)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, self.d_model))
