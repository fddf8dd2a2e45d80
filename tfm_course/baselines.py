"""Classification baselines a Transformer must beat, and the statistics to compare with them.

    majority(train_y, valid_y).accuracy                      # the commonest training label, always
    first_word_rule(train_texts, train_y, valid_texts, valid_y)  # the commonest label of each first word
    feats = bag_of_tokens(ids, mask, vocab_size)             # (n, seq) ids -> (n, V) token shares
    logistic_regression(train_f, train_y, valid_f, valid_y)  # L2, L-BFGS: deterministic
    balanced_accuracy(pred, gold); binomial_interval(k, n)   # mean per-class recall; Wilson 95 %

Each classifier returns a :class:`Result`: the validation ``accuracy`` (``None`` without
validation labels) and the ``predictions`` (a long tensor ``(n_valid,)``). Labels are ints
``0..C-1`` (lists or tensors). ``bag_of_tokens`` + ``logistic_regression`` are chapter 7's bag of
tokens baseline: the same features (each token's share of the text's real tokens, ``[CLS]`` and
``[SEP]`` included when the mask includes them), the same standardisation and the same objective
(mean cross-entropy + ``l2`` times the squared weights, bias unpenalised, L-BFGS with a strong
Wolfe line search, 200 iterations); the weights start at zero instead of a random draw, so the
answer needs no seed (the problem is strictly convex: same optimum up to the solver's tolerance).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Result", "majority", "first_word_rule", "bag_of_tokens", "logistic_regression",
           "balanced_accuracy", "binomial_interval"]


class Result(NamedTuple):
    accuracy: float | None
    predictions: Tensor


def _labels(y, name: str) -> Tensor:
    t = torch.as_tensor(y)
    if t.ndim != 1 or t.numel() == 0 or t.is_floating_point() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of int labels, got {t.dtype} {tuple(t.shape)}")
    if int(t.min()) < 0:
        raise ValueError(f"{name} must be labels >= 0, got minimum {int(t.min())}")
    return t.long().cpu()


def _result(pred: Tensor, valid_y) -> Result:
    if valid_y is None:
        return Result(None, pred)
    gold = _labels(valid_y, "valid_labels")
    if len(gold) != len(pred):
        raise ValueError(f"valid_labels must have one label per validation example ({len(pred)}), got {len(gold)}")
    return Result(float((pred == gold).double().mean()), pred)


def _commonest(labels: Sequence[int]) -> int:
    counts = Counter(int(y) for y in labels)
    return min(counts, key=lambda y: (-counts[y], y))  # ties: the smaller label


def majority(train_labels, valid_labels) -> Result:
    """Predict the commonest training label (ties: the smaller) for every validation example."""
    label = _commonest(_labels(train_labels, "train_labels").tolist())
    gold = _labels(valid_labels, "valid_labels")
    return _result(torch.full((len(gold),), label), gold)


def _first(item) -> object:
    if isinstance(item, str):
        words = item.split()
        return words[0] if words else ""
    seq = item.tolist() if isinstance(item, Tensor) else list(item)
    return seq[0] if seq else None


def first_word_rule(train_items: Sequence, train_labels, valid_items: Sequence, valid_labels=None) -> Result:
    """Predict the commonest training label among training items with the same first word.

    Items are texts (first word: first whitespace-separated word, case kept) or token sequences
    (first token). A first word never seen in training gets the overall majority label.
    """
    y = _labels(train_labels, "train_labels").tolist()
    if len(train_items) != len(y):
        raise ValueError(f"train_items and train_labels must have the same length, got {len(train_items)} and {len(y)}")
    by_first: dict[object, list[int]] = defaultdict(list)
    for item, label in zip(train_items, y):
        by_first[_first(item)].append(label)
    rule = {first: _commonest(labels) for first, labels in by_first.items()}
    fallback = _commonest(y)
    pred = torch.tensor([rule.get(_first(item), fallback) for item in valid_items], dtype=torch.long)
    return _result(pred, valid_labels)


def bag_of_tokens(ids: Tensor, mask: Tensor, vocab_size: int) -> Tensor:
    """(n, seq) ids and (n, seq) bool mask -> (n, vocab_size) float: each token's share of the
    row's masked-in tokens (chapter 7's features)."""
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"ids must be 2-D and mask of its shape, got {tuple(ids.shape)} and {tuple(mask.shape)}")
    if ids.is_floating_point() or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"ids must be integers in [0, {vocab_size}), got {ids.dtype} in "
                         f"[{ids.min().item()}, {ids.max().item()}]")
    if not mask.any(1).all():
        raise ValueError("every row needs at least one token in mask, got an empty row")
    counts = torch.zeros(len(ids), vocab_size, device=ids.device).scatter_add_(1, ids.long(), mask.float())
    return counts / counts.sum(1, keepdim=True)


def logistic_regression(train_f: Tensor, train_labels, valid_f: Tensor, valid_labels=None,
                        l2: float = 1e-3, max_iter: int = 200) -> Result:
    """Multinomial logistic regression on standardised features (train mean and std), L2 penalty
    ``l2 * |W|^2`` on the weights, fitted by L-BFGS from zero weights: deterministic.

    train_f (n, d), valid_f (m, d) float; labels ints 0..C-1 (C = max training label + 1).
    """
    if train_f.ndim != 2 or valid_f.ndim != 2 or train_f.shape[1] != valid_f.shape[1]:
        raise ValueError(f"features must be (n, d) and (m, d), got {tuple(train_f.shape)} and {tuple(valid_f.shape)}")
    y = _labels(train_labels, "train_labels").to(train_f.device)
    if len(y) != len(train_f):
        raise ValueError(f"train_labels must have one label per row of train_f ({len(train_f)}), got {len(y)}")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    mean, std = train_f.mean(0), train_f.std(0) + 1e-6
    train_f, valid_f = (train_f - mean) / std, (valid_f - mean) / std
    weight = torch.zeros(int(y.max()) + 1, train_f.shape[1], device=train_f.device, requires_grad=True)
    bias = torch.zeros(int(y.max()) + 1, device=train_f.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(train_f @ weight.T + bias, y) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        pred = (valid_f @ weight.T + bias).argmax(-1).cpu()
    return _result(pred, valid_labels)


def balanced_accuracy(pred, gold) -> float:
    """Mean over the classes present in ``gold`` of the share of that class predicted right."""
    p, g = _labels(pred, "pred"), _labels(gold, "gold")
    if p.shape != g.shape:
        raise ValueError(f"pred and gold must have the same length, got {len(p)} and {len(g)}")
    return float(torch.stack([(p[g == c] == c).double().mean() for c in g.unique()]).mean())


def binomial_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion k / n (z = 1.96: 95 %)."""
    if not (isinstance(k, int) and isinstance(n, int)) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"expected ints 0 <= k <= n with n >= 1, got k={k!r}, n={n!r}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)
