"""Chapter 7's second task: is a docstring in its own order, or are its tokens shuffled?

    task = bert_recipe.task_data(mlm)          # "class or function?"
    order = shuffled_task(task, mlm)           # the same docstrings; label 1 = shuffled
    order_baselines(order, mlm, subset)        # majority, bag of tokens, the bigram rule

"Class or function?" is decided mostly by which words occur ("Return ..." against "A class
that ..."), so a bag of tokens does well and pretraining has little left to add. This task is
built so that the words decide nothing: a shuffled docstring has exactly the tokens of its
original, so every bag-of-tokens classifier is at chance by construction, and only knowledge of
which token follows which (what masked-language-model pretraining learns) tells the two apart.
The labels cost nothing to make, which is what lets a page ask how many a model needs.

**Splits** are the task's: the same train / dev / validation docstrings, so the validation
docstrings again come from modules that pretraining never read. In each split, half of the rows
(drawn with ``seed``, among rows with at least two different tokens) have the tokens between
``[CLS]`` and ``[SEP]`` permuted at random, never into their own order.

**The count-based baseline** is the corpus's knowledge without a network: a Kneser–Ney bigram
fitted on the pretraining rows scores each row (mean negative log-likelihood per token), and a
logistic regression on that one number learns the threshold from the labelled subset.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import baselines
from ..baselines import balanced_accuracy
from ..ngram import KneserNey
from .bert_recipe import MLMData, TaskData, TaskSplit

__all__ = ["ORDER_LABELS", "shuffle_rows", "shuffled_task", "bigram_scores", "order_baselines"]

ORDER_LABELS = ("in order", "shuffled")  # label 0, label 1


def shuffle_rows(split: TaskSplit, data: MLMData, seed: int) -> TaskSplit:
    """A copy of ``split`` in which half of the rows (rounded down) have their tokens between
    ``[CLS]`` and ``[SEP]`` shuffled; ``y`` is 1 on those rows, 0 elsewhere; ``texts`` are the
    rows' decoded tokens. Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x, mask = split.x.cpu().clone(), split.mask.cpu()
    lengths = mask.sum(1)
    eligible = [i for i in range(len(x)) if len(set(x[i, 1:lengths[i] - 1].tolist())) > 1]
    if len(eligible) < len(x) // 2:
        raise ValueError(f"need {len(x) // 2} rows with two different tokens, got {len(eligible)}")
    chosen = torch.tensor(eligible)[torch.randperm(len(eligible), generator=g)[: len(x) // 2]]
    y = torch.zeros(len(x), dtype=torch.long)
    for i in chosen.tolist():
        content = x[i, 1:lengths[i] - 1]
        while True:  # a permutation that changes the row (at least two different tokens: it exists)
            shuffled = content[torch.randperm(len(content), generator=g)]
            if not torch.equal(shuffled, content):
                break
        x[i, 1:lengths[i] - 1] = shuffled
        y[i] = 1
    texts = [data.tok.decode(x[i, 1:lengths[i] - 1].tolist()) for i in range(len(x))]
    device = split.x.device
    return TaskSplit(x.to(device), split.mask, y.to(device), texts)


def shuffled_task(task: TaskData, data: MLMData, seed: int = 0) -> TaskData:
    """"In order or shuffled?" on ``task``'s docstrings, split for split (one seed per split)."""
    return TaskData(shuffle_rows(task.train, data, seed), shuffle_rows(task.dev, data, seed + 1),
                    shuffle_rows(task.validation, data, seed + 2))


def bigram_scores(model: KneserNey, split: TaskSplit) -> Tensor:
    """``(n, 1)`` float: each row's mean negative log-likelihood (nats) per token after ``[CLS]``
    under the bigram ``model``, ``[SEP]`` included (the pretraining rows hold both markers)."""
    nll = model.score_windows(split.x.cpu())  # (n, seq); position 0 is [CLS]'s unigram
    real = split.mask.cpu().clone()
    real[:, 0] = False
    return ((nll * real).sum(1) / real.sum(1)).float()[:, None]


def order_baselines(task: TaskData, data: MLMData, subset: Tensor | None = None,
                    bigram: KneserNey | None = None) -> dict[str, dict]:
    """The shuffle task's baselines fitted on ``task.train`` (or its ``subset``): majority, a
    logistic regression on the bag of tokens, and the bigram rule (a logistic regression on
    :func:`bigram_scores`; pass ``bigram`` to reuse a fitted model). Balanced accuracy on dev and
    validation, as :func:`~tfm_course.experiments.bert_recipe.baseline_scores` gives it."""
    split = task.train if subset is None else task.train.take(subset)
    bigram = bigram or KneserNey(2, data.vocab_size).fit(data.train_rows.cpu())
    both = [task.dev, task.validation]
    x, mask = torch.cat([s.x for s in both]), torch.cat([s.mask for s in both])
    held = torch.cat([bigram_scores(bigram, s) for s in both])
    preds = {
        "majority": baselines.majority(split.y.tolist(), [0] * len(x)).predictions,
        "bag of tokens": baselines.logistic_regression(
            baselines.bag_of_tokens(split.x, split.mask, data.vocab_size), split.y,
            baselines.bag_of_tokens(x, mask, data.vocab_size)).predictions,
        "bigram rule": baselines.logistic_regression(bigram_scores(bigram, split), split.y.cpu(), held).predictions,
    }
    n_dev = len(task.dev.y)
    return {name: {"dev": balanced_accuracy(pred[:n_dev], task.dev.y.cpu()),
                   "validation": balanced_accuracy(pred[n_dev:], task.validation.y.cpu())}
            for name, pred in preds.items()}
