"""Sequence mixers behind one interface, so that attention and recurrent models can be compared.

Every mixer maps ``(batch, L, d_model) → (batch, L, d_model)`` causally (position t sees tokens
≤ t only) and can also generate one token at a time, carrying a state:

    y_t, state = mixer.step(x_t, state)        # x_t (batch, d_model); state None at the start

* :class:`CausalAttention` — softmax attention (the package's fused path, causal mask, RoPE);
  its state is the **KV cache**, which grows by one key and one value per token and layer;
* :class:`CausalPerformer` — FAVOR+ with the same RoPE on q and k before the feature map; its
  state is the running sums Σ φ(k) vᵀ and Σ φ(k): fixed size;
* :class:`~tfm_course.efficient.retnet.MultiScaleRetention` — a (d_k × d_v) matrix per head;
* :class:`~tfm_course.efficient.mamba.MambaBlock` — a convolution window and (d_inner × N) states.

:func:`state_bytes` says how many bytes that state holds after ``context_len`` tokens, without
running anything; the tests check it against the tensors ``step`` really carries.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..attention import (MultiHeadAttention, causal_mask, fused_attention, kv_cache_bytes,
                         merge_heads, split_heads)
from ..efficient.mamba import MambaBlock
from ..efficient.performer import PerformerAttention, favor_attention
from ..efficient.retnet import MultiScaleRetention
from ..positional import RotaryEmbedding

__all__ = ["KVState", "PerformerState", "CausalAttention", "CausalPerformer", "make_mixer",
           "state_bytes", "tensor_bytes", "MIXER_KINDS"]

MIXER_KINDS = ("attention", "performer", "retnet", "mamba")


def _check_step_input(x_t: Tensor, d_model: int) -> None:
    if x_t.dim() != 2 or x_t.shape[-1] != d_model:
        raise ValueError(f"x_t must be (batch, d_model={d_model}), got {tuple(x_t.shape)}")


# --------------------------------------------------------------------------- attention
class KVState(NamedTuple):
    """The KV cache of one attention layer: ``(batch, heads, tokens so far, d_head)`` each."""

    keys: Tensor
    values: Tensor


class CausalAttention(nn.Module):
    """Causal multi-head softmax attention with rotary positions; ``step`` keeps a KV cache."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.attn = MultiHeadAttention(d_model, num_heads, rotary=RotaryEmbedding(d_model // num_heads))

    def forward(self, x: Tensor) -> Tensor:
        return self.attn(x, mask=causal_mask(x.shape[1], device=x.device))

    def step(self, x_t: Tensor, state: KVState | None = None) -> tuple[Tensor, KVState]:
        _check_step_input(x_t, self.d_model)
        a, x = self.attn, x_t[:, None, :]  # (b, 1, d)
        position = 0 if state is None else state.keys.shape[2]
        q = a.rotary.rotate(split_heads(a.q_proj(x), a.num_heads), position)  # (b, h, 1, d_head)
        k = a.rotary.rotate(split_heads(a.k_proj(x), a.num_heads), position)
        v = split_heads(a.v_proj(x), a.num_heads)
        if state is not None:
            k, v = torch.cat([state.keys, k], dim=2), torch.cat([state.values, v], dim=2)
        out = fused_attention(q, k, v)  # the newest query may read every cached key: no mask
        return a.out_proj(merge_heads(out))[:, 0], KVState(k, v)


# --------------------------------------------------------------------------- Performer
class PerformerState(NamedTuple):
    """Running sums of one Performer layer, stored relative to ``exp(shift)`` to avoid overflow.

    ``kv`` ``(batch, heads, m, d_head)`` = Σ φ(k_j) v_jᵀ · e^(−shift), ``k_sum`` ``(batch, heads,
    1, m)`` = Σ φ(k_j) · e^(−shift), ``shift`` ``(batch, heads, 1, 1)`` the largest log-feature seen,
    ``position`` the index of the next token (for the rotation).
    """

    kv: Tensor
    k_sum: Tensor
    shift: Tensor
    position: int


class CausalPerformer(PerformerAttention):
    """Causal FAVOR+ attention (:class:`~tfm_course.efficient.performer.PerformerAttention`) with
    RoPE applied to q and k before the random features, so that φ(q)·φ(k) estimates the same
    rotary softmax kernel as :class:`CausalAttention`.

    ``step`` is the recurrent form: out_t = φ(q_t) S_t / φ(q_t) z_t with S_t = Σ_{j≤t} φ(k_j) v_jᵀ
    and z_t = Σ_{j≤t} φ(k_j), kept relative to the largest log-feature so far (an online max, as
    in flash attention), so that exp never overflows; the constant 1/√m cancels and is left out.
    """

    def __init__(self, d_model: int, num_heads: int, num_features: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        d_head = d_model // num_heads
        super().__init__(d_model, num_heads, num_features or 2 * d_head, causal=True,
                         generator=generator)
        self.rotary = RotaryEmbedding(self.d_head)

    def _qkv(self, x: Tensor, position: int) -> tuple[Tensor, Tensor, Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return self.rotary.rotate(q, position), self.rotary.rotate(k, position), v

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, n, d_model={self.d_model}), got {tuple(x.shape)}")
        q, k, v = self._qkv(x, 0)
        out = favor_attention(q, k, v, self.num_features, causal=True, projection=self.projection)
        return self.out_proj(merge_heads(out))

    def _log_features(self, x: Tensor) -> Tensor:
        """log φ(x) up to a constant, ω·x' − ‖x'‖²/2 with x' = x · d^(−1/4): ``(..., d) → (..., m)``.
        """
        x = x * self.d_head ** -0.25
        return x @ self.projection.float().T - (x * x).sum(-1, keepdim=True) / 2

    def step(self, x_t: Tensor, state: PerformerState | None = None) -> tuple[Tensor, PerformerState]:
        _check_step_input(x_t, self.d_model)
        position = 0 if state is None else state.position
        q, k, v = (t.float() for t in self._qkv(x_t[:, None, :], position))  # (b, h, 1, d_head)
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
        return y, PerformerState(kv, k_sum, shift, position + 1)


# --------------------------------------------------------------------------- factory and state
def make_mixer(kind: str, d_model: int, num_heads: int, num_features: int | None = None,
               scan_mode: str = "sequential") -> nn.Module:
    """A mixer of ``kind`` (one of :data:`MIXER_KINDS`) with the package's defaults.

    ``scan_mode`` is Mamba's scan in the forward pass: ``"sequential"`` (faster on a CPU) or
    ``"parallel"`` (meant for a GPU); the two give the same numbers.
    """
    if kind == "attention":
        return CausalAttention(d_model, num_heads)
    if kind == "performer":
        return CausalPerformer(d_model, num_heads, num_features)
    if kind == "retnet":
        return MultiScaleRetention(d_model, num_heads)
    if kind == "mamba":
        return MambaBlock(d_model, scan_mode=scan_mode)
    raise ValueError(f"kind must be one of {MIXER_KINDS}, got {kind!r}")


def state_bytes(mixer: nn.Module, context_len: int, bytes_per_value: int = 4) -> int:
    """Bytes of the state ``mixer.step`` carries per sequence after ``context_len`` tokens.

    Attention: ``context_len`` × (a key and a value per head); the recurrent mixers: a fixed size
    (the Performer's sums and running max, RetNet's S per head, Mamba's conv window and h),
    whatever ``context_len``. ``bytes_per_value`` 4 for fp32 (the recurrent states are kept in
    fp32 even under autocast), 2 for an fp16/bf16 KV cache.
    """
    if context_len < 0:
        raise ValueError(f"context_len must be non-negative, got {context_len}")
    if isinstance(mixer, CausalAttention):
        a = mixer.attn
        return context_len * kv_cache_bytes(1, a.num_kv_heads, a.d_head, bytes_per_value)
    if isinstance(mixer, CausalPerformer):
        h, m = mixer.num_heads, mixer.num_features
        return h * (m * mixer.d_head + m + 1) * bytes_per_value
    if isinstance(mixer, MultiScaleRetention):
        return mixer.num_heads * mixer.d_k * mixer.d_v * bytes_per_value
    if isinstance(mixer, MambaBlock):
        return mixer.d_inner * (mixer.d_conv - 1 + mixer.d_state) * bytes_per_value
    raise ValueError(f"no state size known for {type(mixer).__name__}")


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor inside ``state`` (nested tuples / lists / NamedTuples)."""
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, (tuple, list)):
        return sum(tensor_bytes(s) for s in state)
    return 0
