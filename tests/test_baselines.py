"""Classification baselines: tfm_course.baselines."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfm_course.baselines import (balanced_accuracy, bag_of_tokens, binomial_interval, first_word_rule,
                                  logistic_regression, majority)


def test_majority():
    result = majority([0, 1, 1, 2, 1], [1, 0, 1, 1])
    assert result.predictions.tolist() == [1, 1, 1, 1] and result.accuracy == 0.75
    assert majority([1, 0], [0, 0, 1]).predictions.tolist() == [0, 0, 0]  # a tie: the smaller label


def test_first_word_rule():
    train = ["Return the sum.", "Return a list.", "A class for x.", "A helper.", "A parser.", "Create it."]
    labels = [0, 0, 1, 0, 1, 1]  # "Return" -> 0; "A" -> 1 (2 of 3); "Create" -> 1; overall 3 vs 3: 0
    valid = ["Return nothing.", "A thing.", "Create more.", "Unseen word.", ""]
    result = first_word_rule(train, labels, valid, [0, 1, 0, 1, 0])
    assert result.predictions.tolist() == [0, 1, 1, 0, 0]  # unseen and empty: the majority (a tie -> 0)
    assert result.accuracy == 3 / 5
    # token sequences: the first token
    assert first_word_rule([[5, 1], [5, 2], [7, 1]], [1, 1, 0], [[7, 9], [5], [8]]).predictions.tolist() == [0, 1, 1]
    assert first_word_rule([[5, 1]], [1], [[5]]).accuracy is None
    with pytest.raises(ValueError, match="same length, got 2 and 3"):
        first_word_rule(["a", "b"], [0, 1, 0], ["a"])


def test_balanced_accuracy_by_hand():
    gold = [0, 0, 0, 0, 1, 1]
    pred = [0, 0, 0, 1, 0, 1]
    # class 0: 3 of 4 right = 0.75; class 1: 1 of 2 = 0.5; mean 0.625 (plain accuracy 4 / 6)
    assert math.isclose(balanced_accuracy(pred, gold), 0.625)
    assert balanced_accuracy([1] * 6, gold) == 0.5  # always one class: chance, whatever the imbalance
    with pytest.raises(ValueError, match="same length, got 2 and 3"):
        balanced_accuracy([0, 1], [0, 1, 1])


def test_wilson_interval_known_values():
    # Wilson 1927; e.g. k = 8, n = 10, z = 1.96: (0.4902, 0.9433) as tabulated by Newcombe (1998)
    lo, hi = binomial_interval(8, 10)
    assert abs(lo - 0.4902) < 1e-4 and abs(hi - 0.9433) < 1e-4
    lo, hi = binomial_interval(0, 10)  # never 0 width at the edge: (0, 0.2775)
    assert lo == 0 and abs(hi - 0.2775) < 1e-4
    lo, hi = binomial_interval(184, 368)  # chapter 7's validation set at one half: about +- 5 points
    assert abs(lo - 0.449) < 1e-3 and abs(hi - 0.551) < 1e-3
    with pytest.raises(ValueError, match="k=11, n=10"):
        binomial_interval(11, 10)


def test_bag_of_tokens():
    ids = torch.tensor([[2, 3, 3, 0], [1, 1, 0, 0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    f = bag_of_tokens(ids, mask, 4)
    assert torch.allclose(f, torch.tensor([[0, 0, 1 / 3, 2 / 3], [0, 1, 0, 0]]))
    with pytest.raises(ValueError, match=r"in \[0, 3\), got torch.int64 in \[0, 3\]"):
        bag_of_tokens(ids, mask, 3)
    with pytest.raises(ValueError, match=r"got \(2, 4\) and \(2, 3\)"):
        bag_of_tokens(ids, mask[:, :3], 4)


def chapter7_logistic_regression(train_f, train_y, valid_f, valid_y, l2=1e-3):
    """Chapter 7's cell (random nn.Linear start), kept here to check the package reproduces it."""
    mean, std = train_f.mean(0), train_f.std(0) + 1e-6
    train_f, valid_f = (train_f - mean) / std, (valid_f - mean) / std
    layer = nn.Linear(train_f.shape[1], 2)
    optimizer = torch.optim.LBFGS(layer.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(layer(train_f), train_y) + l2 * layer.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return layer(valid_f).argmax(-1)


def toy_texts(n, seed):
    """Rows of token ids where token 3 or 4 (noisily) marks the label; 0 is padding."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(5, 40, (n, 12), generator=g)
    marker = torch.where(torch.rand(n, generator=g) < 0.85, 3 + y, 4 - y)
    ids[:, 0] = marker
    lengths = torch.randint(4, 13, (n,), generator=g)
    mask = torch.arange(12) < lengths[:, None]
    return ids.masked_fill(~mask, 0), mask, y


def test_logistic_regression_learns_deterministic_and_reproduces_chapter_7():
    train_x, train_m, train_y = toy_texts(400, 0)
    valid_x, valid_m, valid_y = toy_texts(300, 1)
    tf, vf = bag_of_tokens(train_x, train_m, 40), bag_of_tokens(valid_x, valid_m, 40)
    result = logistic_regression(tf, train_y, vf, valid_y)
    assert 0.75 < result.accuracy < 0.95  # the marker is right 85 % of the time
    again = logistic_regression(tf, train_y, vf, valid_y)
    assert torch.equal(result.predictions, again.predictions)  # no seed needed
    for seed in range(3):  # the chapter's random start lands on the same optimum
        torch.manual_seed(seed)
        theirs = chapter7_logistic_regression(tf, train_y, vf, valid_y)
        assert (theirs == result.predictions).float().mean() >= 0.99
    # three classes
    y3 = train_y + (train_x[:, 1] > 30).long()
    assert logistic_regression(tf, y3, vf).predictions.max() <= 2
    with pytest.raises(ValueError, match=r"\(400, 40\) and \(300, 39\)"):
        logistic_regression(tf, train_y, vf[:, :39])
    with pytest.raises(ValueError, match="one label per row of train_f \\(400\\), got 399"):
        logistic_regression(tf, train_y[:-1], vf)
    with pytest.raises(ValueError, match="int labels, got torch.float32"):
        logistic_regression(tf, train_y.float(), vf)
