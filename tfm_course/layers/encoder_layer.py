"""One Transformer encoder layer: self-attention and a feed-forward block, each with a residual."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from .feedforward import FeedForward
from .norms import LayerNorm


class EncoderLayer(nn.Module):
    """``(batch, seq, d_model) -> (batch, seq, d_model)``.

    Post-LN (``norm_first=False``, Vaswani et al. 2017)::

        x = norm1(x + dropout(self_attn(x)));  x = norm2(x + dropout(ffn(x)))

    Pre-LN (``norm_first=True``; in tensor2tensor and GPT-2, analysed by Xiong et al. 2020)::

        x = x + dropout(self_attn(norm1(x)));  x = x + dropout(ffn(norm2(x)))

    ``forward(x, mask=None, position_bias=None, is_causal=False)``: boolean ``mask`` (True = may
    attend) broadcastable to ``(batch, heads, seq, seq)``; optional float ``position_bias`` added
    to the scores; ``is_causal=True`` applies the causal mask without building it (combined with
    ``mask`` if given), which lets the fused kernel use FlashAttention on CUDA. ``rotary`` is passed
    to the attention (RoPE).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        bias: bool = True,
        layer_norm_eps: float = 1e-5,
        num_kv_heads: int | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads,
                                            bias=bias, dropout=dropout, rotary=rotary)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _attend(self, x: Tensor, mask: Tensor | None, position_bias: Tensor | None,
                is_causal: bool = False) -> Tensor:
        return self.dropout1(self.self_attn(x, mask=mask, position_bias=position_bias,
                                            is_causal=is_causal))

    def forward(self, x: Tensor, mask: Tensor | None = None,
                position_bias: Tensor | None = None, is_causal: bool = False) -> Tensor:
        if self.norm_first:
            x = x + self._attend(self.norm1(x), mask, position_bias, is_causal)
            return x + self.dropout2(self.ffn(self.norm2(x)))
        x = self.norm1(x + self._attend(x, mask, position_bias, is_causal))
        return self.norm2(x + self.dropout2(self.ffn(x)))

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoderLayer) -> "EncoderLayer":
        """A copy of ``nn.TransformerEncoderLayer`` (ReLU or GELU, either ``norm_first``).

        Works for either ``batch_first`` setting, but ours is always batch-first.
        """
        activation = _activation_name(m.activation)
        d_model, d_ff = m.linear1.in_features, m.linear1.out_features
        ours = cls(d_model, m.self_attn.num_heads, d_ff, dropout=m.dropout.p, activation=activation,
                   norm_first=m.norm_first, bias=m.linear1.bias is not None,
                   layer_norm_eps=m.norm1.eps)
        ours = ours.to(device=m.linear1.weight.device, dtype=m.linear1.weight.dtype)
        ours.self_attn = MultiHeadAttention.from_torch(m.self_attn)
        ours.norm1, ours.norm2 = LayerNorm.from_torch(m.norm1), LayerNorm.from_torch(m.norm2)
        copy_linear(ours.ffn.linear1, m.linear1)
        copy_linear(ours.ffn.linear2, m.linear2)
        return ours


def _activation_name(activation: object) -> str:
    """'relu' or 'gelu' for the activation stored on a PyTorch Transformer layer."""
    name = getattr(activation, "__name__", type(activation).__name__).lower()
    if "gelu" in name:
        return "gelu"
    if "relu" in name:
        return "relu"
    raise ValueError(f"unsupported activation {activation!r}: only ReLU and GELU are copied")


def copy_linear(ours: nn.Linear, theirs: nn.Linear) -> None:
    """Copy weight (and bias) of one ``nn.Linear`` into another of the same shape."""
    if ours.weight.shape != theirs.weight.shape:
        raise ValueError(f"shape mismatch: {tuple(ours.weight.shape)} vs {tuple(theirs.weight.shape)}")
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
        if theirs.bias is not None:
            ours.bias.copy_(theirs.bias)
