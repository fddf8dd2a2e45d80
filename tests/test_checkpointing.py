"""tfm_course.checkpointing: the same gradients, less memory, by the count M(k) = (L/k)·I + k·A."""

import math

import pytest
import torch

from tfm_course.checkpointing import best_segment, checkpoint_memory, checkpointed_forward
from tfm_course.experiments.measure import peak_tensor_bytes
from tfm_course.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _setup(n_layers: int = 4):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_len=32, d_model=32, n_layers=n_layers, n_heads=2))
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(0, 64, (4, 32), generator=g), torch.randint(0, 64, (4, 32), generator=g)


def _step(model, ids, targets, every):
    model.zero_grad()
    logits, loss = checkpointed_forward(model, ids, targets, every)
    loss.backward()
    return logits, loss, torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("every", [1, 2, 3, 4])
def test_gradients_and_outputs_are_identical(every):
    model, ids, targets = _setup()
    want_logits, want_loss, want = _step(model, ids, targets, None)
    logits, loss, got = _step(model, ids, targets, every)
    assert torch.equal(logits, want_logits) and torch.equal(loss, want_loss)
    assert torch.equal(got, want)  # the recomputation repeats the same operations


def test_checkpointing_every_block_saves_memory_and_one_segment_does_not():
    model, ids, targets = _setup(n_layers=6)
    peak = {every: peak_tensor_bytes(lambda e=every: _step(model, ids, targets, e))
            for every in (None, 1, 2, 6)}
    assert peak[1] < peak[2] < peak[None]
    assert peak[6] > 0.9 * peak[None]  # one segment recomputes every block at once: no saving


def test_eval_mode_and_no_targets_run_the_plain_forward():
    model, ids, targets = _setup()
    model.eval()
    torch.testing.assert_close(checkpointed_forward(model, ids, every=2)[0], model(ids)[0])
    model.train()
    logits, loss = checkpointed_forward(model, ids, None, every=2)
    assert loss is None and logits.shape == (4, 32, 64)


def test_the_count_and_its_minimum():
    L, I, A = 16, 1.0, 1.0
    counts = {k: checkpoint_memory(L, k, I, A) for k in range(1, L + 1)}
    assert min(counts, key=counts.get) == 4 == best_segment(L, I, A)  # the √L rule when A = I
    assert counts[4] == 2 * math.sqrt(L) * I
    assert checkpoint_memory(L, None, I, A) == L * A
    assert checkpoint_memory(10, 4, 1.0, 2.0) == 3 * 1.0 + 4 * 2.0  # ⌈10/4⌉ inputs, 4 blocks
    assert best_segment(8, 1.0, 16.0) < 1  # a Transformer block saves far more than its input


def test_bad_input():
    model, ids, targets = _setup()
    for every in (0, 5, 1.5, True):
        with pytest.raises(ValueError, match="every must be None or an integer"):
            checkpointed_forward(model, ids, targets, every)
    with pytest.raises(ValueError, match="n_layers"):
        checkpoint_memory(0, 1, 1.0, 1.0)
    with pytest.raises(ValueError, match="every"):
        checkpoint_memory(4, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        best_segment(4, 0.0, 1.0)
