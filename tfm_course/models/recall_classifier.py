"""A tiny non-causal Transformer for the scattered-recall task, with a pluggable attention.

    model = RecallClassifier(num_keys=64, num_values=16, seq_len=256, mixer="performer")
    logits = model(batch.keys, batch.values)              # (batch, n, num_values)

Input: every position has a key and a value (:mod:`tfm_course.data.scattered_recall`); their two
embeddings are added. Then ``num_layers`` Pre-LN blocks ``x + mix(norm(x))``, ``x + ffn(norm(x))``
whose token mixer comes from :func:`tfm_course.efficient.mixers.make_mixer`, a final LayerNorm and
a linear read-out of a value class at every position (the loss only looks at query positions).
No position embedding: the task is a lookup by content, and softmax attention needs none.
Only the mixer changes between variants, so a comparison changes one thing.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..efficient.mixers import make_mixer
from ..layers import FeedForward, LayerNorm

__all__ = ["RecallClassifier", "MixerBlock"]


class MixerBlock(nn.Module):
    """Pre-LN block: ``x + mixer(norm1(x))`` then ``x + ffn(norm2(x))``; ``(batch, n, d)`` in and out."""

    def __init__(self, d_model: int, mixer: nn.Module, d_ff: int) -> None:
        super().__init__()
        self.norm1, self.mixer = LayerNorm(d_model), mixer
        self.norm2, self.ffn = LayerNorm(d_model), FeedForward(d_model, d_ff, activation="gelu")

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class RecallClassifier(nn.Module):
    """``forward(keys, values)``: two ``(batch, n)`` int tensors → logits ``(batch, n, num_values)``.

    Args:
        num_keys, num_values: as in :func:`tfm_course.data.scattered_recall.scattered_recall`
            (the embeddings add the filler key, and the blank and filler values).
        seq_len: the longest input (Linformer and the window mask are built for it).
        mixer: a kind from :data:`tfm_course.efficient.mixers.MIXERS`; ``mixer_options`` are
            passed on (``window``, ``k``, ``num_features``).
        d_model, num_heads, num_layers, d_ff (default 2·d_model): the usual sizes.
    """

    def __init__(self, num_keys: int, num_values: int, seq_len: int, mixer: str = "softmax",
                 d_model: int = 64, num_heads: int = 4, num_layers: int = 1,
                 d_ff: int | None = None, **mixer_options: int) -> None:
        super().__init__()
        self.num_keys, self.num_values, self.seq_len = num_keys, num_values, seq_len
        self.key_embedding = nn.Embedding(num_keys + 1, d_model)  # + filler
        self.value_embedding = nn.Embedding(num_values + 2, d_model)  # + blank, filler
        self.blocks = nn.ModuleList(
            MixerBlock(d_model, make_mixer(mixer, d_model, num_heads, seq_len, **mixer_options),
                       d_ff or 2 * d_model)
            for _ in range(num_layers))
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_values)

    def forward(self, keys: Tensor, values: Tensor) -> Tensor:
        if keys.dim() != 2 or keys.shape != values.shape:
            raise ValueError(f"keys and values must both be (batch, n); got {tuple(keys.shape)} "
                             f"and {tuple(values.shape)}")
        if keys.shape[1] > self.seq_len:
            raise ValueError(f"sequence length {keys.shape[1]} exceeds seq_len = {self.seq_len}")
        x = self.key_embedding(keys) + self.value_embedding(values)  # (batch, n, d_model)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
