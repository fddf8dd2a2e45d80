"""Sequence mixers behind one interface, so that attention and recurrent models can be compared.

Every mixer maps ``(batch, L, d_model) → (batch, L, d_model)`` causally (position t sees tokens
≤ t only) and can also generate one token at a time, carrying a state:

    y_t, state = mixer.step(x_t, state)        # x_t (batch, d_model); state None at the start

* :class:`CausalAttention` — softmax attention (the package's fused path, causal mask, RoPE);
  its state is the **KV cache**, which grows by one key and one value per token and layer;
* :class:`~tfm_course.efficient.causal_performer.CausalPerformer` — FAVOR+ with the same RoPE on
  q and k before the feature map; its state is the running sums Σ φ(k) vᵀ and Σ φ(k): fixed size;
* :class:`~tfm_course.efficient.retnet.MultiScaleRetention` — a (d_k × d_v) matrix per head;
* :class:`~tfm_course.efficient.mamba.MambaBlock` — a convolution window and (d_inner × N) states;
* :class:`~tfm_course.efficient.mamba2.Mamba2Mixer` (``"mamba2"``) — a convolution window and a
  (head_dim × N) state per head, decayed by one data-dependent scalar;
* :class:`~tfm_course.efficient.deltanet.DeltaNetMixer` (``"deltanet"``, ``"gated_deltanet"``) —
  the q, k, v convolution window and a (d_head × d_head) delta-rule state per head.

:func:`state_bytes` says how many bytes that state holds after ``context_len`` tokens, without
running anything; the tests check it against the tensors ``step`` really carries.

``make_mixer(kind, ..., short_conv=k)`` gives the kinds in :data:`SHORT_CONV_KINDS` a causal
depthwise convolution of width k on q, k and v
(:class:`~tfm_course.efficient.short_conv.ShortConvolution`); its window of k − 1 projected tokens
is part of the state and of :func:`state_bytes`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..attention import (MultiHeadAttention, causal_mask, fused_attention, kv_cache_bytes,
                         merge_heads, split_heads)
from ..efficient.causal_performer import CausalPerformer, PerformerState
from ..efficient.deltanet import DeltaNetMixer
from ..efficient.mamba import MambaBlock
from ..efficient.mamba2 import Mamba2Mixer
from ..efficient.retnet import MultiScaleRetention
from ..efficient.short_conv import ShortConvolution, short_convolution
from ..positional import RotaryEmbedding

__all__ = ["KVState", "PerformerState", "CausalAttention", "CausalPerformer", "make_mixer",
           "state_bytes", "tensor_bytes", "MIXER_KINDS", "SHORT_CONV_KINDS",
           "CONV_CAPABLE_KINDS"]

MIXER_KINDS = ("attention", "performer", "retnet", "mamba", "mamba2", "deltanet", "gated_deltanet")
SHORT_CONV_KINDS = ("performer", "retnet", "deltanet", "gated_deltanet")  # the benchmark's default
CONV_CAPABLE_KINDS = SHORT_CONV_KINDS + ("attention",)  # make_mixer(short_conv=k) accepts these


def _check_step_input(x_t: Tensor, d_model: int) -> None:
    if x_t.dim() != 2 or x_t.shape[-1] != d_model:
        raise ValueError(f"x_t must be (batch, d_model={d_model}), got {tuple(x_t.shape)}")


# --------------------------------------------------------------------------- attention
class KVState(NamedTuple):
    """The KV cache of one attention layer: ``(batch, heads, tokens so far, d_head)`` each, and
    the short convolution's window ``(batch, k − 1, 3·d_model)`` if the layer has one (else None)."""

    keys: Tensor
    values: Tensor
    conv: Tensor | None = None


class CausalAttention(nn.Module):
    """Causal multi-head softmax attention with rotary positions; ``step`` keeps a KV cache.

    ``short_conv=k`` adds a causal depthwise convolution of width k (then SiLU) on q, k and v after
    their projections, before the rotation, as Primer's multi-dconv-head attention does (width 3,
    no activation there; So et al., 2021): the control experiment for the recurrent mixers'
    convolution. Off by default, as in GPT-2, Llama and Zoology's attention."""

    def __init__(self, d_model: int, num_heads: int, short_conv: int | None = None) -> None:
        super().__init__()
        self.d_model = d_model
        self.attn = MultiHeadAttention(d_model, num_heads, rotary=RotaryEmbedding(d_model // num_heads))
        self.qkv_conv = short_convolution(3 * d_model, short_conv)  # None when off

    def _qkv(self, x: Tensor, position: int, window: Tensor | None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x ``(batch, L, d_model)`` at positions ``position, ...`` → rotated q, k and v
        ``(batch, heads, L, d_head)`` and the convolution's new window (None if off)."""
        a = self.attn
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        if self.qkv_conv is not None:
            qkv, window = self.qkv_conv(torch.cat([q, k, v], dim=-1), window)
            q, k, v = qkv.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        q = a.rotary.rotate(split_heads(q, a.num_heads), position)
        k = a.rotary.rotate(split_heads(k, a.num_heads), position)
        return q, k, split_heads(v, a.num_heads), window

    def forward(self, x: Tensor) -> Tensor:
        if self.qkv_conv is None:
            return self.attn(x, mask=causal_mask(x.shape[1], device=x.device))
        q, k, v, _ = self._qkv(x, 0, None)
        return self.attn.out_proj(merge_heads(fused_attention(q, k, v, is_causal=True)))

    def forward_with_state(self, x: Tensor) -> tuple[Tensor, KVState]:
        """The whole sequence at once and its KV cache (with the convolution's window): a prefill."""
        q, k, v, window = self._qkv(x, 0, None)
        out = fused_attention(q, k, v, is_causal=True)
        return self.attn.out_proj(merge_heads(out)), KVState(k, v, window)

    def step(self, x_t: Tensor, state: KVState | None = None) -> tuple[Tensor, KVState]:
        _check_step_input(x_t, self.d_model)
        position = 0 if state is None else state.keys.shape[2]
        q, k, v, window = self._qkv(x_t[:, None, :], position, None if state is None else state.conv)
        if state is not None:
            k, v = torch.cat([state.keys, k], dim=2), torch.cat([state.values, v], dim=2)
        out = fused_attention(q, k, v)  # the newest query may read every cached key: no mask
        return self.attn.out_proj(merge_heads(out))[:, 0], KVState(k, v, window)


# --------------------------------------------------------------------------- factory and state
def make_mixer(kind: str, d_model: int, num_heads: int, num_features: int | None = None,
               scan_mode: str = "sequential", short_conv: int | None = None) -> nn.Module:
    """A mixer of ``kind`` (one of :data:`MIXER_KINDS`) with the package's defaults.

    ``scan_mode`` is Mamba's scan in the forward pass: ``"sequential"`` (faster on a CPU) or
    ``"parallel"`` (meant for a GPU); the two give the same numbers.

    ``short_conv=k`` (None or 0: off, the default) adds a causal depthwise convolution of width k,
    then SiLU, on q, k and v after their projections, as flash-linear-attention's retention, GLA
    and DeltaNet layers do (``use_short_conv``): ``channels × k`` more parameters and a window of
    k − 1 projected tokens in the state. For :data:`SHORT_CONV_KINDS`, the recurrent mixers the
    references give one, and for attention (:data:`CONV_CAPABLE_KINDS`; a control experiment,
    Primer's multi-dconv-head attention); Mamba has its own, and other kinds raise ValueError. ``DeltaNetMixer``
    itself defaults to width 4 (fla's default, on); through this factory it is off unless asked
    for, like the other kinds. ``"mamba2"`` has its own convolution (d_conv 4) and d_state 16.
    """
    if short_conv and kind in MIXER_KINDS and kind not in CONV_CAPABLE_KINDS:
        raise ValueError(f"short_conv applies to {CONV_CAPABLE_KINDS}, got short_conv={short_conv!r} "
                         f"for {kind!r}")
    if kind == "attention":
        return CausalAttention(d_model, num_heads, short_conv=short_conv)
    if kind == "performer":
        return CausalPerformer(d_model, num_heads, num_features, short_conv=short_conv)
    if kind == "retnet":
        return MultiScaleRetention(d_model, num_heads, short_conv=short_conv)
    if kind == "mamba":
        return MambaBlock(d_model, scan_mode=scan_mode)
    if kind == "mamba2":
        return Mamba2Mixer(d_model, num_heads)
    if kind in ("deltanet", "gated_deltanet"):
        return DeltaNetMixer(d_model, num_heads, gated=kind == "gated_deltanet",
                             short_conv=short_conv)
    raise ValueError(f"kind must be one of {MIXER_KINDS}, got {kind!r}")


def state_bytes(mixer: nn.Module, context_len: int, bytes_per_value: int = 4) -> int:
    """Bytes of the state ``mixer.step`` carries per sequence after ``context_len`` tokens.

    Attention: ``context_len`` × (a key and a value per head); the recurrent mixers: a fixed size
    (the Performer's sums and running max, RetNet's S per head, Mamba's conv window and h),
    whatever ``context_len``, plus the window of a short convolution if the mixer has one
    (``(k − 1) × channels`` values). ``bytes_per_value`` 4 for fp32 (the recurrent states are kept
    in fp32 even under autocast), 2 for an fp16/bf16 KV cache.
    """
    if context_len < 0:
        raise ValueError(f"context_len must be non-negative, got {context_len}")
    if isinstance(mixer, CausalAttention):
        a = mixer.attn
        return (context_len * kv_cache_bytes(1, a.num_kv_heads, a.d_head, bytes_per_value)
                + _window_values(mixer) * bytes_per_value)
    if isinstance(mixer, CausalPerformer):
        h, m = mixer.num_heads, mixer.num_features
        return (h * (m * mixer.d_head + m + 1) + _window_values(mixer)) * bytes_per_value
    if isinstance(mixer, MultiScaleRetention):
        return (mixer.num_heads * mixer.d_k * mixer.d_v + _window_values(mixer)) * bytes_per_value
    if isinstance(mixer, MambaBlock):
        return mixer.d_inner * (mixer.d_conv - 1 + mixer.d_state) * bytes_per_value
    if isinstance(mixer, Mamba2Mixer):
        ssm = mixer.num_heads * mixer.head_dim * mixer.d_state
        return (ssm + _window_values(mixer)) * bytes_per_value
    if isinstance(mixer, DeltaNetMixer):
        return (mixer.num_heads * mixer.d_head ** 2 + _window_values(mixer)) * bytes_per_value
    raise ValueError(f"no state size known for {type(mixer).__name__}")


def _window_values(mixer: nn.Module) -> int:
    """Values in the windows of every short convolution inside ``mixer`` (0 without one)."""
    return sum(m.window_values for m in mixer.modules() if isinstance(m, ShortConvolution))


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor inside ``state`` (nested tuples / lists / NamedTuples)."""
    if isinstance(state, Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, (tuple, list)):
        return sum(tensor_bytes(s) for s in state)
    return 0
