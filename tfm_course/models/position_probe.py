"""A tiny Transformer whose only varying part is how it learns where tokens are.

    model = PositionProbe(vocab_size=16, position="rope")   # or none / sinusoidal / learned / alibi / t5
    logits = model(tokens)                                  # (batch, seq) -> (batch, seq, classes)

Token embedding -> [absolute encoding] -> pre-LN encoder layers -> LayerNorm -> a linear classifier
at every position. Everything else (width, depth, mask, initialisation) is identical across the
``position`` choices, so differences in behaviour come from the position encoding alone.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import EncoderLayer, LayerNorm
from ..positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    alibi_bias,
)

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")


class PositionProbe(nn.Module):
    """``forward(tokens (batch, seq)) -> logits (batch, seq, num_classes)``.

    Args:
        vocab_size: input tokens are in ``[0, vocab_size)``.
        position: one of :data:`POSITIONS`. ``sinusoidal`` / ``learned`` are added to the token
            embeddings; ``rope`` rotates queries and keys in every layer (one shared
            :class:`RotaryEmbedding`); ``alibi`` / ``t5`` add a bias to the scores of every layer
            (T5's bias table is shared by the layers, as in T5).
        max_len: size of the sinusoidal / learned tables (longer inputs raise ``ValueError``).
        causal: mask future keys (a decoder-style model) through ``is_causal=True``, without
            building a mask; ``False`` gives a bidirectional encoder.
        num_classes: output classes per position (default ``vocab_size``).
    """

    def __init__(self, vocab_size: int, position: str = "rope", d_model: int = 64, num_heads: int = 4,
                 num_layers: int = 2, d_ff: int | None = None, max_len: int = 512, causal: bool = True,
                 num_classes: int | None = None, learned_init_std: float = 0.02) -> None:
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        self.position, self.causal, self.num_heads = position, causal, num_heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.absolute: nn.Module | None = None
        if position == "sinusoidal":
            self.absolute = SinusoidalPositionalEncoding(d_model, max_len)
        elif position == "learned":
            self.absolute = LearnedPositionalEmbedding(max_len, d_model, init_std=learned_init_std)
        rotary = RotaryEmbedding(d_model // num_heads) if position == "rope" else None
        self.relative = T5RelativeBias(num_heads, bidirectional=not causal) if position == "t5" else None
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff or 4 * d_model, dropout=0.0, activation="gelu",
                         norm_first=True, rotary=rotary)
            for _ in range(num_layers)
        )
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes or vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq), got {tuple(tokens.shape)}")
        n, device = tokens.shape[1], tokens.device
        x = self.embed(tokens)  # (batch, seq, d_model)
        if self.absolute is not None:
            x = self.absolute(x)
        bias = None
        if self.position == "alibi":
            bias = alibi_bias(self.num_heads, n, device=device)  # (1, heads, n, n)
        elif self.relative is not None:
            bias = self.relative(n)
        for layer in self.layers:  # is_causal: no mask is built, so CUDA can use FlashAttention
            x = layer(x, position_bias=bias, is_causal=self.causal)
        return self.head(self.norm(x))
