"""Chapter 9 checkers: each accepts correct answers and rejects typical mistakes with the right words."""

from __future__ import annotations

import math

import pytest
import torch

from checker_helpers import rejects, verdict
from tfm_course.data.span_corruption import fill_spans, random_spans_noise_mask, span_corrupt
from tfm_course.exercises import ch09
from tfm_course.models.t5 import prefix_lm_mask
from tfm_course.positional import relative_position_bucket


def accepts(checker, fn, capsys) -> None:
    ok, out = verdict(checker, fn, capsys)
    assert ok and "✅" in out, out


# --------------------------------------------------------------------------- noise mask
def mask_by_hand(length, density, span, g, rounding=round, clamp=True, noise_first=False,
                 use_generator=True, per_token=False, equal_noise=False, even_kept=False):
    """T5's mask written plainly, with switches for the typical mistakes."""
    n_noise = rounding(length * density)
    if clamp:
        n_noise = min(max(n_noise, 1), length - 1)
    if n_noise == 0:
        return torch.zeros(length, dtype=torch.bool)
    n_spans = n_noise if per_token else max(1, round(n_noise / span))
    gen = g if use_generator else None

    def split(n, k, at_random):
        if not at_random:
            return [n // k + (i < n % k) for i in range(k)]
        cuts = sorted((torch.randperm(n - 1, generator=gen)[: k - 1] + 1).tolist())
        return [b - a for a, b in zip([0] + cuts, cuts + [n])]

    noise = split(n_noise, n_spans, not equal_noise)
    kept = split(length - n_noise, n_spans, not even_kept)
    mask = []
    for k, n in zip(kept, noise):
        mask += [True] * n + [False] * k if noise_first else [False] * k + [True] * n
    return torch.tensor(mask, dtype=torch.bool)


@pytest.mark.parametrize("fn", [random_spans_noise_mask, mask_by_hand], ids=["package", "by hand"])
def test_noise_mask_checker_accepts_correct_answers(fn, capsys):
    accepts(ch09.check_noise_mask, fn, capsys)


NOISE_WRONG = {
    "bernoulli": (lambda L, d, s, g: torch.rand(L, generator=g) < d, "does not flip each token"),
    "truncated": (lambda L, d, s, g: mask_by_hand(L, d, s, g, rounding=int), "you truncated"),
    "no clamp": (lambda L, d, s, g: mask_by_hand(L, d, s, g, clamp=False), "clamp"),
    "noise first": (lambda L, d, s, g: mask_by_hand(L, d, s, g, noise_first=True), "starts with noise"),
    "global rng": (lambda L, d, s, g: mask_by_hand(L, d, s, g, use_generator=False),
                   "same seed gives different"),
    "deterministic": (lambda L, d, s, g: mask_by_hand(L, d, s, g, equal_noise=True, even_kept=True),
                      "every seed gives the same mask"),
    "one span per token": (lambda L, d, s, g: mask_by_hand(L, d, s, g, per_token=True), "its own span"),
    "equal spans": (lambda L, d, s, g: mask_by_hand(L, d, s, g, equal_noise=True), "same length"),
    "even kept": (lambda L, d, s, g: mask_by_hand(L, d, s, g, even_kept=True), "kept tokens between"),
    "int mask": (lambda L, d, s, g: mask_by_hand(L, d, s, g).long(), "bool tensor"),
    "wrong length": (lambda L, d, s, g: mask_by_hand(L, d, s, g)[:-1], "has shape"),
    "crashes": (lambda L, d, s, g: torch.randperm(-1), "your function raised RuntimeError"),
}


@pytest.mark.parametrize("name", NOISE_WRONG)
def test_noise_mask_checker_rejects_typical_mistakes(name, capsys):
    fn, message = NOISE_WRONG[name]
    rejects(ch09.check_noise_mask, fn, message, capsys)


# --------------------------------------------------------------------------- span corruption
def corrupt_by_hand(ids, mask, sentinels, eos, per_token=False, same=False, order=1, eos_on=True,
                    target_sentinels=True, closing="t5", keep_noise=False):
    """Inputs: kept tokens and one sentinel per noise span; targets: sentinel + span per span."""
    ids, mask = ids.tolist(), mask.tolist()
    sent = list(sentinels)[::order]
    inputs, targets, k = [], [], -1
    for i, (token, noise) in enumerate(zip(ids, mask)):
        starts = noise and (per_token or i == 0 or not mask[i - 1])
        if starts:
            k += 1
            s = sent[0] if same else sent[k]
            inputs.append(s)
            if target_sentinels:
                targets.append(s)
        if noise:
            targets.append(token)
            if keep_noise:
                inputs.append(token)
        else:
            inputs.append(token)
    ends_kept = not mask[-1]
    if target_sentinels and (closing == "always" or (closing == "t5" and ends_kept)):
        targets.append(sent[k + 1])
    if eos_on:
        inputs, targets = inputs + [eos], targets + [eos]
    return inputs, targets


@pytest.mark.parametrize("fn", [lambda ids, m, s, e: span_corrupt(ids, s, e, m), corrupt_by_hand],
                         ids=["package", "by hand"])
def test_span_corrupt_checker_accepts_correct_answers(fn, capsys):
    accepts(ch09.check_span_corrupt, fn, capsys)


CORRUPT_WRONG = {
    "per token": (dict(per_token=True), "each noise *token* got a sentinel"),
    "same sentinel": (dict(same=True), "every span got the same sentinel"),
    "reversed order": (dict(order=-1), "wrong order"),
    "no eos": (dict(eos_on=False), "EOS is missing"),
    "no target sentinels": (dict(target_sentinels=False), "the target has no sentinels"),
    "no closing sentinel": (dict(closing="never"), "closes with one more sentinel"),
    "always a closing sentinel": (dict(closing="always"), "adds a closing sentinel"),
    "keeps noise in input": (dict(keep_noise=True), "still holds the dropped tokens"),
}


@pytest.mark.parametrize("name", CORRUPT_WRONG)
def test_span_corrupt_checker_rejects_typical_mistakes(name, capsys):
    switches, message = CORRUPT_WRONG[name]
    rejects(ch09.check_span_corrupt, lambda ids, m, s, e: corrupt_by_hand(ids, m, s, e, **switches),
            message, capsys)


def test_span_corrupt_checker_rejects_swapped_and_malformed(capsys):
    rejects(ch09.check_span_corrupt, lambda ids, m, s, e: corrupt_by_hand(ids, m, s, e)[::-1],
            "swapped", capsys)
    rejects(ch09.check_span_corrupt, lambda ids, m, s, e: corrupt_by_hand(ids, m, s, e)[0],
            "return a pair", capsys)
    rejects(ch09.check_span_corrupt, lambda ids, m, s, e: (torch.zeros(2, 2), torch.zeros(3)),
            "1-D tensor", capsys)


# --------------------------------------------------------------------------- filling back
def fill_by_hand(inputs, targets, sentinels, eos, keep_eos=False, keep_sentinel=False,
                 span_before=False):
    spans, current, pending = {}, None, []
    for t in targets:
        if t == eos:
            break
        if t in sentinels:
            if span_before:  # wrong: a span is taken to end at its sentinel
                spans[t], pending = pending, []
                continue
            current = t
            spans[t] = []
        elif span_before:
            pending.append(t)
        else:
            spans[current].append(t)
    out = []
    for t in inputs:
        if t == eos and not keep_eos:
            break
        if t in spans:
            out += ([t] if keep_sentinel else []) + spans[t]
        else:
            out.append(t)
    return out


@pytest.mark.parametrize("fn", [fill_spans, fill_by_hand], ids=["package", "by hand"])
def test_fill_spans_checker_accepts_correct_answers(fn, capsys):
    accepts(ch09.check_fill_spans, fn, capsys)


FILL_WRONG = {
    "keeps eos": (lambda i, t, s, e: fill_by_hand(i, t, s, e, keep_eos=True), "EOS is still there"),
    "no filling": (lambda i, t, s, e: list(i), "nothing was filled in"),
    "keeps sentinels": (lambda i, t, s, e: fill_by_hand(i, t, s, e, keep_sentinel=True),
                        "sentinels are left"),
    "spans read before their sentinel": (lambda i, t, s, e: fill_by_hand(i, t, s, e, span_before=True),
                                         "expected"),
    "a float tensor": (lambda i, t, s, e: torch.tensor(fill_spans(i, t, s, e), dtype=torch.float),
                       "integer ids"),
}


@pytest.mark.parametrize("name", FILL_WRONG)
def test_fill_spans_checker_rejects_typical_mistakes(name, capsys):
    fn, message = FILL_WRONG[name]
    rejects(ch09.check_fill_spans, fn, message, capsys)


# --------------------------------------------------------------------------- position buckets
def buckets_package(n_q, n_k, bidirectional):
    query = torch.arange(n_k - n_q, n_k)
    return relative_position_bucket(torch.arange(n_k)[None] - query[:, None], bidirectional, 32, 128)


def buckets_by_hand(n_q, n_k, bidirectional, sign=1, offset=True, clamp=True, transpose=False):
    """T5's bucket from scratch, on the (query, key) grid."""
    start = n_k - n_q if offset else 0
    rel = sign * (torch.arange(n_k)[None] - torch.arange(start, start + n_q)[:, None])
    n = 32
    out = torch.zeros_like(rel)
    if bidirectional:
        n //= 2
        out += (rel > 0).long() * n
        dist = rel.abs()
    else:
        dist = (-rel).clamp(min=0)
    exact = n // 2
    scaled = torch.log(dist.clamp(min=1).float() / exact) / math.log(128 / exact) * (n - exact)
    large = exact + scaled.long()
    if clamp:
        large = large.clamp(max=n - 1)
    out = out + torch.where(dist < exact, dist, large)
    return out.T if transpose else out


@pytest.mark.parametrize("fn", [buckets_package, buckets_by_hand], ids=["package", "by hand"])
def test_position_bucket_checker_accepts_correct_answers(fn, capsys):
    accepts(ch09.check_position_buckets, fn, capsys)


BUCKET_WRONG = {
    "sign": (dict(sign=-1), "the sign is reversed"),
    "no offset": (dict(offset=False), "the *last*"),
    "no clamp": (dict(clamp=False), "must lie in 0..31"),
    "transposed": (dict(transpose=True), "rows and columns swapped"),
}


@pytest.mark.parametrize("name", BUCKET_WRONG)
def test_position_bucket_checker_rejects_typical_mistakes(name, capsys):
    switches, message = BUCKET_WRONG[name]
    rejects(ch09.check_position_buckets, lambda q, k, b: buckets_by_hand(q, k, b, **switches),
            message, capsys)


def test_position_bucket_checker_rejects_ignored_direction_and_floats(capsys):
    rejects(ch09.check_position_buckets, lambda q, k, b: buckets_package(q, k, True),
            "bidirectional is ignored", capsys)
    rejects(ch09.check_position_buckets, lambda q, k, b: buckets_package(q, k, b).float(),
            "torch.long", capsys)


# --------------------------------------------------------------------------- prefix-LM mask
def prefix_by_hand(seq_len, prefix_len):
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    return (j <= i) | (j < prefix_len)


@pytest.mark.parametrize("fn", [prefix_lm_mask, prefix_by_hand], ids=["package", "by hand"])
def test_prefix_lm_checker_accepts_correct_answers(fn, capsys):
    accepts(ch09.check_prefix_lm_mask, fn, capsys)


def _grid(n):
    return torch.arange(n)[:, None], torch.arange(n)[None, :]


PREFIX_WRONG = {
    "inverted": (lambda n, p: ~prefix_by_hand(n, p), "swapped"),
    "transposed": (lambda n, p: prefix_by_hand(n, p).T, "transposed"),
    "causal only": (lambda n, p: torch.ones(n, n, dtype=torch.bool).tril(), "that is the causal mask"),
    "all visible": (lambda n, p: torch.ones(n, n, dtype=torch.bool), "must not read the future"),
    "prefix rows see all": (lambda n, p: (lambda i, j: (j <= i) | (i < p))(*_grid(n)), "the prefix queries"),
    "off by one": (lambda n, p: (lambda i, j: (j <= i) | (j <= p))(*_grid(n)), "off by one"),
    "int mask": (lambda n, p: prefix_by_hand(n, p).long(), "should be bool"),
}


@pytest.mark.parametrize("name", PREFIX_WRONG)
def test_prefix_lm_checker_rejects_typical_mistakes(name, capsys):
    fn, message = PREFIX_WRONG[name]
    rejects(ch09.check_prefix_lm_mask, fn, message, capsys)
