"""Sparse attention masks: shapes, symmetry and causality, and agreement with dense attention."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.attention import fused_attention, scaled_dot_product_attention
from tfm_course.experiments.measure import count_flops, peak_tensor_bytes
from tfm_course.efficient.sparse import (bigbird_mask, density, longformer_mask,
                                         sliding_window_attention, sliding_window_mask)


def test_sliding_window_shape_symmetry_and_counts():
    n, w = 10, 2
    m = sliding_window_mask(n, w)
    assert m.shape == (n, n) and m.dtype == torch.bool
    assert torch.equal(m, m.T)
    assert bool(m.diagonal().all())
    rows = m.sum(-1)
    expected = torch.tensor([min(i, w) + min(n - 1 - i, w) + 1 for i in range(n)])
    assert torch.equal(rows, expected)  # 2w + 1 keys away from the edges
    for i in range(n):
        for j in range(n):
            assert bool(m[i, j]) == (abs(i - j) <= w)


def test_causal_masks_never_look_ahead():
    n = 12
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    for m in (sliding_window_mask(n, 3, causal=True), longformer_mask(n, 2, 2, causal=True),
              bigbird_mask(n, 1, 1, num_random=3, causal=True, generator=torch.Generator().manual_seed(0))):
        assert not bool((m & ~tril).any())
        assert bool(m.diagonal().all())
    assert torch.equal(sliding_window_mask(n, 3, causal=True), sliding_window_mask(n, 3) & tril)
    assert torch.equal(longformer_mask(n, 2, [0, 5], causal=True), longformer_mask(n, 2, [0, 5]) & tril)


def test_longformer_global_tokens():
    n = 16
    m = longformer_mask(n, 1, global_tokens=[0, 7])
    assert torch.equal(m, m.T)
    for g in (0, 7):
        assert bool(m[g].all()) and bool(m[:, g].all())
    local = sliding_window_mask(n, 1)
    others = [i for i in range(n) if i not in (0, 7)]
    sub = torch.tensor(others)
    assert torch.equal(m[sub][:, sub], local[sub][:, sub])  # elsewhere just the window
    assert torch.equal(longformer_mask(n, 1, 2), longformer_mask(n, 1, [0, 1]))  # a count = first tokens
    assert density(longformer_mask(n, 1, 0)) == pytest.approx(float(local.float().mean()))


def test_bigbird_adds_exactly_the_random_keys():
    n, w, g, r = 20, 1, 1, 3
    base = longformer_mask(n, w, g)
    m = bigbird_mask(n, w, g, num_random=r, generator=torch.Generator().manual_seed(0))
    assert m.shape == (n, n) and m.dtype == torch.bool
    assert bool((m | base).eq(m).all())  # contains window + global
    extra = (m & ~base).sum(-1)
    available = (~base).sum(-1)
    assert torch.equal(extra, torch.minimum(available, torch.full_like(available, r)))
    again = bigbird_mask(n, w, g, num_random=r, generator=torch.Generator().manual_seed(0))
    assert torch.equal(m, again)
    other = bigbird_mask(n, w, g, num_random=r, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(m, other)


@pytest.mark.parametrize("make", [
    lambda n: sliding_window_mask(n, n - 1),
    lambda n: longformer_mask(n, n, 0),
    lambda n: bigbird_mask(n, n - 1, 1, num_random=2),
])
def test_full_window_equals_dense_attention(make):
    n = 9
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g) for _ in range(3))
    mask = make(n)
    assert bool(mask.all()) and density(mask) == 1.0
    dense = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask), dense)
    torch.testing.assert_close(fused_attention(q, k, v, mask), dense, atol=1e-5, rtol=1e-4)


def test_window_attention_equals_softmax_over_the_window_only():
    n, w, d = 11, 2, 4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, d, generator=g) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v, sliding_window_mask(n, w))
    for i in range(n):
        lo, hi = max(0, i - w), min(n, i + w + 1)
        weights = torch.softmax(q[0, 0, i] @ k[0, 0, lo:hi].T / math.sqrt(d), -1)
        torch.testing.assert_close(out[0, 0, i], weights @ v[0, 0, lo:hi])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(5, -1)
    with pytest.raises(ValueError, match="positive"):
        sliding_window_mask(0, 1)
    with pytest.raises(ValueError, match=r"\[0, n=5\]"):
        longformer_mask(5, 1, global_tokens=6)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        longformer_mask(5, 1, global_tokens=[0, 5])
    with pytest.raises(ValueError, match="num_random"):
        bigbird_mask(5, 1, 1, num_random=-1)


# --------------------------------------------------------------------------- the blocked kernel
def _dense_window(q, k, v, window, causal):
    """Reference: softmax over |i − j| ≤ window (j ≤ i if causal) in float64, −inf elsewhere."""
    n = q.shape[-2]
    allowed = sliding_window_mask(n, window, causal=causal)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("n, window, block_size, causal", [
    (11, 2, None, False), (11, 2, 3, True), (64, 5, 7, False), (64, 5, 64, True),
    (5, 10, None, False),  # window wider than the sequence: full attention
    (9, 0, None, False), (9, 0, 4, True),  # only the diagonal
    (1, 3, None, False), (50, 16, 16, True), (33, 4, 100, False),  # a block longer than n
])
def test_blocked_window_equals_dense_masked_attention_outputs_and_gradients(n, window, block_size,
                                                                            causal):
    g = torch.Generator().manual_seed(n + window)
    q, k = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    got = sliding_window_attention(q, k, v, window, causal=causal, block_size=block_size)
    want = _dense_window(q, k, v, window, causal)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    grad_out = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, (q, k, v), grad_out)
    want_grads = torch.autograd.grad(want, (q, k, v), grad_out)
    for a, b in zip(got_grads, want_grads):
        assert bool(torch.isfinite(a).all())  # padded query rows must not leak NaN into keys
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_blocked_window_matches_pytorch_sdpa_with_the_mask_in_float32():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 100, 8, generator=g) for _ in range(3))
    for causal in (False, True):
        mask = sliding_window_mask(100, 6, causal=causal)
        torch.testing.assert_close(sliding_window_attention(q, k, v, 6, causal=causal),
                                   fused_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_blocked_window_memory_and_work_grow_linearly_while_a_mask_saves_nothing():
    def inputs(n):
        g = torch.Generator().manual_seed(0)
        return [torch.randn(1, 2, n, 16, generator=g) for _ in range(3)]

    def cost(measure, fn, n):
        q, k, v = inputs(n)
        return measure(lambda: fn(q, k, v))

    blocked = lambda q, k, v: sliding_window_attention(q, k, v, 16)  # noqa: E731
    masked = lambda q, k, v: scaled_dot_product_attention(  # noqa: E731
        q, k, v, sliding_window_mask(q.shape[-2], 16))
    dense = lambda q, k, v: scaled_dot_product_attention(q, k, v)  # noqa: E731
    for measure in (peak_tensor_bytes, count_flops):
        growth = cost(measure, blocked, 2048) / cost(measure, blocked, 1024)
        assert 1.8 < growth < 2.2, (measure.__name__, growth)  # linear in n
        masked_growth = cost(measure, masked, 2048) / cost(measure, masked, 1024)
        assert masked_growth > 3.5, (measure.__name__, masked_growth)  # still quadratic
    assert count_flops(lambda: masked(*inputs(512))) == count_flops(lambda: dense(*inputs(512)))
    assert count_flops(lambda: blocked(*inputs(2048))) < count_flops(lambda: dense(*inputs(2048))) / 5


def test_blocked_window_bad_inputs_raise():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="window must be a non-negative integer"):
        sliding_window_attention(q, q, q, -1)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        sliding_window_attention(q, q, q, 2, block_size=0)
    with pytest.raises(ValueError, match=r"same \(\.\.\., n\)"):
        sliding_window_attention(q, q[..., :7, :], q, 2)
    assert sliding_window_attention(q[..., :0, :], q[..., :0, :], q[..., :0, :], 2).shape == (1, 2, 0, 4)
