"""One stack of T5 blocks as a language model: encoder-only (masked LM) or decoder-only (causal
or prefix LM).

    model = T5StackLM(T5Config(vocab_size=600, d_model=64, d_kv=16, d_ff=320, num_layers=4,
                               num_heads=4, dropout=0.0), causal=True)
    logits = model(ids)                                  # (batch, seq, vocab): next-token logits
    logits = model(ids, prefix_len=torch.tensor([5, 9]))  # prefix LM: prefixes fully visible

The T5 paper compares architectures and objectives on the same blocks (its section 3.2), and so
does chapter 9: :class:`~tfm_course.models.t5.T5`'s shared embedding, RMS norms, unscaled
attention, relative position bias shared across the stack, and tied output layer with its
d_model^-1/2 rescale — only the attention pattern changes:

* ``causal=False``: every token sees every token (an encoder, for masked language modelling),
  with bidirectional position buckets;
* ``causal=True``: token i sees tokens <= i (a decoder-only language model), causal buckets;
  with ``prefix_len`` the first tokens of each row are fully visible to one another
  (:func:`~tfm_course.models.t5_blocks.prefix_lm_mask`), the rest is causal.

Masks are bool, True = may attend; ``attention_mask`` ``(batch, seq)`` is True on real tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .t5 import _check_ids, init_t5_weights
from .t5_blocks import T5Stack
from .t5_config import T5Config

__all__ = ["T5StackLM", "stack_lm_mask"]


def stack_lm_mask(seq_len: int, causal: bool, prefix_len: Tensor | int | None = None,
                  attention_mask: Tensor | None = None,
                  device: torch.device | str | None = None) -> Tensor | None:
    """The bool mask a :class:`T5StackLM` attends with, broadcastable to ``(B, 1, seq, seq)``.

    ``causal`` gives the lower triangle; ``prefix_len`` (an int, or ``(B,)`` per row) also opens
    the first ``prefix_len`` keys to every query; ``attention_mask`` ``(B, seq)`` closes padded
    keys. None when nothing is masked (an encoder without padding).
    """
    mask = None
    if causal:
        i = torch.arange(seq_len, device=device)
        mask = (i[None, :] <= i[:, None])[None, None]  # (1, 1, seq, seq)
        if prefix_len is not None:
            prefix = torch.as_tensor(prefix_len, device=device).reshape(-1, 1, 1, 1)  # (B or 1, 1, 1, 1)
            mask = mask | (i[None, None, None, :] < prefix)
    elif prefix_len is not None:
        raise ValueError("prefix_len only makes sense with causal=True (an encoder sees everything)")
    if attention_mask is not None:
        keys = attention_mask[:, None, None, :]  # (B, 1, 1, seq)
        mask = keys if mask is None else mask & keys
    return mask


class T5StackLM(nn.Module):
    """Shared embedding, one :class:`~tfm_course.models.t5_blocks.T5Stack`, tied output layer.

    ``config.num_layers`` blocks; the decoder-side settings of the config are unused. The position
    buckets are bidirectional when the model is not causal; a prefix LM may ask for them too
    (``bidirectional_buckets=True``), so that prefix tokens tell keys on their right from keys on
    their left (with causal buckets every key to the right falls in bucket 0, masked or not).
    ``forward(ids, attention_mask=None, prefix_len=None) -> logits (B, seq, vocab)``;
    ``hidden(...)`` returns the stack's output ``(B, seq, d_model)`` before the output layer.
    """

    def __init__(self, config: T5Config, causal: bool, bidirectional_buckets: bool | None = None) -> None:
        super().__init__()
        self.config, self.causal, self.pad_id = config, causal, config.pad_id
        buckets = not causal if bidirectional_buckets is None else bidirectional_buckets
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.stack = T5Stack(config, config.num_layers, cross_attention=False, bidirectional=buckets)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_t5_weights(self, config)
        if config.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    def hidden(self, ids: Tensor, attention_mask: Tensor | None = None,
               prefix_len: Tensor | int | None = None) -> Tensor:
        """``(B, seq)`` ids -> ``(B, seq, d_model)``."""
        _check_ids(ids, "ids")
        if attention_mask is not None and (attention_mask.dtype != torch.bool
                                           or attention_mask.shape != ids.shape):
            raise ValueError(f"attention_mask must be bool {tuple(ids.shape)}, True on real tokens; got "
                             f"{tuple(attention_mask.shape)} {attention_mask.dtype}")
        mask = stack_lm_mask(ids.shape[1], self.causal, prefix_len, attention_mask, ids.device)
        return self.stack(self.shared(ids), mask)

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None,
                prefix_len: Tensor | int | None = None) -> Tensor:
        x = self.hidden(ids, attention_mask, prefix_len)
        if self.config.rescale_output:
            x = x * self.config.d_model ** -0.5
        return self.lm_head(x)
