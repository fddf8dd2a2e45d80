"""``step_through``: run a mixer's ``step`` token by token, to compare with its whole-sequence pass."""

from __future__ import annotations

import torch


def step_through(mixer, x: torch.Tensor, state=None) -> tuple[torch.Tensor, object]:
    """``x (B, T, d)`` through ``mixer.step`` one position at a time: ``(outputs (B, T, d), last state)``."""
    outs = []
    for x_t in x.unbind(1):
        y, state = mixer.step(x_t, state)
        outs.append(y)
    return torch.stack(outs, 1), state
