"""Activation checkpointing: keep only some blocks' inputs, recompute the rest during backward.

    logits, loss = checkpointed_forward(model, ids, targets, every=2)   # chapter 8's GPT
    checkpoint_memory(n_layers=8, every=2, block_input=I, block_saved=A)  # the count, in bytes

A training step normally keeps every tensor the forward pass saves for backward, for all
``L = n_layers`` blocks at once. With checkpointing, the blocks are cut into segments of
``every`` consecutive blocks; a segment saves only its *input* (PyTorch's
``torch.utils.checkpoint``, non-reentrant) and runs its forward again during backward, one
segment at a time, to get its saved tensors back just before they are needed. So the peak holds

    M(k) = (L / k) · I  +  k · A          (k = every)

``I`` the bytes of one block's input (batch · seq · d_model numbers) and ``A`` the bytes one block
saves when it is not checkpointed. The first term falls with ``k``, the second grows; the minimum
is at ``k* = √(L · I / A)``. Chen et al. (2016) state it for a chain in which every layer saves
one tensor the size of its input (``A = I``): segments of ``√L`` layers, memory ``2√L · I``
instead of ``L · I``, for one extra forward pass. A Transformer block saves many tensors
(``A`` is 10–20 times ``I``), so there ``k* < 1``: checkpoint every block (``every=1``), which is
what large-model trainers do. ``every=None`` runs the plain forward.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .models.gpt import IGNORE_INDEX

__all__ = ["checkpointed_forward", "checkpoint_memory", "best_segment"]


def _run(blocks: nn.ModuleList, start: int, stop: int, x: Tensor) -> Tensor:
    for block in blocks[start:stop]:
        x = block(x)
    return x


def checkpointed_forward(model: nn.Module, ids: Tensor, targets: Tensor | None = None,
                         every: int | None = 1) -> tuple[Tensor, Tensor | None]:
    """Chapter 8's ``GPT.forward`` with its blocks checkpointed in segments of ``every``.

    Same inputs and outputs as ``model(ids, targets)``: ``ids (B, T)`` → ``(logits (B, T, V),
    loss)``, and the same gradients (the recomputation repeats the same operations); only what is
    kept between forward and backward changes. ``every=None``: no checkpointing.
    """
    n_layers = len(model.blocks)
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                              or not 1 <= every <= n_layers):
        raise ValueError(f"every must be None or an integer in [1, n_layers={n_layers}], got {every!r}")
    if every is None or not model.training:
        return model(ids, targets)
    x = model.embed(ids)
    for start in range(0, n_layers, every):
        x = checkpoint(_run, model.blocks, start, min(start + every, n_layers), x, use_reentrant=False)
    logits = model.lm_head(model.norm(x))
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def checkpoint_memory(n_layers: int, every: int | None, block_input: float, block_saved: float) -> float:
    """Bytes the blocks keep at the peak of backward, by the count ``M(k) = (L/k)·I + k·A``.

    Without checkpointing (``every=None``) it is ``L · A``. Segments need not divide ``L``: the
    count uses ``⌈L/k⌉`` stored inputs and the longest segment, ``min(k, L)`` blocks.
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if every is None:
        return n_layers * block_saved
    if every < 1:
        raise ValueError(f"every must be None or >= 1, got {every}")
    return math.ceil(n_layers / every) * block_input + min(every, n_layers) * block_saved


def best_segment(n_layers: int, block_input: float, block_saved: float) -> float:
    """``k* = √(L · I / A)``, the segment length that minimises :func:`checkpoint_memory`."""
    if min(n_layers, block_input, block_saved) <= 0:
        raise ValueError(f"need positive n_layers, block_input, block_saved, got "
                         f"{n_layers}, {block_input}, {block_saved}")
    return math.sqrt(n_layers * block_input / block_saved)
