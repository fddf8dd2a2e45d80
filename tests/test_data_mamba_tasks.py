"""tfm_course.data.selective_copy and tfm_course.data.induction: the Mamba paper's synthetic tasks."""

from __future__ import annotations

import pytest
import torch

from tfm_course.data.induction import TRIGGER, induction_heads
from tfm_course.data.recall import IGNORE
from tfm_course.data.selective_copy import BLANK, MARKER, selective_copying


# --------------------------------------------------------------------------- selective copying
@pytest.mark.parametrize("vocab, length, n", [(16, 64, 8), (3, 10, 5), (10, 200, 16)])
def test_selective_copying_layout(vocab, length, n):
    inputs, labels = selective_copying(40, vocab, length, n, torch.Generator().manual_seed(0))
    assert inputs.shape == labels.shape == (40, length) and inputs.dtype == torch.int64
    span = length - n
    assert (inputs[:, span:] == MARKER).all()                             # markers at the end
    assert (labels[:, :span] == IGNORE).all()                             # answers only at markers
    scattered = inputs[:, :span]
    assert ((scattered == BLANK) | (scattered >= 2)).all()                # no marker in the data part
    assert (scattered < vocab).all() and ((labels[:, span:] >= 2) & (labels[:, span:] < vocab)).all()
    for row in range(40):
        kept = scattered[row][scattered[row] != BLANK]
        assert torch.equal(kept, labels[row, span:])                      # the data tokens, in order


def test_selective_copying_spacing_is_random():
    inputs, _ = selective_copying(200, 16, 64, 4, torch.Generator().manual_seed(1))
    first = (inputs[:, :60] != BLANK).float().argmax(dim=1)               # position of the 1st token
    assert len(set(first.tolist())) > 20                                  # not a fixed offset


def test_selective_copying_deterministic_device_and_errors():
    a = selective_copying(4, 16, 32, 4, torch.Generator().manual_seed(2))
    b = selective_copying(4, 16, 32, 4, torch.Generator().manual_seed(2), device="meta")
    c = selective_copying(4, 16, 32, 4, torch.Generator().manual_seed(2))
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]) and b[0].device.type == "meta"
    with pytest.raises(ValueError, match="at least 8; got 7"):
        selective_copying(4, 16, 7, 4)
    with pytest.raises(ValueError, match="vocab_size must be at least 3"):
        selective_copying(4, 2, 32, 4)
    with pytest.raises(ValueError, match="n_tokens"):
        selective_copying(4, 16, 32, 0)


# --------------------------------------------------------------------------- induction heads
@pytest.mark.parametrize("vocab, length", [(16, 256), (2, 3), (5, 40)])
def test_induction_heads_layout(vocab, length):
    inputs, labels = induction_heads(60, vocab, length, torch.Generator().manual_seed(0))
    assert inputs.shape == labels.shape == (60, length) and inputs.dtype == torch.int64
    assert ((inputs >= 0) & (inputs < vocab)).all()
    assert (inputs[:, -1] == TRIGGER).all()
    assert ((inputs == TRIGGER).sum(1) == 2).all()                        # the trigger appears twice
    assert (labels[:, :-1] == IGNORE).all()
    for row in range(60):
        first = int((inputs[row] == TRIGGER).nonzero()[0])
        assert first <= length - 3
        assert int(labels[row, -1]) == int(inputs[row, first + 1]) != TRIGGER  # the token after it


def test_induction_heads_deterministic_device_and_errors():
    a = induction_heads(4, 16, 32, torch.Generator().manual_seed(5))
    b = induction_heads(4, 16, 32, torch.Generator().manual_seed(5), device="meta")
    c = induction_heads(4, 16, 32, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]) and b[1].device.type == "meta"
    d = induction_heads(300, 16, 32, torch.Generator().manual_seed(6))[0]
    assert len(set((d[:, :-1] == TRIGGER).float().argmax(1).tolist())) > 20  # the trigger moves
    with pytest.raises(ValueError, match="seq_len must be at least 3"):
        induction_heads(4, 16, 2)
    with pytest.raises(ValueError, match="vocab_size"):
        induction_heads(4, 1, 16)
