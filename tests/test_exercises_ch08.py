"""Chapter 8 checkers: each accepts correct answers and rejects typical mistakes with the right words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from checker_helpers import rejects, verdict
from tfm_course.attention import merge_heads, split_heads
from tfm_course.decoding import top_p_filter
from tfm_course.exercises import ch08
from tfm_course.models.transformer import attend_with_cache


# --------------------------------------------------------------------------- shifted loss
def loss_by_slicing(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def loss_by_hand(logits, ids):
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    return -logp.gather(-1, ids[:, 1:, None]).mean()


@pytest.mark.parametrize("fn", [loss_by_slicing, loss_by_hand], ids=["cross_entropy", "by hand"])
def test_shifted_loss_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch08.check_shifted_loss, fn, capsys)
    assert ok and "✅" in out


def _ce(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


LOSS_WRONG = {
    "no shift": (lambda lg, ids: _ce(lg, ids), "no shift"),
    "wrong way": (lambda lg, ids: _ce(lg[:, 1:], ids[:, :-1]), "shifted the wrong way"),
    "roll": (lambda lg, ids: _ce(lg, ids.roll(-1, 1)), "torch.roll wraps around"),
    "sum": (lambda lg, ids: F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]),
                                            ids[:, 1:].reshape(-1), reduction="sum"), "summed"),
    "raw logits": (lambda lg, ids: -lg[:, :-1].gather(-1, ids[:, 1:, None]).mean(), "no log-softmax"),
    "probabilities": (lambda lg, ids: -lg[:, :-1].softmax(-1).gather(-1, ids[:, 1:, None]).mean(),
                      "−*log* softmax"),
    "per position": (lambda lg, ids: F.cross_entropy(lg[:, :-1].transpose(1, 2), ids[:, 1:],
                                                     reduction="none"), "return one number"),
    "unflattened": (lambda lg, ids: F.cross_entropy(lg[:, :-1], ids[:, 1:]), "your function raised"),
}


@pytest.mark.parametrize("name", LOSS_WRONG)
def test_shifted_loss_checker_rejects_typical_mistakes(name, capsys):
    fn, message = LOSS_WRONG[name]
    rejects(ch08.check_shifted_loss, fn, message, capsys)


# --------------------------------------------------------------------------- temperature
def probs_with_temperature(logits, temperature):
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def test_temperature_checker_accepts_a_correct_answer(capsys):
    ok, out = verdict(ch08.check_temperature, probs_with_temperature, capsys)
    assert ok and "✅" in out


def _guarded(fn):
    """A mistake in the T > 0 branch of an otherwise right answer."""
    return lambda lg, t: probs_with_temperature(lg, t) if t == 0 else fn(lg, t)


TEMPERATURE_WRONG = {
    "multiplied": (_guarded(lambda lg, t: (lg * t).softmax(-1)), "multiplied the logits"),
    "after softmax": (_guarded(lambda lg, t: lg.softmax(-1) / t), "after the softmax"),
    "ignored": (_guarded(lambda lg, t: lg.softmax(-1)), "has no effect"),
    "wrong axis": (_guarded(lambda lg, t: (lg / t).softmax(0)), "wrong axis"),
    "logits": (_guarded(lambda lg, t: lg / t), "these are logits"),
    "unnormalised": (_guarded(lambda lg, t: (lg / t).exp()), "not normalised"),
    "zero divides": (lambda lg, t: (lg / t).softmax(-1), "temperature 0 gives NaN"),
}


@pytest.mark.parametrize("name", TEMPERATURE_WRONG)
def test_temperature_checker_rejects_typical_mistakes(name, capsys):
    fn, message = TEMPERATURE_WRONG[name]
    rejects(ch08.check_temperature, fn, message, capsys)


# --------------------------------------------------------------------------- top-p
def top_p_by_hand(logits, p):
    sorted_logits, order = logits.sort(-1, descending=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs
    out = torch.full_like(logits, float("-inf"))
    keep = before < p
    return out.scatter(-1, order, sorted_logits.masked_fill(~keep, float("-inf")))


@pytest.mark.parametrize("fn", [top_p_filter, top_p_by_hand], ids=["package", "by hand"])
def test_top_p_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch08.check_top_p, fn, capsys)
    assert ok and "✅" in out


def _variant(**kwargs):
    return lambda logits, p: ch08._top_p_variant(logits, p, **kwargs)


def _exclusive_but_never_empty(logits, p):
    out = ch08._top_p_variant(logits, p, inclusive=False)
    top = logits.argmax(-1, keepdim=True)
    return out.scatter(-1, top, logits.gather(-1, top))


TOP_P_WRONG = {
    "stops before p": (_exclusive_but_never_empty, "the token that crosses p is missing"),
    "empty rows": (_variant(inclusive=False), "a row has no token left"),
    "unsorted": (_variant(sort=False), "not sorted"),
    "cumulated logits": (_variant(of="logits"), "you accumulated logits"),
    "sorted order": (_variant(scatter=False), "the output is in sorted order"),
    "zero fill": (_variant(fill=0.0), "removed tokens got 0"),
    "probabilities": (lambda lg, p: top_p_filter(lg, p).softmax(-1), "differs from the expected"),
}


@pytest.mark.parametrize("name", TOP_P_WRONG)
def test_top_p_checker_rejects_typical_mistakes(name, capsys):
    fn, message = TOP_P_WRONG[name]
    rejects(ch08.check_top_p, fn, message, capsys)


# --------------------------------------------------------------------------- KV-cache step
def step_by_hand(attn, x, cache):
    q, k, v = (split_heads(p(x), attn.num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
    return attn.out_proj(merge_heads(weights @ v)), (k, v)


def step_with_sdpa(attn, x, cache):
    q, k, v = (split_heads(p(x), attn.num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    return attn.out_proj(merge_heads(F.scaled_dot_product_attention(q, k, v))), (k, v)


@pytest.mark.parametrize("fn", [step_with_sdpa, step_by_hand], ids=["sdpa", "by hand"])
def test_kv_cache_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch08.check_kv_cache_step, fn, capsys)
    assert ok and "✅" in out


@pytest.mark.parametrize("fn", [attend_with_cache, lambda attn, x, cache: attend_with_cache(attn, x, cache)],
                         ids=["the package function", "a wrapper around it"])
def test_kv_cache_checker_refuses_the_package_step(fn, capsys):
    rejects(ch08.check_kv_cache_step, fn, "calls the package's attend_with_cache", capsys)


def test_the_package_step_equals_full_causal_attention():
    attn = ch08._attention_layer(1, 16, 4)
    xs = torch.randn(3, 6, 16)
    cache, outs = None, []
    with torch.no_grad():
        for t in range(6):
            out, cache = attend_with_cache(attn, xs[:, t:t + 1], cache)
            outs.append(out)
        torch.testing.assert_close(torch.cat(outs, 1), attn(xs, is_causal=True), atol=1e-5, rtol=1e-5)


def _no_growth(attn, x, cache):
    out, new = step_by_hand(attn, x, cache)
    return out, (cache if cache is not None else new)


def _wrong_axis(attn, x, cache):
    out, _ = step_by_hand(attn, x, cache)
    k, v = (split_heads(p(x), attn.num_heads) for p in (attn.k_proj, attn.v_proj))
    if cache is None:
        return out, (k, v)
    return out, (torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1))


def _merged_heads(attn, x, cache):
    out, (k, v) = step_by_hand(attn, x, cache)
    return out, (merge_heads(k), merge_heads(v))


KV_WRONG = {
    "no self": (lambda a, x, c: ch08._step_variant(a, x, c, append=False), "does not attend to itself"),
    "causal mask": (lambda a, x, c: ch08._step_variant(a, x, c, mask_first=True), "a causal mask"),
    "no out_proj": (lambda a, x, c: ch08._step_variant(a, x, c, out_proj=False),
                    "output projection is missing"),
    "unscaled": (lambda a, x, c: ch08._step_variant(a, x, c, scale=False), "not scaled"),
    "cache not grown": (_no_growth, "did not grow"),
    "wrong axis": (_wrong_axis, "your function raised RuntimeError: Sizes of tensors must match"),
    "merged heads": (_merged_heads, "keep them split into heads"),
    "output only": (lambda a, x, c: step_by_hand(a, x, c)[0], "return a pair"),
}


@pytest.mark.parametrize("name", KV_WRONG)
def test_kv_cache_checker_rejects_typical_mistakes(name, capsys):
    fn, message = KV_WRONG[name]
    rejects(ch08.check_kv_cache_step, fn, message, capsys)
