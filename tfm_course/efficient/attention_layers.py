"""Interchangeable non-causal self-attention layers, so one model can try each variant.

``make_attention(kind, d_model, num_heads, seq_len, ...)`` returns a module mapping
``(batch, n, d_model) → (batch, n, d_model)``, n ≤ seq_len, non-causal:

* ``"softmax"`` — exact attention through PyTorch's fused kernel (:class:`MultiHeadAttention`);
* ``"softmax-naive"`` — the same maths with the n × n weights written out (``fused=False``);
* ``"window"`` — exact attention restricted to a sliding window, |i − j| ≤ ``window``, computed
  block by block (:func:`~tfm_course.efficient.sparse.sliding_window_attention`: O(n·w), so it
  gets the speed of a kernel that exploits the pattern, not the O(n²) of a dense mask);
* ``"linformer"`` — keys and values projected from length n to ``k`` (learned E, F);
* ``"performer"`` — FAVOR+ with ``num_features`` positive orthogonal random features.

All five have the same q, k, v and output projections (4·d² weights + biases); Linformer adds its
E and F (2·k·seq_len). (The causal mixers with a generation state, for chapter 11's language
models, are in :mod:`tfm_course.models.mixers`.)
"""

from __future__ import annotations

from torch import Tensor, nn

from ..attention import MultiHeadAttention, merge_heads, split_heads
from .linformer import LinformerSelfAttention
from .performer import PerformerAttention
from .sparse import sliding_window_attention

__all__ = ["ATTENTION_KINDS", "make_attention", "MaskedSelfAttention", "SlidingWindowSelfAttention"]

ATTENTION_KINDS = ("softmax", "softmax-naive", "window", "linformer", "performer")


class MaskedSelfAttention(nn.Module):
    """Self-attention with a fixed boolean ``(seq_len, seq_len)`` mask (True = may attend).

    Inputs shorter than seq_len use the mask's top-left corner.
    """

    def __init__(self, d_model: int, num_heads: int, mask: Tensor) -> None:
        super().__init__()
        if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
            raise ValueError(f"mask must be (seq_len, seq_len), got {tuple(mask.shape)}")
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        if n > self.mask.shape[0]:
            raise ValueError(f"sequence length {n} exceeds the mask's {self.mask.shape[0]}")
        return self.attn(x, mask=self.mask[:n, :n])


class SlidingWindowSelfAttention(nn.Module):
    """Multi-head self-attention over |i − j| ≤ ``window``: ``(batch, n, d_model)`` in and out.

    The projections are named as in :class:`~tfm_course.attention.MultiHeadAttention`
    (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), so their state dicts are interchangeable;
    the mixing is :func:`~tfm_course.efficient.sparse.sliding_window_attention`, which computes only
    the band of scores. Any length works: nothing is tied to a maximum n.
    """

    def __init__(self, d_model: int, num_heads: int, window: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model, self.num_heads, self.window = d_model, num_heads, window
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.v_proj, self.out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        q, k, v = (split_heads(proj(x), self.num_heads)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))  # (b, h, n, d_head)
        return self.out_proj(merge_heads(sliding_window_attention(q, k, v, self.window)))


def make_attention(kind: str, d_model: int, num_heads: int, seq_len: int, *, window: int = 16,
                   k: int = 64, num_features: int = 64) -> nn.Module:
    """A self-attention module of the given ``kind`` (one of :data:`ATTENTION_KINDS`).

    ``window``: half-width of the sliding window; ``k``: Linformer's projected length;
    ``num_features``: Performer's m. ``seq_len`` is the longest input (Linformer's E and F are
    built for it).
    """
    if kind == "softmax":
        return MultiHeadAttention(d_model, num_heads)
    if kind == "softmax-naive":
        return MultiHeadAttention(d_model, num_heads, fused=False)
    if kind == "window":
        return SlidingWindowSelfAttention(d_model, num_heads, window)
    if kind == "linformer":
        return LinformerSelfAttention(d_model, num_heads, seq_len, k=k)
    if kind == "performer":
        return PerformerAttention(d_model, num_heads, num_features=num_features)
    raise ValueError(f"kind must be one of {ATTENTION_KINDS}, got {kind!r}")
