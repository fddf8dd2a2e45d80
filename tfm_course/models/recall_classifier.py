"""A tiny non-causal Transformer for the scattered-recall task, with a pluggable attention.

    model = RecallClassifier(num_keys=64, num_values=16, seq_len=256, attention="performer")
    logits = model(batch.keys, batch.values)              # (batch, n, num_values)

Input: every position has a key and a value (:mod:`tfm_course.data.scattered_recall`); their two
embeddings are added. Then ``num_layers`` Pre-LN blocks ``x + attn(norm(x))``, ``x + ffn(norm(x))``
whose attention comes from :func:`tfm_course.efficient.attention_layers.make_attention`, a final
LayerNorm and
a linear read-out of a value class at every position (the loss only looks at query positions).
No position embedding: the task is a lookup by content, and softmax attention needs none.
Only the attention changes between variants, so a comparison changes one thing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, split_heads
from ..efficient.attention_layers import make_attention
from ..layers import FeedForward, LayerNorm

__all__ = ["RecallClassifier", "AttentionBlock"]


class AttentionBlock(nn.Module):
    """Pre-LN block: ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))``; ``(batch, n, d)`` in and out."""

    def __init__(self, d_model: int, attn: nn.Module, d_ff: int) -> None:
        super().__init__()
        self.norm1, self.attn = LayerNorm(d_model), attn
        self.norm2, self.ffn = LayerNorm(d_model), FeedForward(d_model, d_ff, activation="gelu")

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class RecallClassifier(nn.Module):
    """``forward(keys, values)``: two ``(batch, n)`` int tensors → logits ``(batch, n, num_values)``.

    Args:
        num_keys, num_values: as in :func:`tfm_course.data.scattered_recall.scattered_recall`
            (the embeddings add the filler key, and the blank and filler values).
        seq_len: the longest input (Linformer's E and F are built for it).
        attention: a kind from :data:`tfm_course.efficient.attention_layers.ATTENTION_KINDS`;
            ``attention_options`` are passed on (``window``, ``k``, ``num_features``).
        d_model, num_heads, num_layers, d_ff (default 2·d_model): the usual sizes.
    """

    def __init__(self, num_keys: int, num_values: int, seq_len: int, attention: str = "softmax",
                 d_model: int = 64, num_heads: int = 4, num_layers: int = 1,
                 d_ff: int | None = None, **attention_options: int) -> None:
        super().__init__()
        self.num_keys, self.num_values, self.seq_len = num_keys, num_values, seq_len
        self.key_embedding = nn.Embedding(num_keys + 1, d_model)  # + filler
        self.value_embedding = nn.Embedding(num_values + 2, d_model)  # + blank, filler
        self.blocks = nn.ModuleList(
            AttentionBlock(d_model, make_attention(attention, d_model, num_heads, seq_len,
                                                   **attention_options), d_ff or 2 * d_model)
            for _ in range(num_layers))
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_values)

    def _embed(self, keys: Tensor, values: Tensor) -> Tensor:
        if keys.dim() != 2 or keys.shape != values.shape:
            raise ValueError(f"keys and values must both be (batch, n); got {tuple(keys.shape)} "
                             f"and {tuple(values.shape)}")
        if keys.shape[1] > self.seq_len:
            raise ValueError(f"sequence length {keys.shape[1]} exceeds seq_len = {self.seq_len}")
        return self.key_embedding(keys) + self.value_embedding(values)  # (batch, n, d_model)

    def forward(self, keys: Tensor, values: Tensor) -> Tensor:
        x = self._embed(keys, values)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def attention_weights(self, keys: Tensor, values: Tensor) -> Tensor:
        """The softmax attention matrices of every layer: ``(batch, layers, heads, n, n)``.

        Only for the ``"softmax"`` kinds, which form them; Linformer, Performer and the blocked
        window never build an n × n matrix. Runs in eval mode (no dropout) without gradients.
        """
        if not all(isinstance(b.attn, MultiHeadAttention) for b in self.blocks):
            raise ValueError("attention_weights needs softmax attention (attention='softmax' or "
                             "'softmax-naive'); this model's layers never form the n × n weights")
        was_training = self.training
        self.eval()
        x, weights = self._embed(keys, values), []
        for block in self.blocks:
            attended, w = block.attn(block.norm1(x), need_weights=True)  # w: (batch, heads, n, n)
            weights.append(w)
            x = x + attended
            x = x + block.ffn(block.norm2(x))
        self.train(was_training)
        return torch.stack(weights, dim=1)

    @torch.no_grad()
    def attention_inputs(self, keys: Tensor, values: Tensor, layer: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """The queries, keys and values that layer ``layer``'s softmax attention receives, each
        ``(batch, heads, n, d_head)``: ``softmax(q kᵀ / √d_head)`` is that layer's
        :meth:`attention_weights`, and its output before ``out_proj`` is those weights times v.
        Lets an approximation (a Linformer projection, say) be scored on a trained model's inputs."""
        if not 0 <= layer < len(self.blocks):
            raise ValueError(f"layer must be in [0, {len(self.blocks)}), got {layer}")
        if not isinstance(self.blocks[layer].attn, MultiHeadAttention):
            raise ValueError("attention_inputs needs softmax attention (attention='softmax' or "
                             "'softmax-naive')")
        was_training = self.training
        self.eval()
        x = self._embed(keys, values)
        for block in self.blocks[:layer]:
            x = block(x)
        attn, h = self.blocks[layer].attn, self.blocks[layer].norm1(x)
        qkv = tuple(split_heads(proj(h), attn.num_heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        self.train(was_training)
        return qkv
