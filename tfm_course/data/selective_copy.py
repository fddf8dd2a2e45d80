"""Selective copying (Gu & Dao, 2023): remember a few tokens scattered among fillers, in order.

The plain copying task puts the tokens to copy at fixed places, so a time-invariant model (a
convolution, S4) can solve it by remembering fixed offsets. The *selective* version scatters them
at random positions between :data:`BLANK` fillers, so the model has to decide from each token's
*content* whether to keep it or to ignore it — which is what Mamba's input-dependent Δ, B, C are
for. After the scattered part come ``n_tokens`` :data:`MARKER` tokens; at the i-th marker the
label is the i-th data token::

    inputs:  0  7  0  0  4  0  9  0  1  1  1
    labels:  −  −  −  −  −  −  −  −  7  4  9          (− is IGNORE = −100)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .recall import IGNORE, _draw_without_replacement

__all__ = ["BLANK", "MARKER", "selective_copying"]

BLANK = 0  # filler between the tokens to remember
MARKER = 1  # "output the next remembered token now"


def selective_copying(n_examples: int, vocab_size: int, seq_len: int, n_tokens: int,
                      generator: torch.Generator | None = None,
                      device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)``, both ``(n_examples, seq_len)`` int64.

    ``n_tokens`` data tokens, drawn from ``[2, vocab_size)`` (repeats allowed), sit at random
    distinct positions of the first ``seq_len − n_tokens`` places, in order; the other places
    hold :data:`BLANK`. The last ``n_tokens`` places hold :data:`MARKER`, labelled with the data
    tokens in the order they appeared; every other label is ``IGNORE``. The Mamba paper's setting
    is ``vocab_size=16, n_tokens=16, seq_len=4096`` (its table counts the 16 markers separately).

    Drawn with ``generator`` (on its device, the CPU by default), then moved to ``device``.
    """
    if n_examples < 1 or n_tokens < 1:
        raise ValueError(f"n_examples and n_tokens must be positive, got {n_examples}, {n_tokens}")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be at least 3 (blank, marker, one data token), "
                         f"got {vocab_size}")
    if seq_len < 2 * n_tokens:
        raise ValueError(f"seq_len must hold {n_tokens} data tokens and {n_tokens} markers, i.e. be "
                         f"at least {2 * n_tokens}; got {seq_len}")
    span = seq_len - n_tokens  # the scattered part
    gen_device = generator.device if generator is not None else torch.device("cpu")
    data = torch.randint(2, vocab_size, (n_examples, n_tokens), generator=generator,
                         device=gen_device)
    places = _draw_without_replacement(n_examples, span, n_tokens, generator).sort(dim=-1).values
    inputs = torch.full((n_examples, seq_len), BLANK, dtype=torch.int64, device=gen_device)
    inputs.scatter_(1, places, data)
    inputs[:, span:] = MARKER
    labels = torch.full_like(inputs, IGNORE)
    labels[:, span:] = data
    return inputs.to(device), labels.to(device)
