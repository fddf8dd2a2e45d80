"""Chapter 9's transfer experiment: fine-tune a small T5 text-to-text on chapter 7's "class or
function?" docstrings with few labels, from a pretrained or a random start, next to the baselines.

    tok = default_tokenizer(4096).truncated(1024)
    specials = Specials.after(tok.vocab_size, eos=tok.special_ids["<|endoftext|>"], n_sentinels=16)
    task = kind_task(tok, specials)                                  # balanced train / validation
    model = build_model("span corruption", specials, d_model=64, num_layers=4, d_ff=256)
    result = fine_tune_kind(model, task, n_labels=32, seed=0, steps=300, lr=1e-3)
    kind_baselines(task, n_labels=32, seed=0, vocab_size=tok.vocab_size)   # the same 32 examples

The model answers with the words themselves: the target is ``"class"`` or ``"function"`` and EOS
(chapter 7's BERT had a new two-way head instead). It is scored two ways (:func:`kind_accuracy`):
**accuracy**, the label whose whole target (tokens and EOS) gets the higher teacher-forced
log-probability, a two-way choice that never fails on spelling; and **exact match**, greedy
generation equal to the target, which also asks the model to write the answer.

**The sentinel prior.** Every span-corruption target starts with ``<extra_id_0>``, so a
pretrained decoder's first token is a sentinel with high probability (:func:`sentinel_prior`).
Fine-tuning must first unlearn that. With ``mask_specials`` the ids that are never an answer (all
sentinels, ``specials.mask``, ``specials.pad``) get ``-inf`` logits in the fine-tuning loss, in the
scoring and in the generation (:func:`never_answers`); the model itself is not changed, and the
prior then costs nothing.

**Splits.** The corpus's, balanced by :func:`~tfm_course.experiments.objectives.docstring_kind_pairs`
(always answering one label scores 0.5); the validation split (368 docstrings from modules no
training docstring comes from) is kept whole: scoring it (both labels and the greedy answers)
with the chapter's 64-wide model takes 0.4-0.8 s on one CPU thread. Few labels are a stratified subset of the training split
(:func:`~tfm_course.experiments.bert_recipe.stratified_subset`, chapter 7's), the same examples for
the fine-tuning and the baselines when the seed is the same.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import baselines
from ..data.docstring_tasks import CLASS_OR_FUNCTION_LABELS
from ..device import one_cpu_thread
from ..models.t5 import T5, shift_right
from ..train import train, warmup_cosine
from .bert_recipe import stratified_subset
from .objectives import (Specials, ban, docstring_kind_pairs, encode_pairs, exact_match, greedy,
                         text_to_text_loss)

__all__ = ["KindSplit", "KindTask", "kind_split", "kind_task", "never_answers", "kind_loss",
           "label_log_probs", "greedy", "kind_accuracy", "sentinel_prior", "fine_tune_kind",
           "kind_baselines"]


@dataclass
class KindSplit:
    """One split: ``texts`` (n docstrings), ``labels`` ``(n,)`` long (1 = class), ``inputs``
    ``(n, S)`` and ``targets`` ``(n, T)`` ids (:func:`encode_pairs`, padded with ``pad``), and
    ``label_targets`` ``(2, T)``: row ``k`` is label ``k``'s string and EOS (``targets[i] ==
    label_targets[labels[i]]``)."""

    texts: list[str]
    labels: Tensor
    inputs: Tensor
    targets: Tensor
    label_targets: Tensor

    def __post_init__(self) -> None:
        n = len(self.texts)
        if self.inputs.dim() != 2 or self.inputs.shape[0] != n:
            raise ValueError(f"inputs must be ({n}, S) ids, one row per text, got {tuple(self.inputs.shape)}")
        if self.labels.shape != (n,):
            raise ValueError(f"labels must be ({n},), got {tuple(self.labels.shape)}")
        if self.label_targets.dim() != 2 or self.label_targets.shape[0] != 2:
            raise ValueError(f"label_targets must be (2, T), got {tuple(self.label_targets.shape)}")
        if self.targets.shape != (n, self.label_targets.shape[1]):
            raise ValueError(f"targets must be ({n}, {self.label_targets.shape[1]}), got "
                             f"{tuple(self.targets.shape)}")

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, index: Tensor) -> "KindSplit":
        return KindSplit([self.texts[i] for i in index.tolist()], self.labels[index], self.inputs[index],
                         self.targets[index], self.label_targets)


@dataclass
class KindTask:
    """Both splits and the :class:`Specials` their ids were encoded with."""

    train: KindSplit
    validation: KindSplit
    specials: Specials
    label_names: tuple[str, str] = CLASS_OR_FUNCTION_LABELS


def kind_split(tok, pairs: Sequence[tuple[str, str]], specials: Specials, max_input: int = 48,
               device: torch.device | str = "cpu",
               label_names: Sequence[str] = CLASS_OR_FUNCTION_LABELS) -> KindSplit:
    """``(text, label string)`` pairs encoded into a :class:`KindSplit` (``tok``: anything with
    ``encode(str) -> list[int]``)."""
    unknown = {y for _, y in pairs} - set(label_names)
    if unknown:
        raise ValueError(f"labels must be among {tuple(label_names)}, got {sorted(unknown)}")
    inputs, targets = encode_pairs(tok, pairs, specials, max_input, device)
    _, rows = encode_pairs(tok, [("", name) for name in label_names], specials, max_input, device)
    width = max(rows.shape[1], targets.shape[1])  # both pad to the longer label
    rows, targets = (F.pad(t, (0, width - t.shape[1]), value=specials.pad) for t in (rows, targets))
    labels = torch.tensor([list(label_names).index(y) for _, y in pairs], device=device)
    return KindSplit([x for x, _ in pairs], labels, inputs, targets, rows)


def kind_task(tok, specials: Specials, max_input: int = 48, device: torch.device | str = "cpu",
              seed: int = 0) -> KindTask:
    """Both balanced splits of :func:`docstring_kind_pairs` (drawn with ``seed``), inputs cut to
    ``max_input`` tokens with EOS."""
    train_split, valid = (kind_split(tok, docstring_kind_pairs(split, balanced=True, seed=seed), specials,
                                     max_input, device) for split in ("train", "validation"))
    return KindTask(train_split, valid, specials)


# --------------------------------------------------------------------------- scoring
def never_answers(specials: Specials) -> list[int]:
    """The ids no answer contains: every sentinel, ``mask`` and ``pad`` (also the decoder start)."""
    return [*specials.sentinels, specials.mask, specials.pad]


def kind_loss(model: T5, batch: tuple[Tensor, Tensor], specials: Specials,
              banned: Sequence[int] = ()) -> Tensor:
    """Teacher-forced cross-entropy of ``batch = (inputs (B, S), targets (B, T))``, the ``banned``
    ids' logits ``-inf`` first (:func:`~tfm_course.experiments.objectives.text_to_text_loss`)."""
    return text_to_text_loss(model, *batch, specials, banned)


@torch.no_grad()
def label_log_probs(model: T5, inputs: Tensor, label_targets: Tensor, specials: Specials,
                    banned: Sequence[int] = (), batch_size: int = 512) -> Tensor:
    """``(n, K)``: log p(label k's tokens and EOS | input) under teacher forcing, for ``inputs``
    ``(n, S)`` and ``label_targets`` ``(K, T)`` (pad after EOS). The encoder runs once per chunk of
    ``batch_size`` rows, the decoder once per label."""
    if inputs.dim() != 2 or label_targets.dim() != 2:
        raise ValueError(f"inputs must be (n, S) and label_targets (K, T), got {tuple(inputs.shape)} "
                         f"and {tuple(label_targets.shape)}")
    out = []
    for start in range(0, inputs.shape[0], batch_size):
        x = inputs[start:start + batch_size]
        mask = x != specials.pad
        memory = model.encode(x, mask)
        columns = []
        for row in label_targets:
            target = row[None].expand(x.shape[0], -1)
            logits = ban(model.decode(shift_right(target, specials.pad), memory, mask), banned)
            logp = logits.float().log_softmax(-1).gather(-1, target[..., None])[..., 0]  # (n, T)
            columns.append(logp.masked_fill(target == specials.pad, 0.0).sum(1))
        out.append(torch.stack(columns, 1))
    return torch.cat(out)


@torch.no_grad()
def kind_accuracy(model: T5, split: KindSplit, specials: Specials, *,
                  mask_specials: bool = False) -> dict[str, float]:
    """``{"accuracy", "exact match"}`` on ``split``: the two-way choice by :func:`label_log_probs`
    (a tie goes to label 0) and greedy generation equal to the target; ``mask_specials`` bans
    :func:`never_answers` in both."""
    banned = never_answers(specials) if mask_specials else ()
    was_training = model.training
    model.eval()
    try:
        pred = label_log_probs(model, split.inputs, split.label_targets, specials, banned).argmax(1)
        return {"accuracy": float((pred == split.labels).double().mean()),
                "exact match": exact_match(model, split.inputs, split.targets, specials, banned=banned)}
    finally:
        model.train(was_training)


@torch.no_grad()
def sentinel_prior(model: T5, split: KindSplit, specials: Specials) -> float:
    """Mean over the split's inputs of the probability that the decoder's first output token is a
    sentinel (nothing banned): ~1 after span corruption, ~n_sentinels / vocab at random weights."""
    was_training = model.training
    model.eval()
    try:
        mask = split.inputs != specials.pad
        start = torch.full((len(split), 1), model.config.decoder_start_id, device=split.inputs.device)
        probs = model.decode(start, model.encode(split.inputs, mask), mask)[:, 0].float().softmax(-1)
        return float(probs[:, specials.sentinels].sum(1).mean())
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------- fine-tuning
def _subset(task: KindTask, n_labels: int | None, seed: int) -> Tensor:
    if n_labels is not None and (isinstance(n_labels, bool) or not isinstance(n_labels, int) or n_labels < 2):
        raise ValueError(f"n_labels must be None (all) or an int >= 2 (one per label), got n_labels={n_labels!r}")
    return stratified_subset(task.train.labels, n_labels, seed)


def fine_tune_kind(model: T5, task: KindTask, n_labels: int | None, seed: int, steps: int, lr: float,
                   batch: int = 16, mask_specials: bool = True, copy_model: bool = True) -> dict[str, Any]:
    """Fine-tune ``model`` (a copy, unless ``copy_model=False``) text-to-text on ``n_labels``
    stratified training examples (None: all), drawn with ``seed``: ``steps`` batches of ``batch``
    drawn with replacement (generator seeded with ``seed``), AdamW at ``lr`` with a warm-up over the
    first tenth and cosine decay, on one CPU thread. ``mask_specials``: :func:`never_answers` are
    banned in the loss, the scoring and the generation.

    Returns ``{"validation": kind_accuracy, "sentinel prior before", "sentinel prior after",
    "n_train", "loss": per-step losses, "seconds": CPU seconds of training on the CPU (else wall)}``.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    pick = _subset(task, n_labels, seed)
    split = task.train.take(pick)
    device = split.inputs.device
    model = (copy.deepcopy(model) if copy_model else model).to(device)
    specials = task.specials
    if model.config.vocab_size != specials.vocab_size:
        raise ValueError(f"model vocabulary must be the task's specials.vocab_size = {specials.vocab_size}, "
                         f"got {model.config.vocab_size}")
    banned = never_answers(specials) if mask_specials else ()
    g = torch.Generator(device=device).manual_seed(seed)

    def make_batch(step: int) -> tuple[Tensor, Tensor]:
        rows = torch.randint(0, len(split), (batch,), device=device, generator=g)
        return split.inputs[rows], split.targets[rows]

    with one_cpu_thread(device):
        before = sentinel_prior(model, task.validation, specials)
        cpu = time.process_time()
        history = train(model, make_batch, lambda m, b: kind_loss(m, b, specials, banned), steps=steps, lr=lr,
                        schedule=warmup_cosine(steps // 10, steps), progress=False)
        seconds = time.process_time() - cpu if device.type == "cpu" else history.seconds
        return {"validation": kind_accuracy(model, task.validation, specials, mask_specials=mask_specials),
                "sentinel prior before": before,
                "sentinel prior after": sentinel_prior(model, task.validation, specials),
                "n_train": len(split), "loss": history.loss, "seconds": seconds}


def kind_baselines(task: KindTask, n_labels: int | None, seed: int, vocab_size: int,
                   valid_rows: Tensor | None = None) -> dict[str, float]:
    """Validation accuracy of the majority label, the first-word rule and a bag-of-tokens logistic
    regression, trained on the same stratified subset as :func:`fine_tune_kind` with this seed.
    ``vocab_size``: the tokenizer's (the bag counts the real input tokens, EOS included).
    ``valid_rows``: score only these validation examples (default: all)."""
    split, valid = task.train.take(_subset(task, n_labels, seed)), task.validation
    if valid_rows is not None:
        valid = valid.take(valid_rows)

    def bag(s: KindSplit) -> Tensor:
        real = s.inputs != task.specials.pad
        return baselines.bag_of_tokens(s.inputs.masked_fill(~real, 0), real, vocab_size)

    y = split.labels.cpu()
    return {"majority": baselines.majority(y, valid.labels).accuracy,
            "first-word rule": baselines.first_word_rule(split.texts, y, valid.texts, valid.labels).accuracy,
            "bag of tokens": baselines.logistic_regression(bag(split), y, bag(valid), valid.labels).accuracy}
