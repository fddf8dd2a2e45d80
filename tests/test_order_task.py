"""tfm_course.experiments.order_task: chapter 7's "in order or shuffled?" task and its baselines."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tfm_course.experiments import bert_recipe as R
from tfm_course.experiments import order_task as O

SIZES = dict(R.SIZES["cpu"], n_valid=16)


@pytest.fixture(scope="module")
def mlm():
    return R.mlm_data(SIZES)


@pytest.fixture(scope="module")
def task(mlm):
    return R.task_data(mlm)


@pytest.fixture(scope="module")
def order(task, mlm):
    return O.shuffled_task(task, mlm)


def test_half_of_each_split_is_shuffled_and_every_bag_is_kept(task, order):
    for before, after in zip((task.train, task.dev, task.validation), (order.train, order.dev, order.validation)):
        n = len(before.y)
        assert int(after.y.sum()) == n // 2 and set(after.y.tolist()) == {0, 1}
        assert torch.equal(after.mask, before.mask)
        for i in range(n):
            m = int(before.mask[i].sum())
            old, new = before.x[i, :m].tolist(), after.x[i, :m].tolist()
            assert new[0] == old[0] and new[-1] == old[-1]  # [CLS] and [SEP] stay where they were
            assert Counter(new) == Counter(old)  # the same tokens: a bag of tokens cannot tell
            assert (new != old) == bool(after.y[i])  # shuffled rows always change; the others never


def test_the_task_is_deterministic_and_the_seed_matters(task, mlm, order):
    again = O.shuffled_task(task, mlm)
    assert torch.equal(again.train.x, order.train.x) and torch.equal(again.validation.y, order.validation.y)
    other = O.shuffled_task(task, mlm, seed=5)
    assert not torch.equal(other.train.y, order.train.y)


def test_texts_are_the_rows_decoded(order, mlm):
    i = int(order.train.y.nonzero()[0])
    m = int(order.train.mask[i].sum())
    assert order.train.texts[i] == mlm.tok.decode(order.train.x[i, 1:m - 1].tolist())


def test_rows_without_two_different_tokens_cannot_be_shuffled(mlm, task):
    split = task.train.take(torch.arange(4))
    x = split.x.clone()
    x[:, 1:-1] = x[:, 1:2]  # every row one token repeated (and the row ends on it: no [SEP] left)
    dull = R.TaskSplit(x, split.mask, split.y, split.texts)
    with pytest.raises(ValueError, match="need 2 rows with two different tokens, got 0"):
        O.shuffle_rows(dull, mlm, seed=0)


def test_baselines_bag_at_chance_bigram_rule_far_above(order, mlm):
    """The bag of tokens is at chance by construction; the bigram, which knows which token follows
    which, separates the two labels from 16 examples. Majority is exactly one half."""
    subset = R.stratified_subset(order.train.y, 16, seed=0)
    scores = O.order_baselines(order, mlm, subset)
    assert scores["majority"] == {"dev": 0.5, "validation": 0.5}
    assert abs(scores["bag of tokens"]["validation"] - 0.5) < 0.08  # 368 examples: +- 0.05 is one sd at most
    assert scores["bigram rule"]["validation"] > 0.9


def test_bigram_scores_are_higher_for_shuffled_rows(order, mlm):
    from tfm_course.ngram import KneserNey

    kn = KneserNey(2, mlm.vocab_size).fit(mlm.train_rows)
    nll = O.bigram_scores(kn, order.validation).squeeze(1)
    assert nll.shape == (len(order.validation.y),)
    y = order.validation.y.bool()
    assert nll[y].mean() > nll[~y].mean() + 1.0  # nats per token
