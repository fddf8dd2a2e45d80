"""tfm_course.models.t5_lm: one stack of T5 blocks as an encoder-only, decoder-only or prefix LM."""

from __future__ import annotations

import pytest
import torch

from tfm_course.models.t5 import T5, T5Config, prefix_lm_mask
from tfm_course.models.t5_lm import T5StackLM, stack_lm_mask

SIZES = dict(vocab_size=53, d_model=24, d_kv=8, d_ff=40, num_layers=3, num_heads=3, dropout=0.0,
             num_buckets=8, max_distance=20)


def lm(causal: bool, seed: int = 0, bidirectional_buckets: bool | None = None, **overrides) -> T5StackLM:
    torch.manual_seed(seed)
    return T5StackLM(T5Config(**{**SIZES, **overrides}), causal, bidirectional_buckets).eval()


def ids(seed: int = 0, batch: int = 2, n: int = 9) -> torch.Tensor:
    return torch.randint(1, 53, (batch, n), generator=torch.Generator().manual_seed(seed))


def changed_positions(model: T5StackLM, x: torch.Tensor, at: int, **kwargs) -> torch.Tensor:
    """Positions (of row 0) whose logits move when token ``at`` changes."""
    y = x.clone()
    y[:, at] = (y[:, at] + 1) % 53
    with torch.no_grad():
        diff = (model(x, **kwargs) - model(y, **kwargs)).abs().amax(-1)[0]
    return diff > 1e-6


def test_the_encoder_equals_t5s_encoder_with_the_same_weights():
    torch.manual_seed(0)
    t5 = T5(T5Config(**SIZES)).eval()
    encoder = lm(causal=False)
    encoder.shared.load_state_dict(t5.shared.state_dict())
    encoder.stack.load_state_dict(t5.encoder.state_dict())
    x = ids()
    mask = torch.tensor([[True] * 9, [True] * 5 + [False] * 4])
    with torch.no_grad():
        assert torch.allclose(encoder.hidden(x, mask), t5.encode(x, mask), atol=1e-6)


def test_causal_sees_only_the_past_and_the_encoder_sees_everything():
    x = ids()
    assert changed_positions(lm(True), x, 4).tolist() == [False] * 4 + [True] * 5
    assert changed_positions(lm(False), x, 4).all()
    assert lm(False).stack.blocks[0].relative_bias.bidirectional
    assert not lm(True).stack.blocks[0].relative_bias.bidirectional


def test_prefix_lm_shows_the_prefix_to_every_position_per_row():
    model = lm(True, bidirectional_buckets=True)
    x = ids()
    # a token inside the prefix (3 < 5) is seen by every position, one after it only by later ones
    assert changed_positions(model, x, 3, prefix_len=5).all()
    assert changed_positions(model, x, 6, prefix_len=5).tolist() == [False] * 6 + [True] * 3
    per_row = torch.tensor([5, 2])
    mask = stack_lm_mask(9, True, per_row)
    assert mask.shape == (2, 1, 9, 9)
    assert torch.equal(mask[0, 0], prefix_lm_mask(9, 5)) and torch.equal(mask[1, 0], prefix_lm_mask(9, 2))
    with torch.no_grad():
        both = model(x, prefix_len=per_row)
        assert torch.allclose(both[1], model(x[1:], prefix_len=2)[0], atol=1e-6)


def test_padding_changes_nothing_for_the_real_tokens():
    for causal in (False, True):
        model = lm(causal)
        x = ids(n=6)
        padded = torch.cat([x, torch.zeros(2, 3, dtype=torch.long)], dim=1)
        mask = torch.arange(9)[None, :] < 6
        with torch.no_grad():
            assert torch.allclose(model(padded, mask.expand(2, 9))[:, :6], model(x), atol=1e-5)


def test_tied_and_rescaled_output_layer():
    model = lm(True)
    assert model.lm_head.weight is model.shared.weight
    x = ids()
    with torch.no_grad():
        want = model.hidden(x) * 24 ** -0.5 @ model.shared.weight.T
        assert torch.allclose(model(x), want, atol=1e-5)
    assert model.shared.weight.std() > 0.5  # T5's embedding init (std 1), not overwritten by the head's


def test_masks():
    assert stack_lm_mask(4, causal=False) is None
    assert torch.equal(stack_lm_mask(4, True)[0, 0], torch.ones(4, 4, dtype=torch.bool).tril())
    keys = torch.tensor([[True, True, False, False]])
    assert torch.equal(stack_lm_mask(4, False, attention_mask=keys), keys[:, None, None, :])


@pytest.mark.parametrize("call, match", [
    (lambda m: m(ids().float()), "ids must be integer"),
    (lambda m: m(ids(), torch.ones(2, 9)), "attention_mask must be bool"),
    (lambda m: m(ids(), torch.ones(2, 4, dtype=torch.bool)), r"attention_mask must be bool \(2, 9\)"),
    (lambda m: stack_lm_mask(4, False, prefix_len=2), "prefix_len only makes sense with causal=True"),
])
def test_bad_input_gives_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(lm(True))


def test_runs_on_the_meta_device_without_host_reads():
    model = lm(True).to("meta")
    x = ids().to("meta")
    assert model(x, x != 0, prefix_len=torch.tensor([3, 4], device="meta")).shape == (2, 9, 53)
