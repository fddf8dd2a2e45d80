"""T5's building blocks: attention without the 1/√d scaling, the gated-GELU block, the pre-norm
block and the stack that shares one relative position bias across its blocks.

:class:`~tfm_course.models.t5.T5` puts two stacks together (an encoder and a decoder); a single
:class:`T5Stack` with a causal or prefix mask (:func:`prefix_lm_mask`) is a decoder-only
language model built from the same parts, which is how the T5 paper compares architectures.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import merge_heads, split_heads
from ..layers import FeedForward, RMSNorm
from ..positional import T5RelativeBias
from .t5_config import T5Config

__all__ = ["LOWEST", "attention_bias", "causal_mask_last", "prefix_lm_mask", "T5Attention",
           "GatedGELU", "BlockCache", "T5Block", "T5Stack"]


def prefix_lm_mask(seq_len: int, prefix_len: int, device: torch.device | str | None = None) -> Tensor:
    """The T5 paper's third attention pattern, ``(seq_len, seq_len)`` bool, True = may attend.

    Query i may read key j if j <= i (causal) **or** j < prefix_len (the prefix is fully visible):
    a single decoder reads its input bidirectionally and writes its output left to right.
    ``prefix_len = 0`` is the causal mask, ``prefix_len = seq_len`` the fully visible one.
    """
    if not 0 <= prefix_len <= seq_len:
        raise ValueError(f"need 0 <= prefix_len <= seq_len, got prefix_len={prefix_len}, seq_len={seq_len}")
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    causal[:, :prefix_len] = True
    return causal


def causal_mask_last(n_q: int, n_k: int, device: torch.device | str | None = None) -> Tensor:
    """The causal mask ``(n_q, n_k)``, bool, for queries at the last ``n_q`` of ``n_k`` positions
    (with a KV cache: the new tokens after the cached ones)."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


LOWEST = torch.finfo(torch.float32).min  # added to the score of a key that may not be read


def attention_bias(mask: Tensor | None, bias: Tensor | None = None) -> Tensor | None:
    """Fold a bool ``mask`` (True = may attend) into the float ``bias`` added to the scores.

    Where the mask is False the result is the lowest float32 number, so the key gets zero weight.
    Shapes broadcast (a ``(1, heads, n_q, n_k)`` position bias with a ``(B, 1, 1, n_k)`` padding
    mask gives ``(B, heads, n_q, n_k)``). The stacks do this once and share it across blocks.
    """
    if mask is None:
        return bias
    if bias is None:
        bias = torch.zeros((), device=mask.device)
    return torch.where(mask, bias, torch.full((), LOWEST, device=mask.device))


class T5Attention(nn.Module):
    """Multi-head attention *without* the 1/√d scaling: softmax(q kᵀ + bias) v.

    ``forward(x, k, v, bias=None)``: queries from ``x`` ``(B, n_q, d_model)``; keys and values
    ``(B, heads, n_k, d_kv)`` from :meth:`keys_values` (kept apart so that a KV cache can store
    them); ``bias`` float, broadcastable to ``(B, heads, n_q, n_k)``: the position bias with the
    masked keys at the lowest float (:func:`attention_bias`). Returns ``(B, n_q, d_model)``.
    ``fused`` runs PyTorch's fused kernel with ``scale=1.0``, otherwise the maths is written out;
    both give the same result.
    """

    def __init__(self, d_model: int, num_heads: int, d_kv: int, dropout: float = 0.0,
                 fused: bool = True) -> None:
        super().__init__()
        self.num_heads, self.d_kv, self.dropout, self.fused = num_heads, d_kv, dropout, fused
        inner = num_heads * d_kv
        self.q = nn.Linear(d_model, inner, bias=False)
        self.k = nn.Linear(d_model, inner, bias=False)
        self.v = nn.Linear(d_model, inner, bias=False)
        self.o = nn.Linear(inner, d_model, bias=False)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(B, n, d_model) -> k, v`` each ``(B, heads, n, d_kv)``."""
        return split_heads(self.k(x), self.num_heads), split_heads(self.v(x), self.num_heads)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
        q = split_heads(self.q(x), self.num_heads)  # (B, h, n_q, d_kv)
        p = self.dropout if self.training else 0.0
        if self.fused:
            if bias is not None:  # in fp16 the lowest float32 would become -inf: clamp it
                bias = bias.to(q.dtype).clamp(min=torch.finfo(q.dtype).min)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, scale=1.0)
        else:
            scores = q @ k.transpose(-2, -1)  # (B, h, n_q, n_k) — no division by √d_kv
            if bias is not None:
                scores = scores + bias
            weights = F.dropout(torch.softmax(scores.float(), dim=-1), p)
            out = weights.to(v.dtype) @ v
        return self.o(merge_heads(out))


class GatedGELU(nn.Module):
    """T5 v1.1's feed-forward block: ``down(GELU(gate(x)) ⊙ up(x))``, tanh-approximated GELU, no biases.

    SwiGLU with GELU in place of SiLU (GEGLU, Shazeer 2020). ``gate`` is the branch through the
    activation, ``up`` the linear one, ``down`` the output (Hugging Face T5: ``wi_0``, ``wi_1``,
    ``wo``). ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(F.gelu(self.gate(x), approximate="tanh") * self.up(x)))


class BlockCache:
    """What one decoder block keeps while generating: self-attention and cross-attention K/V."""

    def __init__(self) -> None:
        self.self_kv: tuple[Tensor, Tensor] | None = None  # grows by the new tokens each step
        self.cross_kv: tuple[Tensor, Tensor] | None = None  # computed once from the memory

    def reorder(self, index: Tensor) -> None:
        if self.self_kv is not None:
            self.self_kv = (self.self_kv[0][index], self.self_kv[1][index])
        if self.cross_kv is not None:
            self.cross_kv = (self.cross_kv[0][index], self.cross_kv[1][index])


class T5Block(nn.Module):
    """Pre-norm block: ``x + self_attn(norm(x))``, [``+ cross_attn(norm(x), memory)``], ``+ ffn(norm(x))``.

    ``forward(x, self_bias, memory=None, cross_bias=None, cache=None)``, biases as in
    :class:`T5Attention`. The first block of a stack also owns ``relative_bias``, which the stack
    evaluates once for all its blocks (``bidirectional`` in an encoder, causal in a decoder).
    """

    def __init__(self, config: T5Config, cross_attention: bool, owns_bias: bool,
                 bidirectional: bool) -> None:
        super().__init__()
        c = config
        self.relative_bias = (T5RelativeBias(c.num_heads, c.num_buckets, c.max_distance,
                                             bidirectional=bidirectional) if owns_bias else None)
        self.norm_self = RMSNorm(c.d_model, eps=c.layer_norm_eps)
        self.self_attn = T5Attention(c.d_model, c.num_heads, c.d_kv, c.dropout)
        self.cross_attn = T5Attention(c.d_model, c.num_heads, c.d_kv, c.dropout) if cross_attention else None
        self.norm_cross = RMSNorm(c.d_model, eps=c.layer_norm_eps) if cross_attention else None
        self.norm_ffn = RMSNorm(c.d_model, eps=c.layer_norm_eps)
        self.ffn = (GatedGELU(c.d_model, c.d_ff, c.dropout) if c.feed_forward == "gated-gelu"
                    else FeedForward(c.d_model, c.d_ff, "relu", c.dropout, bias=False))
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x: Tensor, self_bias: Tensor | None, memory: Tensor | None = None,
                cross_bias: Tensor | None = None, cache: BlockCache | None = None) -> Tensor:
        h = self.norm_self(x)
        k, v = self.self_attn.keys_values(h)
        if cache is not None:
            if cache.self_kv is not None:
                k, v = torch.cat([cache.self_kv[0], k], dim=2), torch.cat([cache.self_kv[1], v], dim=2)
            cache.self_kv = (k, v)
        x = x + self.dropout(self.self_attn(h, k, v, self_bias))
        if self.cross_attn is not None:
            if cache is not None and cache.cross_kv is not None:
                k, v = cache.cross_kv
            else:
                k, v = self.cross_attn.keys_values(memory)
                if cache is not None:
                    cache.cross_kv = (k, v)
            x = x + self.dropout(self.cross_attn(self.norm_cross(x), k, v, cross_bias))
        return x + self.dropout(self.ffn(self.norm_ffn(x)))


class T5Stack(nn.Module):
    """Blocks, a final RMS norm, dropout at both ends: ``(B, n, d_model) -> (B, n, d_model)``.

    T5's encoder is ``T5Stack(config, num_layers, cross_attention=False, bidirectional=True)``,
    its decoder ``cross_attention=True, bidirectional=False``; a decoder-only language model (or a
    prefix LM) is ``cross_attention=False, bidirectional=False`` with a causal (prefix) mask.
    """

    def __init__(self, config: T5Config, num_layers: int, cross_attention: bool,
                 bidirectional: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(T5Block(config, cross_attention, owns_bias=i == 0,
                                            bidirectional=bidirectional) for i in range(num_layers))
        self.final_norm = RMSNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, caches: list[BlockCache] | None = None,
                past: int = 0) -> Tensor:
        """``x`` ``(B, n, d_model)``; ``mask`` bool broadcastable to ``(B, 1, n, past + n)`` (True = may
        attend), ``memory_mask`` to ``(B, 1, n, S)``. ``past`` positions are already cached: the ``n``
        new queries sit at ``past .. past+n-1``."""
        position = self.blocks[0].relative_bias(x.shape[1], past + x.shape[1])  # (1, h, n, past+n)
        self_bias = attention_bias(mask, position)  # computed once, shared by every block
        cross_bias = attention_bias(memory_mask)
        x = self.dropout(x)
        for i, block in enumerate(self.blocks):
            x = block(x, self_bias, memory, cross_bias, None if caches is None else caches[i])
        return self.dropout(self.final_norm(x))
