"""The Performer as a causal sequence mixer: FAVOR+ with rotary positions, run in parallel over a
sequence or one token at a time with a fixed-size state.

    mixer = CausalPerformer(d_model=64, num_heads=4)        # num_features: 2 · d_head by default
    y = mixer(x)                                            # (batch, L, d_model) → (batch, L, d_model)
    y_t, state = mixer.step(x_t, state)                     # x_t (batch, d_model); state None at first

The parallel form is :func:`~tfm_course.efficient.performer.favor_attention` with ``causal=True``
(prefix sums per chunk); the recurrent form keeps the running sums Σ φ(k) vᵀ and Σ φ(k), whose
size does not grow with the context, unlike a KV cache. Both are stabilised by the largest key
log-feature so far (never a later one), so they give the same outputs (the tests check it, over a
whole sequence with key norms that vary widely). :func:`~tfm_course.models.mixers.make_mixer` builds it as ``"performer"``.

``short_conv=k`` (None or 0: off, the default) adds a causal depthwise convolution of width k and a
SiLU on q, k and v after their projection, before the rotation and the feature map, as
flash-linear-attention does in its retention, GLA and DeltaNet layers (``use_short_conv``)
(:class:`~tfm_course.efficient.short_conv.ShortConvolution`); ``step`` then also carries its window
of the last k − 1 projected tokens. The Performer paper has no such convolution.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..attention import merge_heads
from ..positional import RotaryEmbedding
from .performer import PerformerAttention, favor_attention
from .short_conv import short_convolution

__all__ = ["PerformerState", "CausalPerformer"]


class PerformerState(NamedTuple):
    """Running sums of one Performer layer, stored relative to ``exp(shift)`` to avoid overflow.

    ``kv`` ``(batch, heads, m, d_head)`` = Σ φ(k_j) v_jᵀ · e^(−shift), ``k_sum`` ``(batch, heads,
    1, m)`` = Σ φ(k_j) · e^(−shift), ``shift`` ``(batch, heads, 1, 1)`` the largest log-feature seen,
    ``position`` the index of the next token (for the rotation), ``conv`` the short convolution's
    window ``(batch, k − 1, 3·d_model)`` (None without one).
    """

    kv: Tensor
    k_sum: Tensor
    shift: Tensor
    position: int
    conv: Tensor | None = None


class CausalPerformer(PerformerAttention):
    """Causal FAVOR+ attention (:class:`~tfm_course.efficient.performer.PerformerAttention`) with
    RoPE applied to q and k before the random features, so that φ(q)·φ(k) estimates the same
    rotary softmax kernel as :class:`~tfm_course.models.mixers.CausalAttention`.

    ``step`` is the recurrent form: out_t = φ(q_t) S_t / φ(q_t) z_t with S_t = Σ_{j≤t} φ(k_j) v_jᵀ
    and z_t = Σ_{j≤t} φ(k_j), kept relative to the largest log-feature so far (an online max, as
    in flash attention), so that exp never overflows; the constant 1/√m cancels and is left out.
    """

    def __init__(self, d_model: int, num_heads: int, num_features: int | None = None,
                 generator: torch.Generator | None = None, short_conv: int | None = None) -> None:
        d_head = d_model // num_heads
        super().__init__(d_model, num_heads, num_features or 2 * d_head, causal=True,
                         generator=generator)
        self.rotary = RotaryEmbedding(self.d_head)
        self.qkv_conv = short_convolution(3 * d_model, short_conv)  # None when off

    def _qkv(self, x: Tensor, position: int, window: Tensor | None = None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x ``(batch, n, d_model)`` → q, k, v ``(batch, heads, n, d_head)`` (q, k rotated) and the
        short convolution's new window (None if off)."""
        b, n, _ = x.shape
        qkv = self.qkv(x)
        if self.qkv_conv is not None:  # after the projection, before the rotation and φ
            qkv, window = self.qkv_conv(qkv, window)
        q, k, v = qkv.view(b, n, 3, self.num_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return self.rotary.rotate(q, position), self.rotary.rotate(k, position), v, window

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        q, k, v, _ = self._qkv(x, 0)
        out = favor_attention(q, k, v, self.num_features, causal=True, projection=self.projection)
        return self.out_proj(merge_heads(out))

    def forward_with_state(self, x: Tensor) -> tuple[Tensor, PerformerState]:
        """``forward`` and the running sums after the sequence, the state :meth:`step` would carry:
        Σ φ(k_j) v_jᵀ and Σ φ(k_j) relative to the largest key log-feature of the sequence (the
        running maximum's final value), in one parallel pass: a prompt's prefill."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        q, k, v, window = self._qkv(x, 0)
        out = favor_attention(q, k, v, self.num_features, causal=True, projection=self.projection)
        log_k = self._log_features(k.float())  # (b, h, n, m)
        shift = log_k.amax(dim=(-2, -1), keepdim=True)  # (b, h, 1, 1)
        phi_k = torch.exp(log_k - shift)
        state = PerformerState(phi_k.transpose(-2, -1) @ v.float(), phi_k.sum(-2, keepdim=True), shift,
                               x.shape[1], window)
        return self.out_proj(merge_heads(out)), state

    def _log_features(self, x: Tensor) -> Tensor:
        """log φ(x) up to a constant, ω·x' − ‖x'‖²/2 with x' = x · d^(−1/4): ``(..., d) → (..., m)``.
        """
        x = x * self.d_head ** -0.25
        return x @ self.projection.float().T - (x * x).sum(-1, keepdim=True) / 2

    def step(self, x_t: Tensor, state: PerformerState | None = None) -> tuple[Tensor, PerformerState]:
        """One token ``(batch, d_model)`` → ``(y_t (batch, d_model), new state)``: O(1) work."""
        if x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"x_t must be (batch, d_model={self.d_model}), got {tuple(x_t.shape)}")
        position = 0 if state is None else state.position
        q, k, v, window = self._qkv(x_t[:, None, :], position, None if state is None else state.conv)
        q, k, v = q.float(), k.float(), v.float()  # (b, h, 1, d_head)
        log_q, log_k = self._log_features(q), self._log_features(k)  # (b, h, 1, m)
        phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))  # any per-query factor cancels
        c = log_k.amax(-1, keepdim=True)  # this key's largest log-feature, (b, h, 1, 1)
        phi_k = torch.exp(log_k - c)  # φ(k) · e^(−c)
        if state is None:
            shift, kv, k_sum = c, phi_k.transpose(-2, -1) @ v, phi_k
        else:
            shift = torch.maximum(state.shift, c)
            old, new = torch.exp(state.shift - shift), torch.exp(c - shift)
            kv = state.kv * old + (phi_k * new).transpose(-2, -1) @ v
            k_sum = state.k_sum * old + phi_k * new
        num = phi_q @ kv  # (b, h, 1, d_head)
        den = phi_q @ k_sum.transpose(-2, -1)  # (b, h, 1, 1)
        out = num / den.clamp_min(torch.finfo(den.dtype).tiny)
        y = self.out_proj(merge_heads(out.to(x_t.dtype)))[:, 0]
        return y, PerformerState(kv, k_sum, shift, position + 1, window)
