"""tfm_course.decoding: sampling filters, greedy, sampling and beam search on toy and real
models, the encoder-decoder's KV cache, bad input."""

import itertools
import math

import pytest
import torch

import tfm_course.decoding as decoding
from cuda_helpers import needs_cuda
from tfm_course.attention import kv_cache_bytes
from tfm_course.decoding import (beam_decode, beam_search, generate, greedy_decode, greedy_search,
                                 length_penalty, min_p_filter, sample, top_k_filter, top_p_filter)
from tfm_course.models.transformer import KVCache, Recompute, Transformer

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
    with pytest.raises(ValueError, match="reorder"):
        beam_search(lambda prefix: torch.zeros(4, 5), 2, 2, BOS, EOS, 3)
    with pytest.raises(ValueError, match=r"batch\*beam=4"):
        beam_search(Rows(lambda prefix: torch.zeros(3, 5)), 2, 2, BOS, EOS, 3)
    with pytest.raises(ValueError, match=r"prompt must be \(batch=2"):
        beam_search(Table({}), 2, 2, BOS, EOS, 3, prompt=torch.ones(3, 1, dtype=torch.long))


class Rows:
    """A stateless stepper from a function, recording every prefix it is asked about."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def __call__(self, prefix):
        self.seen.append(prefix.clone())
        return self.fn(prefix)

    def reorder(self, index):
        pass


def test_beam_search_keeps_k_live_hypotheses_after_one_finishes():
    # the best first token is <eos>; the K = 2 live hypotheses must still be A and B (a beam that
    # kept finished hypotheses in its slots would go on with A alone)
    table = Table({(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    rows = Rows(table)
    beam_search(rows, 1, beam_size=2, bos_id=BOS, eos_id=EOS, max_len=3, alpha=0.0)
    assert sorted(rows.seen[1][:, 1].tolist()) == [A, B]
    # the same with length normalisation strong enough that a longer hypothesis wins: only a beam
    # that keeps B alive can find B B EOS
    table = Table({(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 0.9, A: 0.1},
                   (B,): {B: 1.0}, (B, B): {EOS: 1.0}})
    out, score = beam_search(table, 1, 2, BOS, EOS, max_len=4, alpha=3.0)
    assert out.tolist() == [[B, B, EOS]]
    torch.testing.assert_close(score, torch.tensor([math.log(0.2) / length_penalty(3, 3.0)]),
                               atol=1e-4, rtol=0)


def _random_table(vocab: int, seed: int):
    """Next-token logits that are a fixed random function of the whole prefix."""
    def next_logits(prefix):
        rows = []
        for seq in prefix.tolist():
            g = torch.Generator().manual_seed(hash((seed, tuple(seq))) % 2**31)
            rows.append(2 * torch.randn(vocab, generator=g))
        return torch.stack(rows)
    return next_logits


def _exhaustive_best(next_logits, vocab, max_len, alpha):
    """Best length-normalised hypothesis over *all* sequences up to max_len (tiny vocabularies)."""
    best = (float("-inf"), None)
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
                continue  # a hypothesis ends at its first <eos>, or at max_len
            prefix = torch.tensor([[BOS, *seq]])
            logp = torch.log_softmax(next_logits(prefix[:, :1]), -1)[0, seq[0]].item()
            for t in range(1, n):
                logp += torch.log_softmax(next_logits(prefix[:, :t + 1]), -1)[0, seq[t]].item()
            best = max(best, (logp / length_penalty(n, alpha), list(seq)))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_a_wide_beam_finds_the_exhaustive_best(alpha):
    vocab, max_len = 4, 4
    for seed in range(3):
        table = Rows(_random_table(vocab, seed))
        want_score, want = _exhaustive_best(table.fn, vocab, max_len, alpha)
        out, score = beam_search(table, 1, beam_size=vocab ** max_len, bos_id=BOS, eos_id=EOS,
                                 max_len=max_len, alpha=alpha)
        assert out.tolist() == [want]
        assert abs(score.item() - want_score) < 1e-4


def test_beam_of_one_is_greedy_on_random_tables():
    for seed in range(5):
        table = Rows(_random_table(5, seed))
        greedy = greedy_search(table, 1, BOS, EOS, max_len=6)
        beam, _ = beam_search(table, 1, 1, BOS, EOS, max_len=6, alpha=0.0)
        assert beam.tolist() == greedy.tolist()


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


def test_kv_cache_must_be_fed_longer_prefixes():
    model, src = _model(), _src()
    cache = KVCache(model, src)
    with torch.no_grad():
        cache(torch.full((6, 2), BOS))
    with pytest.raises(ValueError, match="prefix must have more than 2"):
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


def test_kv_cache_accepts_several_new_tokens_at_once():
    model, src = _model(norm_first=True), _src()
    prefix = torch.randint(3, 17, (src.shape[0], 6))
    prefix[:, 0] = BOS
    with torch.no_grad():
        want = [Recompute(model, src)(prefix[:, :t]) for t in (4, 5, 6)]
        cache = KVCache(model, src)
        got = [cache(prefix[:, :4]), cache(prefix[:, :5]), cache(prefix[:, :6])]  # 4, then 1, 1
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="more than 6"):
        cache(prefix)


def test_kv_cache_bytes_count_self_and_cross_attention():
    model, src = _model(), _src()
    cache = KVCache(model, src)
    B, S, layers, heads, d_head = src.shape[0], src.shape[1], 2, 4, 8
    per_token = kv_cache_bytes(layers, heads, d_head, bytes_per_value=4)
    assert cache.nbytes() == B * S * per_token, "the cross-attention part is there from the start"
    prefix = torch.full((B, 1), BOS)
    with torch.no_grad():
        for t in range(1, 4):
            cache(prefix)
            assert cache.nbytes() == B * (S + t) * per_token
            prefix = torch.cat([prefix, torch.full((B, 1), A)], dim=1)


def test_steppers_refuse_positions_past_max_len():
    model, src = _model(), _src()  # max_len 32
    too_long = torch.full((src.shape[0], 33), BOS)
    for use_cache in (False, True):
        with pytest.raises(ValueError, match="exceed max_len 32"):
            model.stepper(src, use_cache=use_cache)(too_long)


# --------------------------------------------------------------------------- filters and sampling
def test_top_k_filter_keeps_exactly_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, -2.0, 4.0]])
    kept = top_k_filter(logits, 2)
    assert torch.isfinite(kept).tolist() == [[False, True, False, False, True]]
    assert torch.equal(kept[torch.isfinite(kept)], torch.tensor([5.0, 4.0])), "values unchanged"
    assert torch.equal(top_k_filter(logits, 10), logits)


def test_top_p_filter_keeps_the_smallest_set_that_reaches_p():
    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    logits = probs.log()
    keeps = {0.5: [1], 0.6: [1, 2], 0.75: [1, 2], 0.76: [1, 2, 3], 0.9: [1, 2, 3], 1.0: [0, 1, 2, 3],
             0.01: [1]}
    for p, want in keeps.items():
        kept = torch.isfinite(top_p_filter(logits, p))[0].nonzero().flatten().tolist()
        assert kept == want, (p, kept)
    # on random rows: the kept set reaches p, and without its least likely member it would not
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(50, 30, generator=g)
    for p in (0.3, 0.8, 0.95):
        kept = torch.isfinite(top_p_filter(logits, p))
        probs = logits.softmax(-1)
        mass = (probs * kept).sum(-1)
        smallest = probs.masked_fill(~kept, 2.0).min(-1).values
        assert (mass >= p - 1e-6).all() and (mass - smallest < p).all()


def test_min_p_filter_keeps_tokens_at_least_p_times_the_best():
    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    keeps = {1.0: [1], 0.6: [1], 0.45: [1, 2], 0.3: [1, 2, 3], 0.19: [0, 1, 2, 3],
             0.01: [0, 1, 2, 3]}  # (p = 0.2 or 0.5 would sit on a boundary)
    for p, want in keeps.items():
        kept = torch.isfinite(min_p_filter(probs.log(), p))[0].nonzero().flatten().tolist()
        assert kept == want, (p, kept)
    logits = torch.tensor([[2.0, 2.0, 0.0]])
    assert torch.isfinite(min_p_filter(logits, 1.0)).tolist() == [[True, True, False]], "ties stay"
    kept = min_p_filter(logits, 0.5)
    assert torch.equal(kept[:, :2], logits[:, :2]), "kept logits unchanged"


@pytest.mark.hf
def test_min_p_filter_equals_hugging_face():
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper

    g = torch.Generator().manual_seed(0)
    for scale, temperature, p in [(1.0, 1.0, 0.05), (3.0, 0.7, 0.1), (5.0, 1.5, 0.3), (2.0, 1.0, 1.0)]:
        logits = scale * torch.randn(64, 97, generator=g)
        ids = torch.zeros(64, 1, dtype=torch.long)
        theirs = MinPLogitsWarper(p)(ids, TemperatureLogitsWarper(temperature)(ids, logits.clone()))
        assert torch.equal(min_p_filter(logits / temperature, p), theirs), (scale, temperature, p)


def test_sampling_limits_equal_greedy():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(200, 50, generator=g)
    greedy = logits.argmax(-1)
    assert torch.equal(sample(logits, temperature=0.0), greedy)
    assert torch.equal(sample(logits, top_k=1, generator=g), greedy), "k = 1 is greedy"
    top2 = logits.topk(2, -1).values
    clear = top2[:, 0] - top2[:, 1] > 0.02  # rows without a near-tie: p(runner-up) < e^-20
    cold = sample(logits, temperature=1e-3, generator=g)
    assert clear.sum() > 150 and torch.equal(cold[clear], greedy[clear]), "T -> 0 is greedy"
    assert torch.equal(sample(logits, top_p=1e-6, generator=g), greedy), "a tiny nucleus is greedy"
    assert torch.equal(sample(logits, min_p=1.0, generator=g), greedy), "min-p = 1 is greedy"
    hot = sample(logits, temperature=1.0, generator=g)
    assert not torch.equal(hot, greedy), "T = 1 samples"


def test_sample_follows_the_filtered_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample(logits, temperature=2.0, top_k=3, generator=g), minlength=4)
    want = torch.softmax(torch.tensor([1.0, 2.0, 3.0]) / 2.0, -1)
    assert counts[0] == 0, "top-k removed the least likely token"
    torch.testing.assert_close(counts[1:] / 20000, want, atol=0.015, rtol=0)
    # min-p after the temperature: at T = 0.5 the probabilities are 0.002, 0.016, 0.117, 0.865,
    # so min_p = 0.1 (cut at 0.0865) keeps the last two
    counts = torch.bincount(sample(logits, temperature=0.5, min_p=0.1, generator=g), minlength=4)
    want = torch.softmax(torch.tensor([2.0, 3.0]) / 0.5, -1)
    assert counts[:2].sum() == 0, "min-p removed the tokens below a tenth of the best"
    torch.testing.assert_close(counts[2:] / 20000, want, atol=0.015, rtol=0)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(8, 30)
    a = sample(logits, 0.8, 10, 0.9, generator=torch.Generator().manual_seed(3))
    b = sample(logits, 0.8, 10, 0.9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=0), "top_k must be an integer >= 1"),
    (dict(top_k=2.5), "top_k must be an integer >= 1"),
    (dict(top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(min_p=0.0), r"min_p must be a number in \(0, 1\]"),
    (dict(min_p=1.5), r"min_p must be a number in \(0, 1\]"),
    (dict(min_p=True), r"min_p must be a number in \(0, 1\]"),
    (dict(temperature=-1.0), "temperature must be a number >= 0"),
])
def test_sampling_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample(torch.randn(2, 5), **kwargs)
    with pytest.raises(ValueError, match=message):
        generate(lambda p: torch.randn(p.shape[0], 5), torch.ones(2, 1, dtype=torch.long), 3, **kwargs)
    with pytest.raises(ValueError, match=r"logits must be \(N, V\)"):
        sample(torch.randn(5))


# --------------------------------------------------------------------------- generate
def test_generate_returns_the_prompt_and_pads_finished_rows():
    def next_logits(prefix):  # row 0 says <eos> after its prompt, row 1 says A, A, then <eos>
        logits = torch.zeros(2, 5)
        logits[0, EOS] = 1.0
        logits[1, EOS if prefix.shape[1] >= 4 else A] = 1.0
        return logits

    prompt = torch.tensor([[B, B], [B, A]])
    out = generate(next_logits, prompt, max_new_tokens=6, temperature=0.0, eos_id=EOS, pad_id=PAD)
    assert out.tolist() == [[B, B, EOS, PAD, PAD], [B, A, A, A, EOS]]
    free = generate(next_logits, prompt, max_new_tokens=3, temperature=0.0)  # no <eos>: n steps
    assert free.shape == (2, 5)
    assert torch.equal(generate(next_logits, prompt, 0), prompt)


def test_checking_for_the_end_every_few_steps_changes_nothing(monkeypatch):
    """On a GPU the loops look at "all finished?" only every few steps (a host sync)."""
    table = Table({(): {A: 0.6, B: 0.4}, (A,): {B: 0.7, EOS: 0.3}, (A, B): {EOS: 0.9}})
    tables = [_random_table(6, seed) for seed in range(3)]
    want = [greedy_search(table, 2, BOS, EOS, 10)] + [
        beam_search(Rows(t), 2, 3, BOS, EOS, 6, alpha=0.6)[0] for t in tables]
    monkeypatch.setattr(decoding, "_checks_every", lambda device: 8)
    got = [greedy_search(table, 2, BOS, EOS, 10)] + [
        beam_search(Rows(t), 2, 3, BOS, EOS, 6, alpha=0.6)[0] for t in tables]
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_generate_bad_input():
    stepper = lambda p: torch.zeros(p.shape[0], 5)  # noqa: E731
    with pytest.raises(ValueError, match="prompt must be integer ids"):
        generate(stepper, torch.ones(2, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="prompt must be integer ids"):
        generate(stepper, torch.ones(2, 3), 3)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        generate(stepper, torch.ones(2, 1, dtype=torch.long), -1)
    with pytest.raises(ValueError, match=r"\(batch=2, V\)"):
        generate(lambda p: torch.zeros(5), torch.ones(2, 1, dtype=torch.long), 3)


@needs_cuda
def test_on_cuda_decoding_is_the_same_with_or_without_cache_and_with_late_end_checks(monkeypatch):
    model, src = _model().cuda(), _src().cuda()
    got = {}
    for every in (8, 1):  # 8: the GPU default, a host sync every 8 steps; 1: every step
        monkeypatch.setattr(decoding, "_checks_every", lambda device, every=every: every)
        got[every] = [greedy_decode(model, src, BOS, EOS, 10, use_cache=c) for c in (True, False)]
        got[every] += [beam_decode(model, src, BOS, EOS, 10, beam_size=3, use_cache=c)[0]
                       for c in (True, False)]
    for a, b in zip(got[8], got[1]):
        assert a.device.type == "cuda" and torch.equal(a, b)
    assert torch.equal(got[8][0], got[8][1]) and torch.equal(got[8][2], got[8][3])
