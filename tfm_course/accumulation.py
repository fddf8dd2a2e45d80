"""Gradient accumulation: k micro-batches that add up to the gradient of one big batch.

    loss = accumulate_gradients(model, micro_batches)                    # per-token mean, right
    loss = accumulate_gradients(model, micro_batches, normalise="micro-batch")   # the 2024 bug

Memory holds one micro-batch's activations at a time; the gradients of the micro-batches add up
in ``.grad`` (PyTorch adds into it until ``zero_grad``), and one optimiser step follows. The sum
is the big batch's gradient only if every micro-batch's loss is scaled by the right number.

A language model's loss is the mean over *target tokens*:
``L = (1 / N) Σ_i ℓ_i``, with ``N`` the number of targets that are not ``IGNORE_INDEX`` in the
whole batch. Split into micro-batches ``b = 1 … k`` with ``n_b`` targets each, that is

    L = Σ_b (1 / N) Σ_{i ∈ b} ℓ_i          (normalise="tokens": divide each sum by N, the total)

and **not** the mean of the micro-batches' means,

    L' = (1 / k) Σ_b (1 / n_b) Σ_{i ∈ b} ℓ_i   (normalise="micro-batch")

which weighs a token of a short micro-batch more than a token of a long one. The two agree only
when every micro-batch has the same number of targets (fixed-length windows, as in chapter 8);
with padded sequences of different lengths they do not. Several training libraries shipped
``L'`` until 2024 (Hugging Face's fix of its ``Trainer``, October 2024). The cure is to count the
targets of all ``k`` micro-batches *before* the first backward pass; with data parallelism the
count must also be summed over the processes.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NORMALISATIONS", "accumulate_gradients", "token_loss_sum", "count_targets"]

IGNORE_INDEX = -100
NORMALISATIONS = ("tokens", "micro-batch")


def count_targets(targets: Tensor) -> Tensor:
    """The number of targets that count (not ``IGNORE_INDEX``), as a 0-d tensor (no host sync)."""
    return (targets != IGNORE_INDEX).sum()


def token_loss_sum(model: nn.Module, ids: Tensor, targets: Tensor) -> Tensor:
    """Σ of the cross-entropy over the targets of ``ids (B, T)`` that are not ignored (a 0-d tensor).

    ``model(ids)`` must return ``(logits (B, T, V), ...)`` like chapter 8's GPT.
    """
    if ids.shape != targets.shape:
        raise ValueError(f"targets must have the shape of ids {tuple(ids.shape)}, got {tuple(targets.shape)}")
    logits = model(ids)[0]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def accumulate_gradients(model: nn.Module, micro_batches: Sequence[tuple[Tensor, Tensor]] | Iterable,
                         normalise: str = "tokens") -> Tensor:
    """Backward through each ``(ids, targets)`` micro-batch in turn; gradients add up in ``.grad``.

    ``normalise="tokens"`` scales each micro-batch's loss sum by 1 / (targets in *all* of them):
    the accumulated gradient then equals the gradient of the whole batch's per-token mean loss.
    ``"micro-batch"`` averages the micro-batches' own means (the bug described in the module
    docstring). Returns the per-token mean loss of the whole batch (a detached 0-d tensor) either
    way, so that a log shows the same number; only the gradients differ. The caller zeroes the
    gradients before and steps the optimiser after.
    """
    if normalise not in NORMALISATIONS:
        raise ValueError(f"normalise must be one of {NORMALISATIONS}, got {normalise!r}")
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches must hold at least one (ids, targets) pair, got none")
    counts = [count_targets(targets) for _, targets in micro_batches]
    total = torch.stack(counts).sum()  # known before the first backward pass: the fix
    loss_total = torch.zeros((), device=total.device)
    for (ids, targets), n in zip(micro_batches, counts):
        loss_sum = token_loss_sum(model, ids, targets)
        scale = total if normalise == "tokens" else n.clamp(min=1) * len(micro_batches)
        (loss_sum / scale).backward()
        loss_total = loss_total + loss_sum.detach()
    return loss_total / total.clamp(min=1)
