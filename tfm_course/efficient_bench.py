"""Quality at equal training time: each attention variant trained for the same seconds.

    results = quality_at_equal_time(["softmax", "window", "linformer", "performer"], seconds=5)
    [(r.attention, r.steps, r.accuracy) for r in results]

Every run trains a :class:`~tfm_course.models.recall_classifier.RecallClassifier` (same width,
depth and projections; only the attention differs) on fresh batches of
:func:`~tfm_course.data.scattered_recall.scattered_recall` for ``seconds`` of wall-clock time,
then scores it on a fixed held-out set: the fraction of queries answered with the right value.
A faster method gets more steps in the same time; a cheaper approximation may learn less per step
— the comparison weighs both. Before the clock starts, two untimed forward/backward passes warm
the kernels up, so the first method in a process pays no one-time start-up costs for the others.
On a CPU the runs use one thread (steadier on a busy machine, and what a small model needs).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .data.scattered_recall import IGNORE, ScatteredRecallBatch, scattered_recall
from .device import get_device, one_cpu_thread
from .models.recall_classifier import RecallClassifier
from .train import train

__all__ = ["QualityResult", "recall_accuracy", "train_for", "quality_at_equal_time", "TASK"]

TASK = dict(num_records=16, num_queries=64, num_keys=64, num_values=16)  # with length = n


@dataclass
class QualityResult:
    """One trained model (one row of the quality table)."""

    attention: str
    seed: int
    length: int
    steps: int  # optimisation steps reached in the time budget
    seconds: float  # wall-clock training time (the budget, plus at most one step)
    accuracy: float  # on the held-out queries; chance is 1 / num_values
    parameters: int

    @property
    def ms_per_step(self) -> float:
        return 1e3 * self.seconds / self.steps

    def as_dict(self) -> dict:
        return {**asdict(self), "ms_per_step": self.ms_per_step}


def recall_accuracy(model: nn.Module, batch: ScatteredRecallBatch) -> float:
    """Fraction of query positions whose top prediction is the right value."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        predicted = model(batch.keys, batch.values).argmax(-1)
    model.train(was_training)
    asked = batch.targets != IGNORE
    return float((predicted[asked] == batch.targets[asked]).float().mean())


def _loss(model: nn.Module, batch: ScatteredRecallBatch) -> torch.Tensor:
    logits = model(batch.keys, batch.values)  # (batch, n, num_values)
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)


def train_for(attention: str, seconds: float, seed: int = 0, length: int = 256,
              batch_size: int = 16, lr: float = 3e-3, device: torch.device | str | None = None,
              test_size: int = 256, progress: bool = False, task: dict | None = None,
              **model_options: int) -> QualityResult:
    """Train one model for ``seconds`` and score it; see the module docstring.

    ``task`` overrides :data:`TASK` (records, queries, keys, values); ``model_options`` go to
    :class:`RecallClassifier` (``d_model``, ``num_heads``, ``num_layers``, ``window``, ``k``,
    ``num_features``). The held-out set is the same for every attention and seed.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    device = torch.device(device) if device is not None else get_device()
    task = {**TASK, **(task or {}), "length": length}
    test = scattered_recall(test_size, **task, generator=torch.Generator().manual_seed(10_000),
                            device=device)
    torch.manual_seed(seed)
    model = RecallClassifier(task["num_keys"], task["num_values"], length, attention,
                             **model_options).to(device)
    data = torch.Generator().manual_seed(seed)
    threads = one_cpu_thread(device) if device.type == "cpu" else nullcontext()
    with threads:
        warm = scattered_recall(batch_size, **task, generator=torch.Generator().manual_seed(-1),
                                device=device)
        for _ in range(2):  # untimed: lazy initialisation, kernel selection, allocator warm-up
            _loss(model, warm).backward()
        model.zero_grad(set_to_none=True)
        history = train(model, lambda step: scattered_recall(batch_size, **task, generator=data,
                                                             device=device),
                        _loss, steps=10**9, lr=lr, time_limit_s=seconds, progress=progress,
                        desc=attention)
        accuracy = recall_accuracy(model, test)
    return QualityResult(attention, seed, length, len(history.steps), history.seconds, accuracy,
                         sum(p.numel() for p in model.parameters()))


def quality_at_equal_time(attentions: Sequence[str], seconds: float, seeds: Sequence[int] = (0,),
                          **options) -> list[QualityResult]:
    """:func:`train_for` every attention kind with every seed, the same ``seconds`` each."""
    return [train_for(kind, seconds, seed=seed, **options) for kind in attentions for seed in seeds]
