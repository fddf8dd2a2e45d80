"""Synthetic tasks that cannot be solved without knowing where tokens are.

``shifted_copy``: at every position output the token ``shift`` places to the left,
``target[i] = tokens[i - shift]``. The answer depends only on the *relative* offset, so a model
that has learned it at one length has, in principle, learned it at every length — which makes it
a clean probe of how position encodings behave on sequences longer than the training ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE = -100  # target of positions with no answer (the first ``shift``); skipped by the loss

__all__ = ["IGNORE", "shifted_copy", "token_accuracy", "accuracy_by_position"]


def shifted_copy(batch_size: int, length: int, vocab_size: int, shift: int = 1,
                 generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Random tokens ``(batch, length)`` in ``[0, vocab_size)`` and targets ``tokens[:, i - shift]``.

    The first ``shift`` targets are :data:`IGNORE` (there is nothing ``shift`` places to their left).
    """
    for name, value in (("batch_size", batch_size), ("length", length), ("vocab_size", vocab_size)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if not 0 <= shift < length:
        raise ValueError(f"shift must be in [0, length={length}), got {shift}")
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, shift:] = tokens[:, : length - shift]
    return tokens.to(device), targets.to(device)


def token_accuracy(logits: Tensor, targets: Tensor) -> float:
    """Fraction of non-ignored positions where ``argmax(logits) == target``; logits ``(batch, seq, classes)``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be (batch, seq, classes) for targets "
                         f"{tuple(targets.shape)}")
    keep = targets != IGNORE
    return float((logits.argmax(-1) == targets)[keep].float().mean())


def accuracy_by_position(logits: Tensor, targets: Tensor) -> Tensor:
    """Accuracy at each position, averaged over the batch: ``(seq,)``, NaN where every target is ignored."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be (batch, seq, classes) for targets "
                         f"{tuple(targets.shape)}")
    keep = (targets != IGNORE).float()
    hits = (logits.argmax(-1) == targets).float() * keep
    return hits.sum(0) / keep.sum(0)  # 0 / 0 = NaN where nothing is kept
