"""Chapter 1 checkers: each accepts the reference and rejects typical mistakes with the right words."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as imported_sdpa

from checker_helpers import rejects, verdict
from tfm_course.attention import (
    causal_mask,
    fused_attention,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
)
from tfm_course.exercises import ch01


# --------------------------------------------------------------------------- causal mask
@pytest.mark.parametrize("fn", [causal_mask, lambda n: ~torch.ones(n, n, dtype=torch.bool).triu(1)],
                         ids=["package", "not-triu"])
def test_causal_mask_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch01.check_causal_mask, fn, capsys)
    assert ok and "✅" in out


CAUSAL_WRONG = {
    "upper triangle": (lambda n: torch.ones(n, n, dtype=torch.bool).triu(), "transposed"),
    "reversed": (lambda n: torch.ones(n, n, dtype=torch.bool).triu(1), "mask convention reversed"),
    "no diagonal": (lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1), "diagonal is missing"),
    "float 0/1": (lambda n: torch.ones(n, n).tril(), "must be a bool tensor"),
    "wrong shape": (lambda n: torch.ones(n, n + 1, dtype=torch.bool).tril(), "expected (5, 5)"),
    "all True": (lambda n: torch.ones(n, n, dtype=torch.bool), "query i may attend keys 0..i"),
    "crashes": (lambda n: torch.ones(n).tril(), "your function raised RuntimeError"),
}


@pytest.mark.parametrize("name", CAUSAL_WRONG)
def test_causal_mask_checker_rejects_typical_mistakes(name, capsys):
    fn, message = CAUSAL_WRONG[name]
    rejects(ch01.check_causal_mask, fn, message, capsys)


# --------------------------------------------------------------------------- padding mask
def test_padding_mask_checker_accepts_the_reference(capsys):
    ok, out = verdict(ch01.check_padding_mask, padding_mask, capsys)
    assert ok and "✅" in out
    ok, _ = verdict(ch01.check_padding_mask,
                    lambda lengths, max_len: torch.arange(max_len)[None, :] < lengths[:, None], capsys)
    assert ok


PADDING_WRONG = {
    "reversed": (lambda lengths, m: torch.arange(m) >= lengths[:, None], "mask convention reversed"),
    "off by one": (lambda lengths, m: torch.arange(m) <= lengths[:, None], "off by one"),
    "transposed": (lambda lengths, m: (torch.arange(m) < lengths[:, None]).T, "(max_len, batch)"),
    "ignores max_len": (lambda lengths, m: torch.arange(int(lengths.max())) < lengths[:, None],
                        "pad to max_len=5, not to the longest length 4"),
    "broadcast dims added": (lambda lengths, m: (torch.arange(m) < lengths[:, None])[:, None, None, :],
                             "broadcasting dims are added where it is used"),
    "float": (lambda lengths, m: (torch.arange(m) < lengths[:, None]).float(),
              "the pattern is right: add .bool()"),
    "left padding": (lambda lengths, m: torch.arange(m).flip(0) < lengths[:, None], "pads on the right"),
}


@pytest.mark.parametrize("name", PADDING_WRONG)
def test_padding_mask_checker_rejects_typical_mistakes(name, capsys):
    fn, message = PADDING_WRONG[name]
    rejects(ch01.check_padding_mask, fn, message, capsys)


# --------------------------------------------------------------------------- masked softmax
def _fill_softmax(fill, zero_empty: bool = False, dim: int = -1, reverse: bool = False,
                  upcast: bool = False):
    """The usual way of writing a masked softmax, with knobs for the usual mistakes."""

    def fn(scores, mask):
        mask = ~mask if reverse else mask
        value = torch.finfo(scores.dtype).min if fill == "finfo" else fill
        weights = torch.softmax(scores.masked_fill(~mask, value), dim=dim)
        if zero_empty:
            weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
        return weights.float() if upcast else weights

    return fn


def test_masked_softmax_checker_accepts_correct_answers(capsys):
    ok, out = verdict(ch01.check_masked_softmax, masked_softmax, capsys)
    assert ok and "✅" in out
    ok, _ = verdict(ch01.check_masked_softmax, _fill_softmax("finfo", zero_empty=True), capsys)
    assert ok, "finfo.min + zeroed empty rows in the input dtype is right too"


SOFTMAX_WRONG = {
    "-inf": (_fill_softmax(float("-inf")), "NaN on a fully masked row"),
    "finfo.min, empty rows uniform": (_fill_softmax("finfo"), "uniform 1/n_k"),
    "-1e9 with the empty-row fix": (_fill_softmax(-1e9, zero_empty=True), "-1e9 does not fit in fp16"),
    "reversed": (_fill_softmax("finfo", zero_empty=True, reverse=True), "mask convention reversed"),
    "wrong axis": (_fill_softmax("finfo", zero_empty=True, dim=-2), "softmax over the wrong axis"),
    "mask ignored": (lambda s, m: torch.softmax(s, -1), "the mask was ignored"),
    "fill too small": (_fill_softmax(-2.0, zero_empty=True), "blocked keys get weight"),
    "upcast": (_fill_softmax("finfo", zero_empty=True, upcast=True), "keep the scores' dtype"),
}


@pytest.mark.parametrize("name", SOFTMAX_WRONG)
def test_masked_softmax_checker_rejects_typical_mistakes(name, capsys):
    fn, message = SOFTMAX_WRONG[name]
    rejects(ch01.check_masked_softmax, fn, message, capsys)


# --------------------------------------------------------------------------- attention
def _attention(scale="sqrt_dk", fill="finfo", zero_empty=True, dim=-1, reverse=False,
               ignore_mask=False, upcast=False, return_weights=False, scale_after=False):
    """A from-scratch attention with knobs for the usual mistakes."""

    def fn(q, k, v, mask=None):
        d_k, d_v = q.shape[-1], v.shape[-1]
        factor = {"sqrt_dk": 1 / math.sqrt(d_k), "none": 1.0, "dk": 1 / d_k,
                  "times": math.sqrt(d_k), "sqrt_dv": 1 / math.sqrt(d_v)}[scale]
        if scale_after:  # q kᵀ first, in the input dtype: overflows fp16 for large scores
            scores = (q @ k.transpose(-2, -1)) * factor
        else:
            scores = (q * factor) @ k.transpose(-2, -1)
        if mask is not None and not ignore_mask:
            mask = ~mask if reverse else mask
            value = torch.finfo(scores.dtype).min if fill == "finfo" else fill
            scores = scores.masked_fill(~mask, value)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and zero_empty and not ignore_mask:
            weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
        out = weights @ v
        out = out.float() if upcast else out
        return (out, weights) if return_weights else out

    return fn


def _float32_scores(q, k, v, mask=None):
    """Right too: scores and softmax in float32, output cast back."""
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return (weights @ v.float()).to(v.dtype)


@pytest.mark.parametrize("fn", [scaled_dot_product_attention, _attention(), _float32_scores],
                         ids=["package", "from-scratch", "float32-scores"])
def test_attention_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch01.check_scaled_dot_product_attention, fn, capsys)
    assert ok and "✅" in out


def _zero_empty_rows(out, mask):
    """What a reader adds to F.scaled_dot_product_attention so that every case would pass."""
    return out if mask is None else out.masked_fill(~mask.any(-1, keepdim=True), 0.0).nan_to_num(0.0)


SDPA_CALLS = {  # each is otherwise right: only calling PyTorch's kernel gives it away
    "F.scaled_dot_product_attention": lambda q, k, v, mask=None: _zero_empty_rows(
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask), mask),
    "imported under another name": lambda q, k, v, mask=None: _zero_empty_rows(
        imported_sdpa(q, k, v, attn_mask=mask), mask),
    "torch._C._nn": lambda q, k, v, mask=None: _zero_empty_rows(
        torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask), mask),
    "torch.ops.aten": lambda q, k, v, mask=None: _zero_empty_rows(
        torch.ops.aten.scaled_dot_product_attention(q, k, v, attn_mask=mask), mask),
    "the package's fused_attention": fused_attention,
}


@pytest.mark.parametrize("name", SDPA_CALLS)
def test_attention_checker_refuses_pytorchs_kernel(name, capsys):
    rejects(ch01.check_scaled_dot_product_attention, SDPA_CALLS[name],
            "calls PyTorch's F.scaled_dot_product_attention", capsys)


def test_refused_kernel_calls_would_otherwise_pass(capsys, monkeypatch):
    """The refusal is the only thing wrong with them: with the detection switched off, they pass."""
    monkeypatch.setattr(ch01, "_without_pytorch_sdpa",
                        lambda fn, *args: ch01.attempt(ch01._with_overflow_hint, fn, *args))
    for name, fn in SDPA_CALLS.items():
        ok, out = verdict(ch01.check_scaled_dot_product_attention, fn, capsys)
        assert ok, (name, out)


ATTENTION_WRONG = {
    "no scaling": (_attention(scale="none"), "off by a factor √d_k = 4 in the scores — did you forget the scaling?"),
    "divides by d_k": (_attention(scale="dk"), "you divided the scores by d_k = 16"),
    "multiplies by √d_k": (_attention(scale="times"), "you multiplied the scores by √d_k"),
    "scales by √d_v": (_attention(scale="sqrt_dv"), "you scaled by √d_v"),
    "softmax over queries": (_attention(dim=-2), "softmax over the wrong axis"),
    "reversed mask": (_attention(reverse=True), "mask convention reversed: True must mean may-attend"),
    "mask ignored": (_attention(ignore_mask=True), "the mask was ignored"),
    "-inf fill": (_attention(fill=float("-inf"), zero_empty=False), "NaN on a fully masked row"),
    "finfo fill, empty rows uniform": (_attention(zero_empty=False), "returns the average of the values"),
    "-1e9 in fp16": (_attention(fill=-1e9), "-1e9 does not fit in fp16"),
    "returns fp32": (_attention(upcast=True), "keep the inputs' dtype torch.float16"),
    "returns weights too": (_attention(return_weights=True), "return only the output tensor"),
    "returns the weights": (lambda q, k, v, mask=None: torch.softmax(q @ k.transpose(-2, -1), -1),
                            "those are the weights"),
    "k not transposed": (lambda q, k, v, mask=None: torch.softmax(q @ k, -1) @ v,
                         "your function raised RuntimeError"),
    "scales after q kᵀ in fp16": (_attention(scale_after=True), "q @ kᵀ overflowed to inf"),
}


@pytest.mark.parametrize("name", ATTENTION_WRONG)
def test_attention_checker_rejects_typical_mistakes(name, capsys):
    fn, message = ATTENTION_WRONG[name]
    rejects(ch01.check_scaled_dot_product_attention, fn, message, capsys)


def test_checkers_do_not_modify_their_reference_inputs(capsys):
    """A learner's in-place edit of q (e.g. q /= √d) must not change what later cases compare with."""

    def inplace(q, k, v, mask=None):
        q.mul_(0)
        return scaled_dot_product_attention(q, k, v, mask)

    assert not ch01.check_scaled_dot_product_attention(inplace)
    assert "❌" in capsys.readouterr().out
    assert ch01.check_scaled_dot_product_attention(scaled_dot_product_attention)
