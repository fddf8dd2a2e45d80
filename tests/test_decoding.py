"""tfm_course.decoding: greedy and beam search on toy and real models, the KV cache, bad input."""

import math

import pytest
import torch

from tfm_course.decoding import (KVCache, Recompute, beam_decode, beam_search, greedy_decode,
                                 greedy_search, length_penalty)
from tfm_course.models.transformer import Transformer

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4


class Table:
    """A toy 'model': next-token probabilities looked up from the prefix (after <bos>)."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 5):
        self.table, self.vocab = table, vocab

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        rows = []
        for seq in prefix.tolist():
            probs = torch.full((self.vocab,), 1e-6)
            for token, p in self.table.get(tuple(seq[1:]), {EOS: 1.0}).items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)

    def reorder(self, index: torch.Tensor) -> None:
        pass  # stateless


# --------------------------------------------------------------------------- greedy
def test_greedy_search_follows_the_argmax_and_pads_after_eos():
    table = Table({(): {A: 0.6, B: 0.4}, (A,): {B: 0.7, EOS: 0.3}, (A, B): {EOS: 0.9}})
    out = greedy_search(table, batch_size=2, bos_id=BOS, eos_id=EOS, max_len=10)
    assert out.tolist() == [[A, B, EOS], [A, B, EOS]]
    short = greedy_search(table, 1, BOS, EOS, max_len=2)
    assert short.tolist() == [[A, B]], "max_len cuts the output"


def test_greedy_search_rows_finish_at_different_times():
    def next_logits(prefix):  # row 0 stops at once, row 1 after two A's
        logits = torch.zeros(2, 5)
        logits[0, EOS] = 1.0
        logits[1, EOS if prefix.shape[1] > 2 else A] = 1.0
        return logits

    out = greedy_search(next_logits, 2, BOS, EOS, max_len=8, pad_id=PAD)
    assert out.tolist() == [[EOS, PAD, PAD], [A, A, EOS]]


def test_greedy_search_bad_input():
    with pytest.raises(ValueError, match="positive"):
        greedy_search(Table({}), 1, BOS, EOS, max_len=0)
    with pytest.raises(ValueError, match=r"\(batch=2, V\)"):
        greedy_search(lambda prefix: torch.zeros(3, 5), 2, BOS, EOS, max_len=3)


# --------------------------------------------------------------------------- beam
def test_beam_search_finds_what_greedy_misses():
    # greedy takes A (0.6) and ends with prob 0.6 · 0.4 = 0.24; B EOS has 0.4 · 0.9 = 0.36
    table = Table({(): {A: 0.6, B: 0.4}, (A,): {A: 0.3, B: 0.3, EOS: 0.4}, (B,): {EOS: 0.9, A: 0.1},
                   (A, A): {EOS: 1.0}, (A, B): {EOS: 1.0}})
    assert greedy_search(table, 1, BOS, EOS, 5).tolist() == [[A, EOS]]
    out, score = beam_search(table, 1, beam_size=2, bos_id=BOS, eos_id=EOS, max_len=5, alpha=0.0)
    assert out.tolist() == [[B, EOS]]
    torch.testing.assert_close(score, torch.tensor([math.log(0.4 * 0.9)]), atol=1e-4, rtol=0)


def test_length_normalisation_favours_longer_hypotheses():
    # raw log p: "EOS" = log 0.5 beats "A EOS" = log 0.45; normalised with alpha=1 it loses
    table = Table({(): {EOS: 0.5, A: 0.5}, (A,): {EOS: 0.9}})
    raw, _ = beam_search(table, 1, 2, BOS, EOS, 5, alpha=0.0)
    normalised, _ = beam_search(table, 1, 2, BOS, EOS, 5, alpha=1.0)
    assert raw.tolist()[0][:1] == [EOS] and normalised.tolist() == [[A, EOS]]


def test_length_penalty():
    lengths = torch.arange(1, 20)
    assert torch.allclose(length_penalty(torch.tensor([1]), 0.7), torch.tensor([1.0]))
    assert (length_penalty(lengths, 0.0) == 1).all()
    assert (length_penalty(lengths, 0.6).diff() > 0).all()


def test_beam_search_bad_input():
    with pytest.raises(ValueError, match="positive"):
        beam_search(Table({}), 1, 0, BOS, EOS, 5)
    with pytest.raises(ValueError, match=r"batch\*beam=4"):
        beam_search(lambda prefix: torch.zeros(3, 5), 2, 2, BOS, EOS, 3)


# --------------------------------------------------------------------------- real models
def _model(norm_first=False):
    torch.manual_seed(0)
    return Transformer(13, 17, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                       d_ff=64, dropout=0.1, norm_first=norm_first, max_len=32).eval()


def _src():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 13, (6, 7), generator=g)
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    return src


@pytest.mark.parametrize("norm_first", [False, True])
def test_kv_cache_equals_recompute(norm_first):
    model, src = _model(norm_first), _src()
    cached, full = KVCache(model, src), Recompute(model, src)
    prefix = torch.full((src.shape[0], 1), BOS)
    with torch.no_grad():
        for _ in range(8):
            a, b = cached(prefix), full(prefix)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            prefix = torch.cat([prefix, a.argmax(-1, keepdim=True)], dim=1)
    assert cached.self_kv[0][0].shape == (6, 4, 8, 8)  # (batch, heads, positions, d_head)


def test_kv_cache_must_be_fed_in_order():
    model, src = _model(), _src()
    cache = KVCache(model, src)
    with pytest.raises(ValueError, match="prefix must have 1"):
        cache(torch.full((6, 2), BOS))


@pytest.mark.parametrize("norm_first", [False, True])
def test_greedy_decode_same_with_and_without_cache(norm_first):
    model, src = _model(norm_first), _src()
    model.train()
    a = greedy_decode(model, src, BOS, EOS, max_len=10, use_cache=True)
    b = greedy_decode(model, src, BOS, EOS, max_len=10, use_cache=False)
    assert torch.equal(a, b)
    assert model.training, "decoding restores the training flag"
    after_eos = (a == EOS).long().cumsum(1) - (a == EOS).long() > 0
    assert ((a == PAD) == after_eos).all(), "padding exactly after the first <eos>"
    assert not (a == BOS).any()


def test_beam_decode_with_beam_one_is_greedy_and_cache_changes_nothing():
    model, src = _model(), _src()
    greedy = greedy_decode(model, src, BOS, EOS, max_len=10)
    one, _ = beam_decode(model, src, BOS, EOS, max_len=10, beam_size=1, alpha=0.0)
    assert torch.equal(one, greedy)
    a, sa = beam_decode(model, src, BOS, EOS, max_len=10, beam_size=3, use_cache=True)
    b, sb = beam_decode(model, src, BOS, EOS, max_len=10, beam_size=3, use_cache=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-5)


def test_beam_score_is_the_models_normalised_log_probability():
    model, src = _model(), _src()
    alpha = 0.6
    out, score = beam_decode(model, src, BOS, EOS, max_len=10, beam_size=3, alpha=alpha)
    with torch.no_grad():
        tgt_in = torch.cat([torch.full((src.shape[0], 1), BOS), out[:, :-1]], dim=1)
        logits = model(src, tgt_in)
        logits[..., [PAD, BOS]] = float("-inf")  # decoding never proposes these
        logp = torch.log_softmax(logits, -1).gather(-1, out.clamp(min=1)[..., None]).squeeze(-1)
    real = torch.ones_like(out, dtype=torch.bool)
    for row in range(out.shape[0]):  # tokens up to and including the first <eos>
        hits = (out[row] == EOS).nonzero()
        if len(hits):
            real[row, int(hits[0]) + 1:] = False
    total = (logp * real).sum(-1)
    want = total / length_penalty(real.sum(-1), alpha)
    torch.testing.assert_close(score, want, atol=1e-4, rtol=1e-4)
    better, _ = beam_decode(model, src, BOS, EOS, max_len=10, beam_size=6, alpha=alpha)
    greedy = greedy_decode(model, src, BOS, EOS, max_len=10)
    assert better.shape[0] == greedy.shape[0]
