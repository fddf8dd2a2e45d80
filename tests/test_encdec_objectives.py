"""tfm_course.experiments.encdec_objectives: T5's objectives on one fixed encoder-decoder."""

from __future__ import annotations

import pytest
import torch

from tfm_course.experiments.encdec_objectives import (ENCDEC_OBJECTIVES, ask_infill, ask_next_token,
                                                      blank_gap, encoder_reads, objective_batch,
                                                      objective_loss)
from tfm_course.experiments.objectives import Specials, build_model
from tfm_course.models.t5 import shift_right

SPECIALS = Specials.after(40, eos=0, n_sentinels=8)


def tiny(seed=0):
    torch.manual_seed(seed)
    return build_model("span corruption", SPECIALS, d_model=16, num_heads=2, num_layers=2, d_ff=32).eval()


def raw(batch=3, length=20, seed=0):
    return torch.randint(1, 40, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("objective", ENCDEC_OBJECTIVES)
def test_every_input_ends_in_eos_and_the_target_comes_from_the_window(objective):
    x = raw()
    inputs, targets = objective_batch(objective, x, SPECIALS, torch.Generator().manual_seed(1))
    assert (inputs[:, -1] == SPECIALS.eos).all()
    if objective == "causal LM":
        assert inputs.shape == (3, 1) and torch.equal(targets, x)
    elif objective == "BERT-style":
        assert torch.equal(targets, x) and inputs.shape == (3, 21)
        changed = (inputs[:, :-1] != x).sum(1)
        assert (changed <= 3).all() and changed.sum() > 0  # 15 % of 20 chosen: 3 per row at most
    elif objective == "prefix LM":
        cut = inputs.shape[1] - 1
        assert 1 <= cut < 20 and torch.equal(inputs[:, :-1], x[:, :cut]) and torch.equal(targets, x[:, cut:])
    else:
        assert set(SPECIALS.sentinels[:1]) <= set(targets[:, 0].tolist()) and (targets[:, -1] == SPECIALS.eos).all()


def test_the_loss_is_teacher_forced_cross_entropy_and_the_causal_lm_ignores_its_blank_input():
    model, x = tiny(), raw()
    batch = objective_batch("prefix LM", x, SPECIALS, torch.Generator().manual_seed(3))
    logits = model(batch[0], shift_right(batch[1], SPECIALS.pad))
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())
    assert torch.allclose(objective_loss(model, batch, SPECIALS), want)
    causal = objective_batch("causal LM", x, SPECIALS, None)
    assert blank_gap(model, causal, SPECIALS)["gap"] == 0.0  # its input is blank already
    assert blank_gap(model, batch, SPECIALS)["gap"] != 0.0  # a random encoder still changes the output
    assert not encoder_reads("causal LM") and encoder_reads("prefix LM")


def test_questions_are_asked_as_training_asked_them():
    model, x = tiny(), raw(length=9)
    left, right = x[:, :4], x[:, 5:]
    for objective in ENCDEC_OBJECTIVES:
        assert ask_next_token(objective, model, left, SPECIALS).shape == (3, SPECIALS.vocab_size)
    # the language models cannot read the right context: their infill is their next token
    for objective in ("prefix LM", "causal LM"):
        assert torch.equal(ask_infill(objective, model, left, right, SPECIALS),
                           ask_next_token(objective, model, left, SPECIALS))
    # the denoisers read it: changing the right context changes their answer
    for objective in ("span corruption", "BERT-style"):
        other = (right + 1) % 40
        assert not torch.allclose(ask_infill(objective, model, left, right, SPECIALS),
                                  ask_infill(objective, model, left, other, SPECIALS))
    # span corruption's infill is the model's first output after <extra_id_0>
    s0, eos, start = SPECIALS.sentinels[0], SPECIALS.eos, SPECIALS.pad
    inputs = torch.cat([left, torch.full((3, 1), s0), right, torch.full((3, 1), eos)], 1)
    want = model(inputs, torch.tensor([[start, s0]] * 3))[:, -1]
    assert torch.allclose(ask_infill("span corruption", model, left, right, SPECIALS), want)


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="objective must be one of"):
        objective_batch("deshuffling", raw(), SPECIALS, None)
    with pytest.raises(ValueError, match=r"raw must be \(batch, length >= 2\)"):
        objective_batch("causal LM", raw()[0], SPECIALS, None)
    with pytest.raises(ValueError, match="same batch size"):
        ask_infill("BERT-style", tiny(), raw(3, 4), raw(2, 4), SPECIALS)


def test_cross_attention_weights_are_distributions_and_uniform_without_keys():
    from tfm_course.experiments.encdec_objectives import cross_attention_weights, sentinel_attention
    model, x = tiny(), raw(length=39)
    batch = objective_batch("span corruption", x, SPECIALS, torch.Generator().manual_seed(0))
    w = cross_attention_weights(model, batch[0], shift_right(batch[1], SPECIALS.pad))
    assert w.shape == (1, 3, 2, batch[1].shape[1], batch[0].shape[1])
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    with torch.no_grad():
        model.decoder.blocks[0].cross_attn.k.weight.zero_()  # every key 0: every score equal
    w = cross_attention_weights(model, batch[0], shift_right(batch[1], SPECIALS.pad))
    torch.testing.assert_close(w, torch.full_like(w, 1 / batch[0].shape[1]))
    att = sentinel_attention(model, batch, SPECIALS)
    for name in ("left of the same sentinel", "the same sentinel", "left of another sentinel"):
        assert att[f"layer 0: {name}"] == pytest.approx(att["uniform"])


def test_sentinel_attention_reports_the_heads_it_is_given():
    from tfm_course.experiments.encdec_objectives import sentinel_attention
    model = tiny()
    batch = objective_batch("span corruption", raw(2, 39), SPECIALS, torch.Generator().manual_seed(0))
    chosen = sentinel_attention(model, batch, SPECIALS)
    heads = [1 - chosen["layer 0: head"]]  # the other of the two heads
    other = sentinel_attention(model, batch, SPECIALS, heads=heads)
    assert other["layer 0: head"] == heads[0]
    assert other["layer 0: left of the same sentinel"] <= chosen["layer 0: left of the same sentinel"]
    with pytest.raises(ValueError, match=r"one per decoder block \(1\), got 2"):
        sentinel_attention(model, batch, SPECIALS, heads=[0, 1])


def test_the_prefix_lm_can_be_asked_with_the_cut_inside_the_context():
    model, x = tiny(), raw(length=9)
    context = x[:, :6]
    want = model(torch.cat([context[:, :2], torch.full((3, 1), SPECIALS.eos)], 1),
                 torch.cat([torch.full((3, 1), SPECIALS.pad), context[:, 2:]], 1))[:, -1]
    torch.testing.assert_close(ask_next_token("prefix LM", model, context, SPECIALS, cut=2), want)
    with pytest.raises(ValueError, match="cut is for the prefix LM"):
        ask_next_token("causal LM", model, context, SPECIALS, cut=2)
    with pytest.raises(ValueError, match="cut"):
        ask_next_token("prefix LM", model, context, SPECIALS, cut=6)
