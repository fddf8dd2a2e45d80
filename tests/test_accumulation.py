"""tfm_course.accumulation: k micro-batches give the big batch's gradient, if the loss is normalised by tokens."""

import pytest
import torch

from tfm_course.accumulation import IGNORE_INDEX, accumulate_gradients, count_targets, token_loss_sum
from tfm_course.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=37, max_len=16, d_model=32, n_layers=2, n_heads=2)).double()


def _batch(lengths: list[int], seq: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of the given lengths, padded: targets are IGNORE_INDEX past each length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 37, (len(lengths), seq), generator=g)
    targets = torch.randint(0, 37, (len(lengths), seq), generator=g)
    for row, n in enumerate(lengths):
        targets[row, n:] = IGNORE_INDEX
    return ids, targets


def _grads(model: GPT) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _big_batch_grads(model: GPT, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
    model.zero_grad()
    _, loss = model(ids, targets)
    loss.backward()
    return _grads(model), loss.item()


def test_equal_lengths_both_normalisations_equal_the_big_batch():
    model = _model()
    ids, targets = _batch([16] * 8)
    want, want_loss = _big_batch_grads(model, ids, targets)
    for normalise in ("tokens", "micro-batch"):
        model.zero_grad()
        loss = accumulate_gradients(model, zip(ids.split(2), targets.split(2)), normalise)
        torch.testing.assert_close(_grads(model), want, rtol=1e-10, atol=1e-12)
        assert loss.item() == pytest.approx(want_loss, rel=1e-12)


def test_variable_lengths_only_token_normalisation_equals_the_big_batch():
    model = _model()
    ids, targets = _batch([16, 15, 3, 2, 14, 1, 9, 16])
    want, want_loss = _big_batch_grads(model, ids, targets)
    micro = list(zip(ids.split(2), targets.split(2)))
    model.zero_grad()
    loss = accumulate_gradients(model, micro, "tokens")
    torch.testing.assert_close(_grads(model), want, rtol=1e-10, atol=1e-12)
    assert loss.item() == pytest.approx(want_loss, rel=1e-12)
    model.zero_grad()
    bug_loss = accumulate_gradients(model, micro, "micro-batch")
    relative = (_grads(model) - want).norm() / want.norm()
    assert relative > 0.05  # the mean of means weighs short micro-batches' tokens more
    assert bug_loss.item() == pytest.approx(want_loss, rel=1e-12)  # the logged loss hides it


def test_the_bug_equals_a_reweighted_loss():
    model = _model()
    ids, targets = _batch([16, 2, 3, 5], seed=1)
    micro = list(zip(ids.split(2), targets.split(2)))
    model.zero_grad()
    accumulate_gradients(model, micro, "micro-batch")
    got = _grads(model)
    model.zero_grad()
    means = [token_loss_sum(model, i, t) / count_targets(t) for i, t in micro]
    (sum(means) / len(means)).backward()
    torch.testing.assert_close(got, _grads(model), rtol=1e-10, atol=1e-12)


def test_bad_input():
    model = _model()
    ids, targets = _batch([4, 4])
    with pytest.raises(ValueError, match="normalise must be one of"):
        accumulate_gradients(model, [(ids, targets)], "mean")
    with pytest.raises(ValueError, match="at least one"):
        accumulate_gradients(model, [])
    with pytest.raises(ValueError, match="shape of ids"):
        token_loss_sum(model, ids, targets[:, :3])
