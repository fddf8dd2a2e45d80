"""tfm_course.experiments.sampling: the rules' distributions, the measured generation loop against
GPT.generate, real text under a rule, the calibrated temperature, beam search from a prompt, the
repetition metrics on constructed rows, bad input."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

from tfm_course.decoding import min_p_filter, sample, top_k_filter, top_p_filter
from tfm_course.experiments.sampling import (
    beam_continuations, calibrated_temperature, continuation_log2probs, distinct_n, ends_in_loop,
    entropy_bits, generate_measured, longest_repeated_suffix, rep_n, rule_logits, text_stats,
    validation_under)
from tfm_course.models.gpt import GPT, GPTConfig

SMALL = dict(vocab_size=23, max_len=24, d_model=32, n_layers=2, n_heads=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _model(seed=0, sharpen=5.0):
    """A random GPT whose next-token entropy is ~3 bits of log2(23) = 4.5 (GPT-2's 0.02 init
    alone gives nearly uniform distributions, where no filter bites)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**SMALL)).eval()
    with torch.no_grad():
        model.tok_embed.weight.mul_(sharpen)
    return model


def _prompts(n=6, t0=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL["vocab_size"], (n, t0), generator=g)


# --------------------------------------------------------------------------- rules
def test_rule_logits_are_what_sample_draws_from():
    logits = 3 * torch.randn(40, 30, generator=torch.Generator().manual_seed(0))
    rules = (dict(), dict(temperature=0.7, top_k=5), dict(top_p=0.8), dict(temperature=1.3, min_p=0.1),
             dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05))
    for rule in rules:
        want = logits / rule.get("temperature", 1.0)
        for key, f in (("top_k", top_k_filter), ("top_p", top_p_filter), ("min_p", min_p_filter)):
            want = f(want, rule[key]) if key in rule else want
        assert torch.equal(rule_logits(logits, **rule), want), rule
        drawn = sample(rule_logits(logits, **rule), generator=torch.Generator().manual_seed(1))
        want = sample(logits, generator=torch.Generator().manual_seed(1), **rule)
        assert torch.equal(drawn, want), rule
    greedy = rule_logits(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=0.0)
    assert torch.isfinite(greedy).tolist() == [[False, True, True, False]], "argmax and ties"


def test_entropy_bits():
    assert entropy_bits(torch.zeros(3, 16)).tolist() == pytest.approx([4.0] * 3)
    assert entropy_bits(torch.tensor([2.0, float("-inf"), float("-inf")])).item() == 0.0
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    assert entropy_bits(probs.log() + 7).item() == pytest.approx(1.75)
    assert entropy_bits(torch.randn(2, 5, 7)).shape == (2, 5)


# --------------------------------------------------------------------------- generation
@pytest.mark.parametrize("rule", [dict(top_p=0.9), dict(min_p=0.1), dict(temperature=0.0),
                                  dict(temperature=0.7, top_k=5)])
def test_generate_measured_is_generate_and_measures_what_it_drew(rule):
    model, prompts, new = _model().train(), _prompts(), 12
    tokens, stats = generate_measured(model, prompts, new, rule, seed=3)
    assert model.training, "the training flag comes back"
    want = model.generate(prompts, new, generator=torch.Generator().manual_seed(3), **rule)
    assert tokens.shape == (6, new) and stats.shape == (2, 6, new)
    assert torch.equal(tokens, want[:, prompts.shape[1]:])
    torch.testing.assert_close(stats[1], continuation_log2probs(model, prompts, tokens),
                               atol=1e-4, rtol=0)
    # the entropy of the rule's distribution, from a full pass over what was written
    with torch.no_grad():
        full = model(torch.cat([prompts, tokens], 1)[:, :-1])[0][:, prompts.shape[1] - 1:]
    want = entropy_bits(rule_logits(full, **rule))
    torch.testing.assert_close(stats[0], want, atol=1e-3, rtol=0)


def test_truncation_lowers_the_entropy_drawn_from():
    model, prompts = _model(), _prompts()
    pure = generate_measured(model, prompts, 12, dict())[1][0].mean()
    assert 2.0 < pure < 4.5, "the test model is neither uniform nor peaked"
    for rule in (dict(top_p=0.9), dict(min_p=0.1), dict(temperature=0.7)):
        assert generate_measured(model, prompts, 12, rule)[1][0].mean() < pure - 0.2, rule
    assert generate_measured(model, prompts, 12, dict(temperature=0.0))[1][0].abs().max() == 0


P = _prompts()  # (6, 4)


@pytest.mark.parametrize("call, message", [
    (lambda m: generate_measured(m, P[0], 3, {}), r"prompts must be integer ids \(N, t0\)"),
    (lambda m: generate_measured(m, P.float(), 3, {}), "prompts must be integer ids"),
    (lambda m: generate_measured(m, P, 0, {}), "new_tokens must be an integer >= 1"),
    (lambda m: generate_measured(m, P, 21, {}),
     r"\(4 tokens\) plus new_tokens \(21\) exceed max_len 24"),
    (lambda m: generate_measured(m, P, 3, dict(top_q=0.9)), "a rule is a dict with keys among"),
    (lambda m: generate_measured(m, P, 3, dict(temperature=-1)), "temperature must be a number"),
    (lambda m: generate_measured(m, P, 3, dict(min_p=0.0)), r"min_p must be a number in \(0, 1\]"),
    (lambda m: m.generate(P, 3, min_p=1.5), r"min_p must be a number in \(0, 1\]"),
    (lambda m: rule_logits(torch.randn(3, 5), temperature=-0.1), "temperature must be a number"),
    (lambda m: continuation_log2probs(m, P, P[:5]), r"tokens must be integer ids \(N=6"),
    (lambda m: beam_continuations(m, P, 3, beam_size=0), "beam_size must be an integer >= 1"),
    (lambda m: beam_continuations(m, P, 0), "new_tokens must be an integer >= 1"),
])
def test_generation_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(_model())


# --------------------------------------------------------------------------- beam
def test_beam_of_one_is_greedy_and_a_wider_beam_is_at_least_as_likely():
    model, prompts, new = _model(seed=1), _prompts(8), 10
    greedy = generate_measured(model, prompts, new, dict(temperature=0.0))[0]
    assert torch.equal(beam_continuations(model, prompts, new, beam_size=1), greedy)
    beam = beam_continuations(model, prompts, new, beam_size=4)
    assert beam.shape == (8, new)
    beam_bits = continuation_log2probs(model, prompts, beam).sum(1)
    greedy_bits = continuation_log2probs(model, prompts, greedy).sum(1)
    # not a theorem (greedy's path can fall out of the beam), but what a beam is for, and what it
    # does on this model; and the beam does find likelier text than greedy for some prompts
    assert (beam_bits >= greedy_bits - 1e-4).all()
    assert (beam_bits > greedy_bits + 0.1).any()


# --------------------------------------------------------------------------- real text
def test_validation_under_counts_bits_per_byte_and_drawable_targets():
    g = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(5, 7, 11, generator=g)
    targets = torch.randint(0, 11, (5, 7), generator=g)
    token_bytes = torch.randint(1, 4, (11,), generator=g)
    bits = -logits.log_softmax(-1).gather(-1, targets[..., None]).sum().item() / math.log(2)
    want = bits / token_bytes[targets].sum().item()
    bpb, drawable = validation_under(logits, targets, token_bytes, lambda z: z)
    assert bpb == pytest.approx(want, rel=1e-5) and drawable == 1.0
    chunked = validation_under(logits, targets, token_bytes, lambda z: z, chunk=2)
    assert chunked == (pytest.approx(bpb), 1.0)
    greedy = lambda z: rule_logits(z, temperature=0)  # noqa: E731
    bpb, drawable = validation_under(logits, targets, token_bytes, greedy)
    assert math.isinf(bpb)
    assert drawable == pytest.approx((logits.argmax(-1) == targets).float().mean().item())
    with pytest.raises(ValueError, match=r"logits must be \(n, T, V\)"):
        validation_under(logits[0], targets[0], token_bytes, lambda z: z)
    with pytest.raises(ValueError, match="must match"):
        validation_under(logits, targets[:, :3], token_bytes, lambda z: z)
    with pytest.raises(ValueError, match=r"token_bytes must be \(V=11,\)"):
        validation_under(logits, targets, token_bytes[:5], lambda z: z)
    with pytest.raises(ValueError, match="transform must keep the shape"):
        validation_under(logits, targets, token_bytes, lambda z: z[..., :3])


def _exact_sample(rows=12, vocab=6, c=1.0, seed=0):
    """Logits c · log p and targets whose frequencies are exactly p, row by row: the mean NLL
    under softmax(logits / τ) is then a cross-entropy against p, smallest at τ = c exactly."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 9, (rows, vocab), generator=g)
    logp = (counts / counts.sum(1, keepdim=True)).log()
    logits = [c * logp[i] + torch.randn((), generator=g)  # any shift per row
              for i in range(rows) for _ in range(counts[i].sum())]
    targets = [t for i in range(rows) for t in range(vocab) for _ in range(counts[i, t])]
    return torch.stack(logits), torch.tensor(targets)


def _nll(logits, targets, tau):
    return F.cross_entropy(logits.double().flatten(0, -2) / tau, targets.flatten()).item()


@pytest.mark.parametrize("c", [0.5, 1.0, 2.3])
def test_calibrated_temperature_recovers_the_scale(c):
    logits, targets = _exact_sample(c=c)
    assert abs(calibrated_temperature(logits, targets, tol=1e-3) - c) < 1e-3
    assert abs(calibrated_temperature(logits, targets, tol=1e-5) - c) < 1e-5


def test_calibrated_temperature_is_a_minimum_on_a_models_logits():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(4, 50, 17, generator=g)  # targets drawn at temperature 1.7
    probs = (logits / 1.7).softmax(-1).flatten(0, 1)
    targets = torch.multinomial(probs, 1, generator=g).view(4, 50)
    tau = calibrated_temperature(logits, targets)
    assert 1.2 < tau < 2.4, tau
    for other in (0.95 * tau, 1.05 * tau):
        assert _nll(logits, targets, other) >= _nll(logits, targets, tau)
    logits, targets = _exact_sample(c=6.0)
    assert abs(calibrated_temperature(logits, targets) - 4.0) < 1e-3, "the minimum is beyond hi"


def test_calibrated_temperature_bad_input():
    logits, targets = torch.randn(3, 4, 5), torch.randint(0, 5, (3, 4))
    with pytest.raises(ValueError, match="must match"):
        calibrated_temperature(logits, targets[:, :2])
    with pytest.raises(ValueError, match="0 < lo < hi"):
        calibrated_temperature(logits, targets, lo=2.0, hi=1.0)
    with pytest.raises(ValueError, match="logits must be finite"):
        calibrated_temperature(rule_logits(logits, top_k=2), targets)


# --------------------------------------------------------------------------- text metrics
PHRASE_9 = [30, 31, 32, 33, 34, 35, 36, 31, 32]  # like "the file is a string of the file is"
NO_REPEAT = list(range(100, 140))


def test_a_period_one_loop():
    row = [1, 2, 3] + [7] * 30
    assert ends_in_loop(row) and longest_repeated_suffix(row) == 29
    assert ends_in_loop([7] * 25) and not ends_in_loop([7] * 24), "24 tokens, each one p before"
    assert not ends_in_loop([7] * 5) and longest_repeated_suffix([7]) == 0
    assert rep_n([row]) == pytest.approx(1 - 4 / 30)  # 4-grams: 1237, 2377, 3777, 7777 (27 times)
    assert distinct_n([row]) == pytest.approx(4 / 32)
    assert text_stats([row])["repeated_suffix"] == pytest.approx(29 / 33)


def test_a_phrase_loop_of_period_nine():
    row = [1, 2, 3, 4] + PHRASE_9 * 5
    assert ends_in_loop(row) and not ends_in_loop(row, max_period=8)
    assert longest_repeated_suffix(row) == 4 * 9
    grams = len(row) - 3
    assert rep_n([row]) == pytest.approx(1 - (4 + 9) / grams)  # 4 through the start, then 9


def test_text_without_repetition():
    assert rep_n([NO_REPEAT]) == 0.0 and distinct_n([NO_REPEAT]) == 1.0
    assert not ends_in_loop(NO_REPEAT) and longest_repeated_suffix(NO_REPEAT) == 0
    stats = text_stats(torch.tensor([NO_REPEAT, NO_REPEAT[::-1]]))
    assert stats == dict(distinct2=pytest.approx(1.0), rep4=0.0, loops=0, repeated_suffix=0.0)


def test_a_period_fourteen_loop_escapes_ends_in_loop_but_not_the_repeated_suffix():
    phrase = list(range(50, 64))  # 14 distinct tokens, repeated 4 times
    row = [1, 2, 3] + phrase * 4
    assert not ends_in_loop(row, window=24, max_period=12), "periods above 12 are not looked for"
    assert ends_in_loop(row, window=24, max_period=14)
    assert longest_repeated_suffix(row) == 3 * 14
    stats = text_stats([row, NO_REPEAT])
    assert stats["loops"] == 0 and stats["repeated_suffix"] == pytest.approx((42 / 59) / 2)


def test_longest_repeated_suffix_equals_brute_force():
    def brute(row):
        n = len(row)
        return max((L for L in range(1, n) for j in range(n - L) if row[j:j + L] == row[n - L:]),
                   default=0)

    rng = random.Random(0)
    for _ in range(300):
        row = [rng.randrange(3) for _ in range(rng.randrange(0, 25))]
        assert longest_repeated_suffix(row) == brute(row), row
    assert longest_repeated_suffix(torch.tensor([4, 5, 4, 5, 4])) == 3, "overlap allowed"


def test_text_metrics_bad_input():
    with pytest.raises(ValueError, match="rep_n needs rows of >= 4 tokens, got one of 3"):
        rep_n([[1, 2, 3, 4, 5], [1, 2, 3]])
    with pytest.raises(ValueError, match="distinct_n needs a row of >= 2 tokens"):
        distinct_n([[1]])
    with pytest.raises(ValueError, match="rows is empty"):
        text_stats([])
    with pytest.raises(ValueError, match=r"rows must be \(N, L\)"):
        distinct_n(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        distinct_n([[1, 2, 3]], n=0)
