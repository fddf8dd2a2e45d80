"""Sparse attention masks: shapes, symmetry and causality, and agreement with dense attention."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.attention import fused_attention, scaled_dot_product_attention
from tfm_course.efficient.sparse import bigbird_mask, density, longformer_mask, sliding_window_mask


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
