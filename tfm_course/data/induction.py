"""Induction heads (Olsson et al., 2022; the Mamba paper's version): "… A B … A → B".

A row of random tokens contains a :data:`TRIGGER` once somewhere, followed by some token B; the
row ends with the trigger again, and the label there is B. Solving it needs a lookup by content
(where did the trigger appear?) and a shift by one (what came right after it?). Gu & Dao (2023)
train at length 256 and test at lengths up to 2^20 to see which models *extrapolate*::

    inputs:  5  2  0  9  3  7  4  0
    labels:  −  −  −  −  −  −  −  9          (− is IGNORE = −100; 0 is the trigger)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .recall import IGNORE

__all__ = ["TRIGGER", "induction_heads"]

TRIGGER = 0  # the special token; every other token is drawn from [1, vocab_size)


def induction_heads(n_examples: int, vocab_size: int, seq_len: int,
                    generator: torch.Generator | None = None,
                    device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)``, both ``(n_examples, seq_len)`` int64.

    Tokens are uniform in ``[1, vocab_size)``; :data:`TRIGGER` sits at one random position
    ``p ≤ seq_len − 3`` and at the last position, and nowhere else. The label at the last
    position is ``inputs[p + 1]``; every other label is ``IGNORE``.

    Drawn with ``generator`` (on its device, the CPU by default), then moved to ``device``.
    """
    if n_examples < 1:
        raise ValueError(f"n_examples must be positive, got {n_examples}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2 (the trigger and one token), got {vocab_size}")
    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3 (trigger, answer, trigger), got {seq_len}")
    gen_device = generator.device if generator is not None else torch.device("cpu")
    inputs = torch.randint(1, vocab_size, (n_examples, seq_len), generator=generator,
                           device=gen_device)
    first = torch.randint(seq_len - 2, (n_examples, 1), generator=generator, device=gen_device)
    inputs.scatter_(1, first, TRIGGER)
    inputs[:, -1] = TRIGGER
    labels = torch.full_like(inputs, IGNORE)
    labels[:, -1] = inputs.gather(1, first + 1)[:, 0]
    return inputs.to(device), labels.to(device)
