"""tfm_course.data.positions: the shifted-copy task and its accuracy helpers."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.data.positions import IGNORE, accuracy_by_position, shifted_copy, token_accuracy


def test_shifted_copy_targets_are_the_tokens_shift_places_left():
    g = torch.Generator().manual_seed(0)
    tokens, targets = shifted_copy(4, 10, 7, shift=3, generator=g)
    assert tokens.shape == targets.shape == (4, 10)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 7
    assert bool((targets[:, :3] == IGNORE).all())
    assert torch.equal(targets[:, 3:], tokens[:, :7])


def test_shifted_copy_is_reproducible_with_a_generator():
    a = shifted_copy(2, 5, 9, generator=torch.Generator().manual_seed(1))
    b = shifted_copy(2, 5, 9, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("args", [(0, 5, 4, 1), (2, 5, 4, 5), (2, 5, 4, -1), (2, 5, 0, 1)])
def test_shifted_copy_rejects_bad_sizes(args):
    with pytest.raises(ValueError):
        shifted_copy(*args)


def test_accuracy_ignores_positions_without_an_answer():
    targets = torch.tensor([[IGNORE, 1, 2, 0]])
    logits = torch.nn.functional.one_hot(torch.tensor([[2, 1, 0, 0]]), 3).float()
    assert math.isclose(token_accuracy(logits, targets), 2 / 3, rel_tol=1e-6)
    by_position = accuracy_by_position(logits, targets)
    assert math.isnan(by_position[0]) and by_position[1:].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="batch, seq, classes"):
        token_accuracy(logits[0], targets)
    with pytest.raises(ValueError, match="batch, seq, classes"):
        accuracy_by_position(logits, targets[:, :2])
