"""Train small causal models on multi-query associative recall and measure what they remember.

    result = train_recall("mamba", seq_len=64, n_pairs=4, steps=400, seed=0)
    result.accuracy, result.parameters, result.state_bytes, result.seconds
    result.steps_to_50, result.steps_to_90          # first evaluation at accuracy >= 0.5 / 0.9

Every model is a :class:`~tfm_course.models.mixer_lm.MixerLM` of the same width, depth and
(about the same) parameter count; only the sequence mixer changes (``short_conv=k`` gives the
mixers of :data:`~tfm_course.models.mixers.SHORT_CONV_KINDS` a short convolution on q, k, v). Training draws a fresh MQAR batch at every
step (:func:`~tfm_course.data.recall.multi_query_recall`) for a budget of ``steps`` and stops early
once the held-out accuracy reaches ``target``. Accuracy is the fraction of queried keys whose value
is the model's top prediction, on a fixed test set drawn from a separate generator.

The optimiser is AdamW with weight decay on the weight matrices and convolution filters, not on
Mamba's ``A_log`` and ``D`` (flagged ``_no_weight_decay`` as in ``mamba_ssm``), the
normalisations, the biases or the embeddings (:func:`no_decay_parameters`). Zoology's MQAR
trainer (``zoology/train.py``) gives all parameters to one AdamW with weight decay 0.1 and leaves
the flags unread; the groups here follow the flags and nanoGPT's rule (no decay on 1-D
parameters), with the embeddings left out too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.recall import IGNORE, multi_query_recall
from ..device import by_device, get_device
from ..layers import LayerNorm, RMSNorm
from ..models.mixer_lm import MixerLM
from ..train import train, warmup_cosine, weight_decay_groups

__all__ = ["RecallResult", "recall_accuracy", "train_recall", "no_decay_parameters", "steps_to"]

NORMS = (nn.LayerNorm, nn.GroupNorm, LayerNorm, RMSNorm)


@dataclass
class RecallResult:
    """One trained model on one setting (everything the benchmark table shows)."""

    mixer: str
    seq_len: int
    n_pairs: int
    seed: int
    accuracy: float  # on the held-out queries
    parameters: int
    state_bytes: int  # generation state per sequence after seq_len tokens (fp32)
    seconds: float  # training wall-clock time
    steps: int  # optimiser steps taken (fewer than asked if the target was reached)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, test accuracy) evaluations
    cpu_seconds: float = 0.0  # CPU time of this process while training: on a busy machine, the
    #                           wall-clock time the same single-threaded run would take on an idle one
    steps_to_50: int | None = None  # step of the first evaluation with accuracy >= 0.5 (None: never)
    steps_to_90: int | None = None  # the same for 0.9
    d_model: int = 64
    vocab_size: int = 256
    lr: float = 3e-3
    weight_decay: float = 0.0
    short_conv: int = 0  # width of the short convolution on q, k, v (0: none)
    batch_size: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


def steps_to(curve: list[tuple[int, float]], level: float) -> int | None:
    """The step of the first evaluation in ``curve`` ((step, accuracy) pairs) with accuracy >=
    ``level``; None if none reaches it."""
    return next((step for step, accuracy in curve if accuracy >= level), None)


def no_decay_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters left out of weight decay: those flagged ``_no_weight_decay`` (Mamba's
    ``A_log`` and ``D``), embeddings, normalisation gains and shifts, and biases.

    Pass them to :func:`tfm_course.train.weight_decay_groups` as ``no_decay``.
    """
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if (getattr(p, "_no_weight_decay", False) or isinstance(module, (nn.Embedding, *NORMS))
                    or name == "bias"):
                found[id(p)] = p
    return list(found.values())


@torch.no_grad()
def recall_accuracy(model: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int = 256) -> float:
    """Fraction of labelled positions (label != IGNORE) where ``model(inputs)`` ranks the label first.

    inputs, labels ``(n, L)`` on the model's device; evaluated in batches of ``batch_size``.
    """
    if inputs.shape != labels.shape:
        raise ValueError(f"inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)} must match")
    hits = torch.zeros((), device=labels.device)
    total = (labels != IGNORE).sum()
    for x, y in zip(inputs.split(batch_size), labels.split(batch_size)):
        keep = y != IGNORE
        hits += (model(x).argmax(-1) == y)[keep].sum()
    return float(hits / total.clamp_min(1))


def train_recall(mixer: str, seq_len: int, n_pairs: int, *, vocab_size: int = 256,
                 d_model: int = 64, num_layers: int = 2, num_heads: int = 4, steps: int = 1000,
                 batch_size: int = 64, lr: float = 3e-3, weight_decay: float = 0.0, seed: int = 0,
                 n_test: int = 512, target: float | None = 0.99, eval_every: int = 50,
                 time_limit_s: float | None = None, device: torch.device | str | None = None,
                 scan_mode: str | None = None, short_conv: int | None = None,
                 tie_embeddings: bool = False, embed_std: float | None = None,
                 stop_after: int | None = None, progress: bool = False) -> RecallResult:
    """Train one ``MixerLM(mixer)`` on MQAR(``seq_len``, ``n_pairs``); return a :class:`RecallResult`.

    The model and its training batches are seeded by ``seed``; the test set by ``10_000 + seed``
    (never seen in training). AdamW (``lr``; ``weight_decay`` on the matrices only, see
    :func:`no_decay_parameters`) with a warm-up and a cosine schedule over ``steps``, the budget;
    training stops early when the test accuracy reaches ``target`` (None: never). The result
    records the final accuracy and the steps to 0.5 and to 0.9 (evaluated every ``eval_every``).
    ``short_conv=k`` gives the mixer a short convolution on q, k, v (the kinds in
    :data:`~tfm_course.models.mixers.SHORT_CONV_KINDS`; None or 0: none). ``tie_embeddings`` and
    ``embed_std`` go to :class:`~tfm_course.models.mixer_lm.MixerLM`. Mamba's scan is
    ``scan_mode``, by default sequential on a CPU and parallel on an accelerator.

    ``stop_after`` (a multiple of ``eval_every``) stops after that many steps of the same schedule
    over ``steps``: the start of a longer run, e.g. to check a stored run's first evaluations.

    ``time_limit_s`` also stops training after that many seconds: for interactive use only (a
    notebook session), never in a stored run or a tool, where the budget is ``steps``, so that a
    slower or busier machine gets the same result, only later.
    """
    if stop_after is not None and (stop_after < 1 or stop_after % eval_every or stop_after > steps):
        raise ValueError(f"stop_after must be a positive multiple of eval_every ({eval_every}) and at "
                         f"most steps ({steps}), got {stop_after}")
    device = torch.device(device) if device is not None else get_device()
    scan_mode = scan_mode or by_device("sequential", "parallel", device)
    torch.manual_seed(seed)
    model = MixerLM(vocab_size, mixer, d_model=d_model, num_layers=num_layers,
                    num_heads=num_heads, scan_mode=scan_mode, short_conv=short_conv,
                    tie_embeddings=tie_embeddings, embed_std=embed_std).to(device)
    optimizer = torch.optim.AdamW(weight_decay_groups(model, weight_decay, no_decay_parameters(model)),
                                  lr=lr)
    data_gen = torch.Generator().manual_seed(seed)
    test_inputs, test_labels = multi_query_recall(n_test, vocab_size, seq_len, n_pairs,
                                                  torch.Generator().manual_seed(10_000 + seed), device)

    def make_batch(step: int) -> tuple[Tensor, Tensor]:
        return multi_query_recall(batch_size, vocab_size, seq_len, n_pairs, data_gen, device)

    def loss_fn(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, labels = batch
        logits = model(inputs)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)

    def eval_fn(model: nn.Module) -> dict[str, float]:
        return {"accuracy": recall_accuracy(model, test_inputs, test_labels)}

    def reached(history) -> bool:
        if stop_after is not None and len(history.steps) >= stop_after:
            return True
        return target is not None and history.last("accuracy") >= target

    cpu_start = time.process_time()
    history = train(model, make_batch, loss_fn, steps=steps, optimizer=optimizer,
                    schedule=warmup_cosine(min(50, steps // 10), steps), eval_fn=eval_fn,
                    eval_every=eval_every, stop_when=reached, time_limit_s=time_limit_s,
                    progress=progress, desc=f"{mixer} L={seq_len} pairs={n_pairs}")
    curve = [(s + 1, a) for s, a in history.metrics["accuracy"]]
    return RecallResult(mixer, seq_len, n_pairs, seed, history.last("accuracy"),
                        model.num_parameters(), model.state_bytes(seq_len), history.seconds,
                        len(history.steps), curve, time.process_time() - cpu_start,
                        steps_to(curve, 0.5), steps_to(curve, 0.9), d_model, vocab_size, lr,
                        weight_decay, short_conv or 0, batch_size)
