"""The chapter 3 checkers accept the reference answers and reject typical wrong ones, in words."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tfm_course.attention import MultiHeadAttention, kv_cache_bytes, merge_heads, split_heads
from tfm_course.exercises import ch03


def verdict(capsys, checker, fn) -> tuple[bool, str]:
    ok = checker(fn)
    return ok, capsys.readouterr().out


# --------------------------------------------------------------------------- split heads
def split_view_bug(x, h):
    b, n, d = x.shape
    return x.view(b, h, n, d // h)  # runs, right shape, wrong content


def split_no_transpose(x, h):
    b, n, d = x.shape
    return x.view(b, n, h, d // h)


def split_interleaved(x, h):
    b, n, d = x.shape
    return x.view(b, n, d // h, h).permute(0, 3, 1, 2)


def split_crashes(x, h):
    return x.view(-1, h, 7)


@pytest.mark.parametrize("wrong, message", [
    (split_view_bug, "positions are mixed across heads"),
    (split_no_transpose, "forgot transpose(1, 2)"),
    (split_interleaved, "interleaved"),
    (split_crashes, "raised RuntimeError"),
])
def test_check_split_heads_rejects(capsys, wrong, message):
    ok, out = verdict(capsys, ch03.check_split_heads, wrong)
    assert not ok and message in out


def test_check_split_heads_accepts(capsys):
    assert verdict(capsys, ch03.check_split_heads, split_heads)[0]
    ok, out = verdict(capsys, ch03.check_split_heads,
                      lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3))
    assert ok and "all 3 checks passed" in out


# --------------------------------------------------------------------------- merge heads
def merge_reshape_bug(x):
    b, h, n, dh = x.shape
    return x.reshape(b, n, h * dh)


def merge_noncontiguous_view(x):
    b, h, n, dh = x.shape
    return x.transpose(1, 2).view(b, n, h * dh)


def merge_heads_last(x):
    b, h, n, dh = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, n, h * dh)


def merge_not_flattened(x):
    return x.transpose(1, 2)


@pytest.mark.parametrize("wrong, message", [
    (merge_reshape_bug, "transpose(1, 2) back"),
    (merge_noncontiguous_view, "not contiguous"),
    (merge_heads_last, "interleaved"),
    (merge_not_flattened, "not concatenated"),
])
def test_check_merge_heads_rejects(capsys, wrong, message):
    ok, out = verdict(capsys, ch03.check_merge_heads, wrong)
    assert not ok and message in out


def test_check_merge_heads_accepts(capsys):
    assert verdict(capsys, ch03.check_merge_heads, merge_heads)[0]


# --------------------------------------------------------------------------- forward pass
def make_forward(*, out_proj=True, scale="head", reverse=False, view_bug=False, use_mask=True,
                 fill=None, zero_masked=False, empty_rows=None):
    """A hand-written forward with one chosen mistake (independent of the checker's own variants)."""

    def forward(mha, query, key, value, mask):
        b, n_q, d = query.shape
        h = mha.num_heads
        d_head = d // h

        def heads(x):
            if view_bug:
                return x.view(b, h, x.shape[1], d_head)
            return x.view(b, x.shape[1], h, d_head).transpose(1, 2)

        q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
        divisor = {"head": math.sqrt(d_head), "model": math.sqrt(d), "none": 1.0}[scale]
        scores = q @ k.transpose(-2, -1) / divisor
        if mask is not None and use_mask:
            blocked = mask if reverse else ~mask
            scores = scores.masked_fill(blocked, float("-inf") if fill is None else fill)
        weights = torch.softmax(scores, dim=-1)
        if mask is not None and use_mask and zero_masked:
            weights = weights.masked_fill(blocked, 0.0)
        if mask is not None and empty_rows is not None:  # a made-up value for rows with no key
            weights = weights.masked_fill(~mask.any(-1, keepdim=True), empty_rows)
        out = weights @ v
        out = out.reshape(b, n_q, d) if view_bug else out.transpose(1, 2).reshape(b, n_q, d)
        return mha.out_proj(out) if out_proj else out

    return forward


@pytest.mark.parametrize("wrong, message", [
    (make_forward(out_proj=False), "out_proj is missing"),
    (make_forward(scale="none"), "forget to divide"),
    (make_forward(scale="model"), "divide by √d_head"),
    (make_forward(view_bug=True), "positions are mixed across heads"),
    (make_forward(reverse=True), "mask reversed"),
    (make_forward(use_mask=False), "mask was ignored"),
    # a query row with no allowed key (causal mask + left padding)
    (make_forward(), "NaN for a query that may attend no key"),                       # -inf fill
    (make_forward(fill=torch.finfo(torch.float32).min), "spreads its weight uniformly"),
    (make_forward(fill=-1e9), "spreads its weight uniformly"),
    (make_forward(fill=-1e9, zero_masked=True, empty_rows=0.5), "must get all-zero weights"),
])
def test_check_mha_forward_rejects(capsys, wrong, message):
    ok, out = verdict(capsys, ch03.check_mha_forward, wrong)
    assert not ok and message in out


def test_check_mha_forward_accepts(capsys):
    assert verdict(capsys, ch03.check_mha_forward,
                   lambda mha, q, k, v, mask: mha(q, k, v, mask=mask))[0]
    # from scratch: fill with the minimum (or -inf) and zero the masked weights after the softmax
    for fill in (torch.finfo(torch.float32).min, -1e9):
        assert verdict(capsys, ch03.check_mha_forward, make_forward(fill=fill, zero_masked=True))[0]
    nan_to_zero = make_forward(zero_masked=True)  # -inf, then masked_fill(…, 0) also removes the NaN
    ok, out = verdict(capsys, ch03.check_mha_forward, nan_to_zero)
    assert ok and "all 4 checks passed" in out


def test_check_mha_forward_tests_a_query_with_no_key(capsys):
    """The three first cases pass with a -inf fill; only the fully masked row tells it apart."""
    ok, out = verdict(capsys, ch03.check_mha_forward, make_forward())
    assert not ok and "causal + left padding (query rows with no key)" in out and "0/0" in out


# --------------------------------------------------------------------------- loading weights
def load_with(order="qkv", transpose=False, copy_out=True, copy_bias=True, keep_bias=None):
    def load(m: nn.MultiheadAttention) -> MultiHeadAttention:
        has_bias = m.in_proj_bias is not None
        ours = MultiHeadAttention(m.embed_dim, m.num_heads,
                                  bias=has_bias if keep_bias is None else keep_bias)
        chunks = dict(zip(order, m.in_proj_weight.detach().chunk(3)))
        with torch.no_grad():
            for name in "qkv":
                w = chunks[name].T if transpose else chunks[name]
                getattr(ours, f"{name}_proj").weight.copy_(w)
            if copy_out:
                ours.out_proj.weight.copy_(m.out_proj.weight)
            if has_bias and copy_bias and ours.q_proj.bias is not None:
                for name, b in zip(order, m.in_proj_bias.detach().chunk(3)):
                    getattr(ours, f"{name}_proj").bias.copy_(b)
                ours.out_proj.bias.copy_(m.out_proj.bias)
        return ours

    return load


@pytest.mark.parametrize("wrong, message", [
    (load_with(order="kqv"), "stacks [W_q; W_k; W_v]"),
    (load_with(transpose=True), "transposed"),
    (load_with(copy_out=False), "out_proj.weight was not copied"),
    (load_with(copy_bias=False), "bias was not copied"),
    (load_with(keep_bias=True), "has no biases"),
    (lambda m: nn.Linear(m.embed_dim, m.embed_dim), "return a tfm_course MultiHeadAttention"),
])
def test_check_load_torch_weights_rejects(capsys, wrong, message):
    ok, out = verdict(capsys, ch03.check_load_torch_weights, wrong)
    assert not ok and message in out


def test_check_load_torch_weights_accepts(capsys):
    assert verdict(capsys, ch03.check_load_torch_weights, MultiHeadAttention.from_torch)[0]
    assert verdict(capsys, ch03.check_load_torch_weights, load_with())[0]


# --------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("wrong, message", [
    (lambda L, h, hkv, dh, b: L * hkv * dh * b, "factor 2"),
    (lambda L, h, hkv, dh, b: 2 * L * h * dh * b, "only the num_kv_heads"),
    (lambda L, h, hkv, dh, b: 2 * hkv * dh * b, "one layer's cache"),
    (lambda L, h, hkv, dh, b: 2 * L * hkv * dh, "numbers, not bytes"),
    (lambda L, h, hkv, dh, b: 16 * L * hkv * dh * b, "bits, not bytes"),
    (lambda L, h, hkv, dh, b: "many", "return a number"),
])
def test_check_kv_cache_bytes_rejects(capsys, wrong, message):
    ok, out = verdict(capsys, ch03.check_kv_cache_bytes, wrong)
    assert not ok and message in out


def test_check_kv_cache_bytes_accepts(capsys):
    assert verdict(capsys, ch03.check_kv_cache_bytes,
                   lambda L, h, hkv, dh, b: kv_cache_bytes(L, hkv, dh, b))[0]


# --------------------------------------------------------------------------- the chapter's solutions
def test_the_chapters_dropdown_solutions_pass(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "chapters" / "03-multi-head-attention.md").read_text()
    solutions = re.findall(r":class: dropdown\n```python\n(.*?)```", text, re.S)
    assert len(solutions) == 5
    scope = dict(torch=torch, nn=nn, math=math, split_heads=split_heads, merge_heads=merge_heads,
                 MultiHeadAttention=MultiHeadAttention)
    for source in solutions:
        exec(source, scope)
    for checker, name in ((ch03.check_split_heads, "my_split_heads"),
                          (ch03.check_merge_heads, "my_merge_heads"),
                          (ch03.check_mha_forward, "my_mha_forward"),
                          (ch03.check_load_torch_weights, "my_from_torch"),
                          (ch03.check_kv_cache_bytes, "my_kv_cache_bytes")):
        assert verdict(capsys, checker, scope[name])[0], name
