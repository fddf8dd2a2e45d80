"""Quality at equal training steps, each attention variant at its own learning rate.

    results = quality_at_equal_steps(["softmax", "window", "linformer", "performer"], steps=75,
                                     lrs={"softmax": 6e-3, "window": 1.2e-2, ...})
    sweep = lr_sweep(["softmax", "window"], lrs=(3e-3, 6e-3, 1.2e-2), steps=75, seeds=(0, 1))
    best_rates(sweep)          # {"softmax": ..., "window": ...}: the best mean accuracy per method

Every run trains a :class:`~tfm_course.models.recall_classifier.RecallClassifier` (same width,
depth and projections; only the attention differs) on fresh batches of
:func:`~tfm_course.data.scattered_recall.scattered_recall` for a budget of ``steps``, then scores
it on a fixed held-out set: the fraction of queries answered with the right value. A budget in
steps decides the outcome the same way on every machine, however slow or busy; time is
*measured* alongside (``step_ms``, the fastest of several steps, on a CPU its CPU time), so the
steps-per-second ratio between two methods can be reported, but it decides nothing.

``seconds`` (the older budget) is still accepted by :func:`train_for`: ``timing="measured"``
converts it to ``seconds / step`` steps from the measured step time, ``"wall"`` trains until that
much wall-clock time has passed. Both depend on the machine, so the chapter does not use them.

On a CPU the runs use one thread (steadier on a busy machine, and what a small model needs) and
flush subnormal floats to zero (:func:`flush_denormals`): without it, Linformer's training steps
slowed down about threefold after a few dozen steps (30 → 90 ms of CPU time at n = 256), which
makes its measured step time misleading.

:func:`quality_table` summarises the results per method as a markdown table (the time / memory
sweep's tables are in :mod:`tfm_course.experiments.scaling`); the learning rates of chapter 10
come from the stored sweep ``tools/runs/equal_steps_lr.py``.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.scattered_recall import IGNORE, ScatteredRecallBatch, scattered_recall
from ..device import get_device, one_cpu_thread
from ..models.recall_classifier import RecallClassifier
from ..train import train
from .measure import time_fn

__all__ = ["QualityResult", "recall_accuracy", "train_for", "quality_at_equal_steps",
           "quality_at_equal_time", "lr_sweep", "best_rates", "rate_beyond", "TASK", "quality_table",
           "flush_denormals"]

# with length = n. Every key is a record's (num_keys = num_records) and lr = 6e-3: softmax
# attention then learns n = 256 in about 75 steps (about 200 with 64 keys and lr = 3e-3)
TASK = dict(num_records=16, num_queries=64, num_keys=16, num_values=16)


@dataclass
class QualityResult:
    """One trained model (one row of the quality table)."""

    attention: str
    seed: int
    length: int
    steps: int  # optimisation steps taken (the budget)
    step_ms: float  # one training step, the fastest of several (CPU time on a CPU), before training
    seconds: float  # wall-clock time the training loop took
    accuracy: float  # on the held-out queries; chance is 1 / num_values
    parameters: int
    lr: float = 6e-3  # the (constant) AdamW learning rate it trained with
    model: nn.Module | None = field(default=None, repr=False, compare=False)  # the trained model

    def as_dict(self) -> dict:
        """The numbers (everything but the model)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}


@contextmanager
def flush_denormals(device: torch.device | str) -> Iterator[None]:
    """On a CPU, treat subnormal floats (|x| < 1.2e-38 in float32) as zero inside the block.

    x86 CPUs compute with subnormal numbers tens of times more slowly than with normal ones, so a
    training run whose gradients or optimizer statistics drift into that range slows down as it
    trains. Flushing them changes results only below float32's smallest normal number. On an
    accelerator nothing changes. PyTorch has no getter for the setting; it is switched back off
    (PyTorch's default) on exit.
    """
    flush = torch.device(device).type == "cpu" and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flush:
            torch.set_flush_denormal(False)


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


def train_for(attention: str, seconds: float | None = None, seed: int = 0, length: int = 256,
              batch_size: int = 16, lr: float = 6e-3, device: torch.device | str | None = None,
              test_size: int = 256, progress: bool = False, task: dict | None = None,
              timing: str = "measured", steps: int | None = None,
              **model_options: int) -> QualityResult:
    """Train one model for ``steps`` optimisation steps (or, older, ``seconds``) and score it.

    Give exactly one budget. ``steps`` fixes the outcome on every machine; ``seconds`` is turned
    into steps by ``timing`` (see the module docstring) and so depends on the machine.

    ``task`` overrides :data:`TASK` (records, queries, keys, values); ``model_options`` go to
    :class:`RecallClassifier` (``d_model``, ``num_heads``, ``num_layers``, ``window``, ``k``,
    ``num_features``). The held-out set is the same for every attention and seed.
    """
    if (seconds is None) == (steps is None):
        raise ValueError(f"give exactly one budget, steps or seconds; got steps={steps}, "
                         f"seconds={seconds}")
    if seconds is not None and seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    if timing not in ("measured", "wall"):
        raise ValueError(f"timing must be 'measured' or 'wall', got {timing!r}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    if lr <= 0:
        raise ValueError(f"lr must be positive, got {lr}")
    device = torch.device(device) if device is not None else get_device()
    task = {**TASK, **(task or {}), "length": length}
    test = scattered_recall(test_size, **task, generator=torch.Generator().manual_seed(10_000),
                            device=device)
    torch.manual_seed(seed)
    model = RecallClassifier(task["num_keys"], task["num_values"], length, attention,
                             **model_options).to(device)
    data = torch.Generator().manual_seed(seed)
    threads = one_cpu_thread(device) if device.type == "cpu" else nullcontext()
    with threads, flush_denormals(device):
        step_s = _step_seconds(model, task, batch_size, lr, device)  # also warms the kernels up
        if steps is not None:
            limit = None
        elif timing == "measured":
            steps, limit = max(1, int(seconds / step_s)), None
        else:
            steps, limit = 10**9, seconds
        history = train(model, lambda step: scattered_recall(batch_size, **task, generator=data,
                                                             device=device),
                        _loss, steps=steps, lr=lr, time_limit_s=limit, progress=progress,
                        desc=attention)
        accuracy = recall_accuracy(model, test)
    return QualityResult(attention, seed, length, len(history.steps), 1e3 * step_s, history.seconds,
                         accuracy, sum(p.numel() for p in model.parameters()), lr, model)


def _step_seconds(model: nn.Module, task: dict, batch_size: int, lr: float,
                  device: torch.device) -> float:
    """Fastest of several full training steps (data, forward, backward, AdamW) on a *copy* of the
    model, so the model that is then trained starts from its initialisation.

    On a CPU (one thread) this is the process's CPU time, which other programs on a busy machine do
    not inflate, so the step count matches what an idle machine would reach; on a GPU, wall-clock
    time with synchronisation.
    """
    probe = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr)
    g = torch.Generator().manual_seed(-1)

    def step() -> None:
        loss = _loss(probe, scattered_recall(batch_size, **task, generator=g, device=device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    if device.type != "cpu":
        return time_fn(step, repeats=5, warmup=2, device=device, stat="min")
    for _ in range(2):  # warm-up
        step()
    times = []
    for _ in range(5):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return min(times)


def quality_at_equal_time(attentions: Sequence[str], seconds: float, seeds: Sequence[int] = (0,),
                          **options) -> list[QualityResult]:
    """:func:`train_for` every attention kind with every seed, the same ``seconds`` each (machine-
    dependent; prefer :func:`quality_at_equal_steps`)."""
    return [train_for(kind, seconds, seed=seed, **options) for kind in attentions for seed in seeds]


def quality_at_equal_steps(attentions: Sequence[str], steps: int, lrs: Mapping[str, float],
                           seeds: Sequence[int] = (0,), **options) -> list[QualityResult]:
    """:func:`train_for` every attention kind with every seed for the same ``steps``, each at its
    own learning rate ``lrs[kind]`` (e.g. :func:`best_rates` of a :func:`lr_sweep`)."""
    missing = [kind for kind in attentions if kind not in lrs]
    if missing:
        raise ValueError(f"lrs must give a rate for every attention; missing {missing}")
    return [train_for(kind, steps=steps, seed=seed, lr=lrs[kind], **options)
            for kind in attentions for seed in seeds]


def lr_sweep(attentions: Sequence[str], lrs: Sequence[float], steps: int,
             seeds: Sequence[int] = (0,), **options) -> list[QualityResult]:
    """Every attention × learning rate × seed, ``steps`` each: the grid :func:`best_rates` reads."""
    if not lrs:
        raise ValueError("lrs must list at least one learning rate")
    return [train_for(kind, steps=steps, seed=seed, lr=lr, **options)
            for kind in attentions for lr in lrs for seed in seeds]


def best_rates(results: Sequence[QualityResult]) -> dict[str, float]:
    """Per attention kind, the learning rate with the best held-out accuracy averaged over seeds
    (a tie goes to the smaller rate)."""
    mean: dict[str, dict[float, list[float]]] = {}
    for r in results:
        mean.setdefault(r.attention, {}).setdefault(r.lr, []).append(r.accuracy)
    return {kind: max(sorted(by_lr), key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr]))
            for kind, by_lr in mean.items()}


def rate_beyond(tried: Sequence[float], best: float) -> float | None:
    """The next learning rate to try when ``best`` sits at an end of the rates ``tried``: half the
    smallest, or twice the largest; None when it is inside (a grid widened only where it must be)."""
    if best not in tried:
        raise ValueError(f"best rate {best} is not among the rates tried {sorted(tried)}")
    if best == min(tried):
        return best / 2
    return best * 2 if best == max(tried) else None


def quality_table(results: Sequence[QualityResult]) -> str:
    """One row per attention: seeds, learning rate, steps, ms per step, held-out accuracy (mean,
    min–max)."""
    lines = ["| attention | seeds | lr | steps | ms / step | accuracy (mean) | min – max |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in dict.fromkeys(r.attention for r in results):
        mine = [r for r in results if r.attention == kind]
        accs = [r.accuracy for r in mine]
        rates = "/".join(f"{lr:g}" for lr in dict.fromkeys(r.lr for r in mine))
        lines.append(f"| {kind} | {len(mine)} | {rates} | {sum(r.steps for r in mine) / len(mine):.0f} | "
                     f"{sum(r.step_ms for r in mine) / len(mine):.1f} | "
                     f"{sum(accs) / len(accs):.3f} | {min(accs):.3f} – {max(accs):.3f} |")
    return "\n".join(lines)
