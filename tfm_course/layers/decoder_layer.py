"""One Transformer decoder layer: masked self-attention, cross-attention, feed-forward block."""

from __future__ import annotations

from torch import Tensor, nn

from ..attention import MultiHeadAttention
from .encoder_layer import _activation_name, copy_linear
from .feedforward import FeedForward
from .norms import LayerNorm


class DecoderLayer(nn.Module):
    """``x (batch, n_tgt, d_model), memory (batch, n_src, d_model) -> (batch, n_tgt, d_model)``.

    Three sub-layers, each with a residual connection. Post-LN (``norm_first=False``, Vaswani et
    al. 2017)::

        x = norm1(x + dropout(self_attn(x, mask=tgt_mask)))          # masked self-attention
        x = norm2(x + dropout(cross_attn(x, memory, mask=memory_mask)))  # reads the source
        x = norm3(x + dropout(ffn(x)))

    Pre-LN (``norm_first=True``) normalises the input of each sub-layer instead; the memory is
    used as it comes (the encoder's final norm has already normalised it)::

        x = x + dropout(self_attn(norm1(x)));  x = x + dropout(cross_attn(norm2(x), memory))
        x = x + dropout(ffn(norm3(x)))

    ``forward(x, memory, tgt_mask=None, memory_mask=None, need_weights=False,
    tgt_is_causal=False)``: boolean masks, True = may attend; ``tgt_mask`` broadcastable to
    ``(batch, heads, n_tgt, n_tgt)`` (causal and target key padding), ``memory_mask`` to
    ``(batch, heads, n_tgt, n_src)`` (source key padding). ``tgt_is_causal=True`` applies the
    causal mask in the self-attention without building it (combined with ``tgt_mask`` if given):
    with no ``tgt_mask`` the fused kernel may then use FlashAttention on CUDA. With right-padded
    targets the causal mask alone suffices, since a real query never reaches a padded key.
    With ``need_weights`` it returns ``(x, cross_weights)``, the cross-attention weights
    ``(batch, heads, n_tgt, n_src)``: which source positions each target position reads.
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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def _cross(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        if need_weights:
            out, weights = self.cross_attn(x, memory, mask=memory_mask, need_weights=True)
        else:
            out, weights = self.cross_attn(x, memory, mask=memory_mask), None
        return self.dropout2(out), weights

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        tgt_is_causal: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        if memory.dim() != 3 or memory.shape[0] != x.shape[0] or memory.shape[-1] != x.shape[-1]:
            raise ValueError(
                f"memory must be (batch={x.shape[0]}, n_src, d_model={x.shape[-1]}) to match "
                f"x {tuple(x.shape)}, got {tuple(memory.shape)}"
            )
        if self.norm_first:
            x = x + self.dropout1(self.self_attn(self.norm1(x), mask=tgt_mask,
                                                 is_causal=tgt_is_causal))
            cross, weights = self._cross(self.norm2(x), memory, memory_mask, need_weights)
            x = x + cross
            x = x + self.dropout3(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout1(self.self_attn(x, mask=tgt_mask,
                                                            is_causal=tgt_is_causal)))
            cross, weights = self._cross(x, memory, memory_mask, need_weights)
            x = self.norm2(x + cross)
            x = self.norm3(x + self.dropout3(self.ffn(x)))
        return (x, weights) if need_weights else x

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoderLayer) -> "DecoderLayer":
        """A copy of ``nn.TransformerDecoderLayer`` (ReLU or GELU, either ``norm_first``).

        PyTorch calls the cross-attention ``multihead_attn``; its masks are the other way round
        (True = *blocked*), and ``batch_first=False`` modules take ``(seq, batch, d)`` inputs.
        """
        activation = _activation_name(m.activation)
        d_model, d_ff = m.linear1.in_features, m.linear1.out_features
        ours = cls(d_model, m.self_attn.num_heads, d_ff, dropout=m.dropout.p, activation=activation,
                   norm_first=m.norm_first, bias=m.linear1.bias is not None,
                   layer_norm_eps=m.norm1.eps)
        ours = ours.to(device=m.linear1.weight.device, dtype=m.linear1.weight.dtype)
        ours.self_attn = MultiHeadAttention.from_torch(m.self_attn)
        ours.cross_attn = MultiHeadAttention.from_torch(m.multihead_attn)
        ours.norm1 = LayerNorm.from_torch(m.norm1)
        ours.norm2 = LayerNorm.from_torch(m.norm2)
        ours.norm3 = LayerNorm.from_torch(m.norm3)
        copy_linear(ours.ffn.linear1, m.linear1)
        copy_linear(ours.ffn.linear2, m.linear2)
        return ours
