"""One small training loop used by every chapter: progress bar, AMP, clipping, schedules, history.

    history = train(model, make_batch, loss_fn, steps=500, lr=3e-3, schedule=warmup_cosine(50, 500))

``make_batch(step)`` returns a batch (anything: a tensor, a tuple, a dict) already on the device;
``loss_fn(model, batch)`` returns a scalar loss. Evaluation runs every ``eval_every`` steps through
``eval_fn(model) -> {name: value}`` and lands in ``history.metrics``.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
import tqdm as tqdm_text
import tqdm.auto as tqdm_auto

from .device import autocast_dtype
from .widgets import interactive_available

Schedule = Callable[[int], float]  # step (0-based) -> learning-rate multiplier


# --------------------------------------------------------------------------- schedules
def constant() -> Schedule:
    """Multiplier 1 at every step."""
    return lambda step: 1.0


def warmup_cosine(warmup: int, total: int, floor: float = 0.1) -> Schedule:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``floor`` at ``total``."""
    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return schedule


def warmup_times_cosine(warmup: int, total: int, floor: float = 0.1) -> Schedule:
    """One cosine from 1 at step 0 to ``floor`` at ``total``, times a linear warm-up factor
    ``min(1, (step + 1) / warmup)``.

    Unlike :func:`warmup_cosine`, the cosine does not wait for the warm-up to end: runs that differ
    only in ``warmup`` get the same learning rate once the warm-up is over (from step ``warmup - 1``
    on), so warm-up is the only difference between them. ``warmup=0`` gives the plain cosine (the same as
    ``warmup_cosine(0, total, floor)``).
    """
    if warmup < 0 or total <= 0:
        raise ValueError(f"need warmup >= 0 and total > 0, got warmup={warmup}, total={total}")

    def schedule(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
        progress = min(1.0, step / total)
        return ramp * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
    return schedule


def noam(d_model: int, warmup: int) -> Schedule:
    """The schedule of Vaswani et al. (2017): d_model^-0.5 · min(s^-0.5, s · warmup^-1.5), s = step + 1.

    Use it with ``lr=1.0`` (the formula *is* the learning rate). Note ``**``, not ``^`` (XOR in Python).
    """
    def schedule(step: int) -> float:
        s = step + 1
        return d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)
    return schedule


# --------------------------------------------------------------------------- optimiser groups
def weight_decay_groups(model: nn.Module, weight_decay: float,
                        no_decay: Iterable[nn.Parameter] = ()) -> list[dict[str, Any]]:
    """AdamW parameter groups as nanoGPT's ``configure_optimizers`` makes them: ``weight_decay`` on
    every parameter with two or more dimensions (the matrices of the linear layers and the
    embeddings, a tied output layer once), none on the 1-D ones (biases, normalisation gains),
    nor on the parameters listed in ``no_decay`` (e.g. Mamba's ``A_log``, or the embeddings).

    >>> torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))

    Decaying a gain pulls it towards 0, not towards its natural value 1, and a bias has no scale
    to regularise, which is why the references leave them out.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a tied one once
    excluded = {id(p) for p in no_decay}
    decay = [p for p in params if p.dim() >= 2 and id(p) not in excluded]
    chosen = {id(p) for p in decay}
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in chosen], "weight_decay": 0.0}]


# --------------------------------------------------------------------------- history
@dataclass
class History:
    """What happened during training, for plots and for glued numbers."""

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    seconds: float = 0.0

    def last(self, name: str) -> float:
        """The latest value of metric ``name`` (or ``"loss"``)."""
        if name == "loss":
            return self.loss[-1]
        return self.metrics[name][-1][1]


# --------------------------------------------------------------------------- loop
def _progress_bar(steps: int, desc: str, disable: bool):
    """A live bar where someone watches: a widget in Jupyter / Colab, text in a terminal. In a
    book build or a test (no one watching, output kept) the bar is off and one summary line is
    printed at the end instead of a frozen snapshot or a flood of updates."""
    if interactive_available():
        return tqdm_auto.tqdm(range(steps), desc=desc, disable=disable, mininterval=0.5)
    return tqdm_text.tqdm(range(steps), desc=desc, mininterval=0.5,
                          disable=disable or not sys.stderr.isatty())


def mixed_precision(device: torch.device | str, amp: bool = True
                    ) -> tuple[torch.dtype | None, torch.amp.GradScaler | None]:
    """The autocast dtype and the ``GradScaler`` :func:`train` uses on ``device``.

    ``(bfloat16, None)`` on GPUs of compute capability 8.0 and newer, ``(float16, GradScaler)`` on
    older ones such as the T4 (fp16 gradients underflow without loss scaling), ``(None, None)`` on
    the CPU or with ``amp=False``. See :func:`tfm_course.device.autocast_dtype`.
    """
    device = torch.device(device)
    dtype = autocast_dtype(device) if amp else None
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    return dtype, scaler


def _step(model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor],
          optimizer: torch.optim.Optimizer, clip: float | None, device_type: str,
          dtype: torch.dtype | None, scaler: torch.amp.GradScaler | None) -> torch.Tensor:
    """One optimisation step. Returns the loss detached, as an fp32 scalar *still on the device*:
    reading it (``.item()``) would make the CPU wait for the GPU to finish the step."""
    context = torch.autocast(device_type, dtype=dtype) if dtype else nullcontext()
    with context:
        loss = loss_fn(model, batch)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    if scaler is not None:
        scaler.step(optimizer)  # skips the step if a gradient overflowed (this check syncs)
        scaler.update()
    else:
        optimizer.step()
    return loss.detach().float()


def train(
    model: nn.Module,
    make_batch: Callable[[int], Any],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    *,
    steps: int,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    schedule: Schedule | None = None,
    clip: float | None = 1.0,
    optimizer: torch.optim.Optimizer | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int | None = None,
    amp: bool = True,
    time_limit_s: float | None = None,
    stop_when: Callable[["History"], bool] | None = None,
    progress: bool = True,
    desc: str = "training",
    loss_every: int = 50,
) -> History:
    """Train ``model`` for ``steps`` steps of AdamW (or ``optimizer``); return a :class:`History`.

    On a GPU the forward pass runs under autocast (bf16, or fp16 with a ``GradScaler``: see
    :func:`mixed_precision`); on CPU in fp32. ``clip`` is the max global gradient norm (None: no
    clipping). ``time_limit_s`` stops early once that many seconds have passed (the history says
    how far it got). ``stop_when(history)`` is asked after each evaluation; True stops training
    early (e.g. once a goal metric is reached).

    The losses stay on the device and are copied to the host together every ``loss_every`` steps,
    at each evaluation and at the end: a per-step ``loss.item()`` would make the CPU wait for the
    GPU at every step, so the GPU would idle while Python prepares the next one. ``history.loss``
    still holds one loss per step once training returns (and is complete whenever ``eval_fn`` and
    ``stop_when`` run); the progress bar's loss is refreshed at those read points.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    if loss_every <= 0:
        raise ValueError(f"loss_every must be positive, got {loss_every}")
    device = next(model.parameters()).device
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    schedule = schedule or constant()
    dtype, scaler = mixed_precision(device, amp)
    history = History()
    pending: list[torch.Tensor] = []  # losses of the steps not yet read, on the device
    start = time.perf_counter()
    model.train()
    bar = _progress_bar(steps, desc, disable=not progress)

    def read_losses() -> None:  # one host sync for all pending steps
        if pending:
            history.loss.extend(torch.stack(pending).cpu().tolist())
            pending.clear()
            bar.set_postfix(loss=f"{history.loss[-1]:.4f}", refresh=False)

    for step in bar:
        multiplier = schedule(step)
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * multiplier
        batch = make_batch(step)
        pending.append(_step(model, batch, loss_fn, optimizer, clip, device.type, dtype, scaler))
        history.steps.append(step)
        history.lr.append(optimizer.param_groups[0]["lr"])
        last = step == steps - 1
        over_time = time_limit_s is not None and time.perf_counter() - start > time_limit_s
        evaluate = eval_fn is not None and (
            (eval_every and (step + 1) % eval_every == 0) or last or over_time)
        if evaluate or last or over_time or len(pending) >= loss_every:
            read_losses()
        if evaluate:
            model.eval()
            with torch.no_grad():
                for name, value in eval_fn(model).items():
                    history.metrics.setdefault(name, []).append((step, float(value)))
            model.train()
            if stop_when is not None and stop_when(history):
                break  # the goal is reached
        if over_time:
            break
    read_losses()
    bar.close()
    model.eval()
    history.seconds = time.perf_counter() - start
    if progress and bar.disable:
        print(f"{desc}: {len(history.steps)} steps in {history.seconds:.1f} s, "
              f"final loss {history.loss[-1]:.4f}")
    return history
