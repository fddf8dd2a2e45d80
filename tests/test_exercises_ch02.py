"""Chapter 2 checkers: each accepts the reference and rejects typical mistakes with the right words."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from checker_helpers import rejects, verdict
from tfm_course.exercises import ch02
from tfm_course.positional import (
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    relative_position_bucket,
    rotate_half,
    sinusoidal_encoding,
)


CHECKERS = [ch02.check_sinusoidal, ch02.check_rope, ch02.check_alibi, ch02.check_relative_bucket]


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.__name__)
def test_checkers_report_a_crash_in_words(checker, capsys):
    def crashes(*args, **kwargs):
        return torch.zeros(2) @ torch.zeros(3)

    ok, out = verdict(checker, crashes, capsys)
    assert not ok and "your function raised RuntimeError" in out


# --------------------------------------------------------------------------- sinusoidal
def sinusoidal_loop(max_len, d):
    pe = torch.zeros(max_len, d)
    for p in range(max_len):
        for i in range(d // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / d))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d))
    return pe


@pytest.mark.parametrize("fn", [sinusoidal_encoding, sinusoidal_loop], ids=["package", "loop"])
def test_sinusoidal_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch02.check_sinusoidal, fn, capsys)
    assert ok and "✅" in out


def _table(max_len, d, pair_exponent=2.0, odd_own_index=False, swap=False):
    p = torch.arange(max_len, dtype=torch.float32)[:, None]
    i = torch.arange(d // 2, dtype=torch.float32)
    even = p / 10000 ** (pair_exponent * i / d)
    odd = p / 10000 ** ((2 * i + 1) / d) if odd_own_index else even
    pe = torch.zeros(max_len, d)
    pe[:, 0::2], pe[:, 1::2] = (torch.cos(even), torch.sin(odd)) if swap else (torch.sin(even), torch.cos(odd))
    return pe


def _concatenated(max_len, d):
    p = torch.arange(max_len, dtype=torch.float32)[:, None]
    omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    return torch.cat((torch.sin(p * omega), torch.cos(p * omega)), dim=-1)


SINUSOIDAL_WRONG = {
    "sin/cos swapped": (lambda m, d: _table(m, d, swap=True), "sin and cos are swapped"),
    "exponent i instead of 2i": (lambda m, d: _table(m, d, pair_exponent=1.0), "not i/d_model"),
    "cos uses its own index": (lambda m, d: _table(m, d, odd_own_index=True), "share one frequency"),
    "[sin | cos] halves": (_concatenated, "tensor2tensor layout"),
    "transposed": (lambda m, d: sinusoidal_encoding(m, d).T, "is (d_model, max_len)"),
    "integer table": (lambda m, d: sinusoidal_encoding(m, d).long(), "must be floating point"),
    "base 1000": (lambda m, d: sinusoidal_encoding(m, d, base=1000.0), "off by up to"),
}


@pytest.mark.parametrize("name", SINUSOIDAL_WRONG)
def test_sinusoidal_checker_rejects_typical_mistakes(name, capsys):
    fn, message = SINUSOIDAL_WRONG[name]
    rejects(ch02.check_sinusoidal, fn, message, capsys)


# --------------------------------------------------------------------------- RoPE
def rope_halves(x):
    d = x.shape[-1]
    theta = 10000 ** (-torch.arange(0, d, 2).float() / d)
    angle = torch.arange(x.shape[-2]).float()[:, None] * theta
    angle = torch.cat((angle, angle), -1)
    return x * angle.cos() + rotate_half(x) * angle.sin()


@pytest.mark.parametrize("fn", [lambda x: RotaryEmbedding(x.shape[-1]).rotate(x), rope_halves],
                         ids=["package", "from scratch"])
def test_rope_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch02.check_rope, fn, capsys)
    assert ok and "✅" in out


def rope_variant(x, adjacent=False, sign=1.0, exponent=2.0, start=0, reverse=False):
    d, n = x.shape[-1], x.shape[-2]
    theta = 10000 ** (-exponent * torch.arange(d // 2).float() / d)
    pos = torch.arange(n).float() + start
    angle = sign * (pos.flip(0) if reverse else pos)[:, None] * theta
    if adjacent:
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = even * angle.cos() - odd * angle.sin()
        out[..., 1::2] = even * angle.sin() + odd * angle.cos()
        return out
    angle = torch.cat((angle, angle), -1)
    return x * angle.cos() + rotate_half(x) * angle.sin()


ROPE_WRONG = {
    "adjacent pairs": (lambda x: rope_variant(x, adjacent=True), "adjacent pairs"),
    "rotated by -θ": (lambda x: rope_variant(x, sign=-1.0), "rotated the wrong way"),
    "exponent i instead of 2i": (lambda x: rope_variant(x, exponent=1.0), "fall too slowly"),
    "positions start at 1": (lambda x: rope_variant(x, start=1), "positions start at 1"),
    "positions reversed": (lambda x: rope_variant(x, reverse=True), "positions run backwards"),
    "rotates nothing": (lambda x: x.clone(), "off by up to"),
    "half precision": (lambda x: rope_halves(x).half(), "keep the input's dtype"),
    "also rotates batch dim": (lambda x: rope_halves(x)[0], "expected (2, 3, 5, 8)"),
}


@pytest.mark.parametrize("name", ROPE_WRONG)
def test_rope_checker_rejects_typical_mistakes(name, capsys):
    fn, message = ROPE_WRONG[name]
    rejects(ch02.check_rope, fn, message, capsys)


# --------------------------------------------------------------------------- ALiBi
def alibi_from_scratch(h, n):
    def power_of_2(k):
        return [2 ** (-8 / k * i) for i in range(1, k + 1)]

    closest = 2 ** int(math.log2(h))
    slopes = power_of_2(closest) + power_of_2(2 * closest)[0::2][: h - closest]
    pos = torch.arange(n)
    distance = (pos[:, None] - pos[None, :]).abs()
    return -(torch.tensor(slopes)[:, None, None] * distance)[None]


@pytest.mark.parametrize("fn", [alibi_bias, alibi_from_scratch], ids=["package", "from scratch"])
def test_alibi_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch02.check_alibi, fn, capsys)
    assert ok and "✅" in out


def _with_slopes(slopes_fn):
    def fn(h, n):
        pos = torch.arange(n)
        return -(slopes_fn(h)[:, None, None] * (pos[:, None] - pos[None, :]).abs())[None]
    return fn


def _signed(h, n):
    pos = torch.arange(n)
    return -(alibi_slopes(h)[:, None, None] * (pos[:, None] - pos[None, :]))[None]


def _causal_only(h, n, above=0.0):
    """The paper's causal form: -slope·(i - j) for keys j <= i, ``above`` for future keys."""
    pos = torch.arange(n)
    bias = -(alibi_slopes(h)[:, None, None] * (pos[:, None] - pos[None, :]).float())[None]
    return bias.masked_fill(pos[None, :] > pos[:, None], above)


def _key_position_only(h, n, one_row=False, masked=False):
    """The ALiBi authors' code: slope·j, the key position alone (optionally one row for all queries)."""
    bias = (alibi_slopes(h)[:, None, None] * torch.arange(n))[None]  # (1, h, 1, n)
    if one_row:
        return bias
    bias = bias.expand(1, h, n, n)
    pos = torch.arange(n)
    return bias.masked_fill(pos[None, :] > pos[:, None], -math.inf) if masked else bias


ALIBI_WRONG = {
    "positive bias": (lambda h, n: -alibi_bias(h, n), "the sign is flipped"),
    "slopes reversed": (_with_slopes(lambda h: alibi_slopes(h).flip(0)), "reverse order"),
    "first slope 1": (_with_slopes(lambda h: torch.tensor([2 ** (-8 / h * i) for i in range(h)])),
                      "one step too early"),
    "naive non-power-of-2": (_with_slopes(lambda h: torch.tensor([2 ** (-8 / h * i) for i in range(1, h + 1)])),
                             "6 is not a power of 2"),
    "signed distance": (_signed, "above the diagonal your bias is positive"),
    "no batch dim": (lambda h, n: alibi_bias(h, n)[0], "add a leading batch dim"),
    "integer distances": (lambda h, n: alibi_bias(h, n).long(), "must be floating point"),
    "paper's causal form, zeros above": (_causal_only, "you put zeros"),
    "paper's causal form, -inf above": (functools.partial(_causal_only, above=-math.inf),
                                        "you put −inf (the causal mask itself)"),
    "key position only": (_key_position_only, "slope·j, the key position alone"),
    "key position only, one row": (functools.partial(_key_position_only, one_row=True),
                                   "slope·j, the key position alone"),
    "key position only, masked": (functools.partial(_key_position_only, masked=True),
                                  "slope·j, the key position alone"),
}


@pytest.mark.parametrize("name", ALIBI_WRONG)
def test_alibi_checker_rejects_typical_mistakes(name, capsys):
    fn, message = ALIBI_WRONG[name]
    rejects(ch02.check_alibi, fn, message, capsys)


@pytest.mark.parametrize("fn", [_causal_only, functools.partial(_causal_only, above=-math.inf),
                                _key_position_only, functools.partial(_key_position_only, one_row=True)],
                         ids=["causal zeros", "causal -inf", "key only", "key only, one row"])
def test_alibi_checker_explains_why_a_causal_form_is_not_the_answer(fn, capsys):
    """The paper's causal forms are right under a causal mask: the message says so, and says what is asked."""
    ok, out = verdict(ch02.check_alibi, fn, capsys)
    assert not ok
    assert "causal mask" in out and "symmetric bias −slope·|i − j|" in out and "without a causal mask" in out, out


def test_the_causal_forms_attend_like_alibi_under_a_causal_mask():
    """What the message claims: under a causal mask each causal form gives ALiBi's attention weights."""
    h, n = 8, 6
    scores = torch.randn(1, h, n, n, generator=torch.Generator().manual_seed(0))
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    want = torch.softmax((scores + alibi_bias(h, n)).masked_fill(future, -math.inf), -1)
    for bias in (_causal_only(h, n), _causal_only(h, n, above=-math.inf), _key_position_only(h, n),
                 _key_position_only(h, n, one_row=True)):
        got = torch.softmax((scores + bias).masked_fill(future, -math.inf), -1)
        assert torch.allclose(got, want, atol=1e-6)


# --------------------------------------------------------------------------- T5 buckets
def bucket_from_scratch(rel, bidirectional, num_buckets, max_distance, log_step=torch.floor,
                        clamp=True, logarithmic=True):
    """T5's bucket, written out; the keyword arguments switch in the typical mistakes below."""
    out = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = torch.clamp(-rel, min=0)
    if not logarithmic:
        return out + n.clamp(max=num_buckets - 1)
    exact = num_buckets // 2
    large = exact + log_step(torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                             * (num_buckets - exact)).long()
    return out + torch.where(n < exact, n, large.clamp(max=num_buckets - 1) if clamp else large)


@pytest.mark.parametrize("fn", [relative_position_bucket, bucket_from_scratch], ids=["package", "from scratch"])
def test_bucket_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch02.check_relative_bucket, fn, capsys)
    assert ok and "✅" in out


# The golden values of /work/shared/specs/pretraining-objectives.md (32 buckets, max_distance 128),
# also asserted in chapter 2 and by the T5 model's tests: relative position -> bucket.
GOLDEN_BIDIRECTIONAL = {-200: 15, -64: 14, -32: 12, -16: 10, -8: 8, -7: 7, 0: 0, 1: 17, 7: 23, 8: 24,
                        16: 26, 32: 28, 64: 30, 127: 31, 128: 31, 500: 31}
GOLDEN_CAUSAL = {0: 0, 3: 0, -1: 1, -15: 15, -16: 16, -32: 21, -64: 26, -128: 31, -500: 31}


@pytest.mark.parametrize("fn", [relative_position_bucket, bucket_from_scratch], ids=["package", "from scratch"])
def test_buckets_match_the_golden_values(fn):
    for bidirectional, golden in ((True, GOLDEN_BIDIRECTIONAL), (False, GOLDEN_CAUSAL)):
        rel = torch.tensor(list(golden))
        got = fn(rel, bidirectional, 32, 128)
        assert got.tolist() == list(golden.values()), (bidirectional, got.tolist())


BUCKET_WRONG = {
    "query minus key": (lambda r, b, n, m: relative_position_bucket(-r, b, n, m), "sign convention is reversed"),
    "num_buckets not halved": (lambda r, b, n, m: relative_position_bucket(r, b, 2 * n if b else n, m),
                               "split in two halves"),
    "rounded log": (functools.partial(bucket_from_scratch, log_step=torch.round), "do not round it"),
    "not clamped": (functools.partial(bucket_from_scratch, clamp=False), "does not exist"),
    "linear, no log": (functools.partial(bucket_from_scratch, logarithmic=False), "logarithmically"),
    "float buckets": (lambda r, b, n, m: relative_position_bucket(r, b, n, m).float(), "return integers"),
    "offset for r >= 0": (lambda r, b, n, m: relative_position_bucket(r, b, n, m) + (b and 1) * (r == 0) * (n // 2),
                          "relative position 0 is bucket 0"),
    "causal with |r|": (lambda r, b, n, m: relative_position_bucket(r, b, n, m) if b else
                        relative_position_bucket(-r.abs(), False, n, m), "not its absolute value"),
}


@pytest.mark.parametrize("name", BUCKET_WRONG)
def test_bucket_checker_rejects_typical_mistakes(name, capsys):
    fn, message = BUCKET_WRONG[name]
    rejects(ch02.check_relative_bucket, fn, message, capsys)


# --------------------------------------------------------------------------- the chapter's solutions
def test_the_solutions_shown_in_the_chapter_pass_their_checkers(capsys):
    import re
    from pathlib import Path

    chapter = Path(__file__).resolve().parent.parent / "chapters" / "02-positional-encoding.md"
    blocks = re.findall(r":class: dropdown\n```python\n(.*?)```", chapter.read_text(encoding="utf-8"), re.S)
    namespace = {"torch": torch, "math": math}
    for block in blocks:
        exec(block, namespace)
    checks = {"my_sinusoidal": ch02.check_sinusoidal, "my_rope": ch02.check_rope,
              "my_alibi": ch02.check_alibi, "my_bucket": ch02.check_relative_bucket}
    for name, checker in checks.items():
        ok, out = verdict(checker, namespace[name], capsys)
        assert ok, (name, out)
