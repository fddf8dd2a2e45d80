"""tfm_course.experiments.context_questions: the questions, their count-based answers, a model's."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.experiments.context_questions import (answer_questions, context_questions, count_references,
                                                      split_documents)
from tfm_course.experiments.encdec_objectives import ask_next_token
from tfm_course.experiments.objectives import Specials, build_model
from tfm_course.ngram import KneserNey

SPECIALS = Specials.after(12, eos=0, n_sentinels=4)


def test_questions_are_the_stream_around_a_position_and_skip_eos():
    stream = torch.arange(1, 200) % 12  # every 12th token is EOS (0)
    q = context_questions(stream, 50, 3, 2, torch.Generator().manual_seed(0), eos=0)
    assert q.left.shape == (50, 3) and q.right.shape == (50, 2) and (q.target != 0).all()
    assert torch.equal(q.left[:, -1] % 12, (q.target - 1) % 12) and torch.equal(q.right[:, 0] % 12, (q.target + 1) % 12)
    with pytest.raises(ValueError, match="longer than"):
        context_questions(stream[:5], 3, 3, 2, torch.Generator())


def test_documents_end_in_eos():
    docs = split_documents(torch.tensor([3, 4, 0, 5, 0, 6]), eos=0)
    assert [d.tolist() for d in docs] == [[3, 4, 0], [5, 0], [6]]


def test_count_references_match_the_n_gram_models():
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, 12, (40,), generator=g) for _ in range(20)]
    stream = torch.cat(docs)
    q = context_questions(stream, 64, 4, 2, g)
    refs = count_references(docs, q, 12)
    lm = KneserNey(2, 12).fit([d.numpy() for d in docs])
    P = lm.bigram_matrix()
    want = -P[q.left[:, -1], q.target].log().mean()
    assert refs["next token: KN bigram"]["loss"] == pytest.approx(float(want))
    assert refs["next token: KN bigram"]["accuracy"] == pytest.approx(float((P[q.left[:, -1]].argmax(1) == q.target).double().mean()))
    # the two-sided answer is normalised: it sums to one over the middle token
    a, b = int(q.left[0, -1]), int(q.right[0, 0])
    trios = torch.tensor([[a, w, b] for w in range(12)])
    assert math.isclose(float(lm.two_sided(trios)[:, 1].neg().exp().sum()), 1.0, rel_tol=1e-9)
    assert refs["infill: KN two-sided bigram"]["loss"] < refs["next token: unigram"]["loss"]


def test_a_model_is_scored_over_text_tokens_only():
    torch.manual_seed(0)
    model = build_model("span corruption", SPECIALS, d_model=16, num_heads=2, num_layers=2, d_ff=32)
    with torch.no_grad():  # make every sentinel overwhelmingly likely: banned, so it costs nothing
        model.shared.weight[SPECIALS.sentinels] *= 0
        model.shared.weight[SPECIALS.sentinels] += 100 * model.shared.weight[1]
    q = context_questions(torch.randint(1, 12, (300,), generator=torch.Generator().manual_seed(1)), 40, 4, 4,
                          torch.Generator().manual_seed(2))
    scores = answer_questions("span corruption", model, q, SPECIALS, batch=16)
    assert set(scores) == {"next token", "infill"}
    with torch.no_grad():
        unbanned = torch.nn.functional.cross_entropy(ask_next_token("span corruption", model, q.left, SPECIALS),
                                                     q.target).item()
    assert scores["next token"]["loss"] < unbanned - 5  # the sentinels' mass is not charged
    lm = answer_questions("causal LM", model, q, SPECIALS)
    assert lm["next token"] == lm["infill"]  # a language model cannot see the right side
