"""Interchangeable non-causal self-attention layers, so one model can try each variant.

``make_attention(kind, d_model, num_heads, seq_len, ...)`` returns a module mapping
``(batch, n, d_model) → (batch, n, d_model)``, n ≤ seq_len, non-causal:

* ``"softmax"`` — exact attention through PyTorch's fused kernel (:class:`MultiHeadAttention`);
* ``"softmax-naive"`` — the same maths with the n × n weights written out (``fused=False``);
* ``"window"`` — exact attention restricted by a sliding-window mask, |i − j| ≤ ``window``
  (a dense mask: it shows the pattern's effect on quality, not the speed a block-sparse kernel
  would give);
* ``"linformer"`` — keys and values projected from length n to ``k`` (learned E, F);
* ``"performer"`` — FAVOR+ with ``num_features`` positive orthogonal random features.

All five have the same q, k, v and output projections (4·d² weights + biases); Linformer adds its
E and F (2·k·seq_len). (The causal mixers with a generation state, for chapter 11's language
models, are in :mod:`tfm_course.models.mixers`.)
"""

from __future__ import annotations

from torch import Tensor, nn

from ..attention import MultiHeadAttention
from .linformer import LinformerSelfAttention
from .performer import PerformerAttention
from .sparse import sliding_window_mask

__all__ = ["ATTENTION_KINDS", "make_attention", "MaskedSelfAttention"]

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


def make_attention(kind: str, d_model: int, num_heads: int, seq_len: int, *, window: int = 16,
                   k: int = 64, num_features: int = 64) -> nn.Module:
    """A self-attention module of the given ``kind`` (one of :data:`ATTENTION_KINDS`).

    ``window``: half-width of the sliding window; ``k``: Linformer's projected length;
    ``num_features``: Performer's m. ``seq_len`` is the longest input (Linformer's E, F and the
    window mask are built for it).
    """
    if kind == "softmax":
        return MultiHeadAttention(d_model, num_heads)
    if kind == "softmax-naive":
        return MultiHeadAttention(d_model, num_heads, fused=False)
    if kind == "window":
        return MaskedSelfAttention(d_model, num_heads, sliding_window_mask(seq_len, window))
    if kind == "linformer":
        return LinformerSelfAttention(d_model, num_heads, seq_len, k=k)
    if kind == "performer":
        return PerformerAttention(d_model, num_heads, num_features=num_features)
    raise ValueError(f"kind must be one of {ATTENTION_KINDS}, got {kind!r}")
