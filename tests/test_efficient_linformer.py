"""Linformer: exact softmax attention when k = n and E = F = I; sharing options; clear errors."""

from __future__ import annotations

import pytest
import torch

from tfm_course.attention import MultiHeadAttention, scaled_dot_product_attention
from tfm_course.efficient.linformer import LinformerSelfAttention, linformer_attention


def _qkv(n=12, d=8, heads=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, heads, n, d, generator=g) for _ in range(3))


def test_identity_projections_give_softmax_attention():
    q, k, v = _qkv()
    eye = torch.eye(12)
    expected = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(linformer_attention(q, k, v, eye, eye), expected)
    torch.testing.assert_close(linformer_attention(q, k, v, eye.expand(3, 12, 12)), expected)


def test_projection_is_learned_mixing_of_positions():
    q, k, v = _qkv()
    E, F = torch.randn(4, 12), torch.randn(4, 12)
    expected = scaled_dot_product_attention(q, E @ k, F @ v)  # keys and values: 12 → 4 rows
    torch.testing.assert_close(linformer_attention(q, k, v, E, F), expected)


def test_per_head_projections_act_per_head():
    q, k, v = _qkv()
    E, F = torch.randn(3, 5, 12), torch.randn(3, 5, 12)
    out = linformer_attention(q, k, v, E, F)
    for h in range(3):
        torch.testing.assert_close(out[:, h], linformer_attention(q[:, h:h + 1], k[:, h:h + 1],
                                                                  v[:, h:h + 1], E[h], F[h])[:, 0])


def test_shorter_inputs_equal_zero_padding_keys_and_values():
    q, k, v = _qkv(n=7)
    E, F = torch.randn(4, 12), torch.randn(4, 12)
    pad = torch.zeros(2, 3, 5, 8)  # 7 real positions + 5 zero rows = the configured 12
    k_pad, v_pad = torch.cat([k, pad], 2), torch.cat([v, pad], 2)
    expected = scaled_dot_product_attention(q, E @ k_pad, F @ v_pad)
    torch.testing.assert_close(linformer_attention(q, k, v, E, F), expected)


def test_module_with_identity_projection_equals_multi_head_attention():
    torch.manual_seed(0)
    n, d, heads = 10, 16, 4
    lin = LinformerSelfAttention(d, heads, seq_len=n, k=n, sharing="kv")
    mha = MultiHeadAttention(d, heads)
    with torch.no_grad():
        lin.E.copy_(torch.eye(n))
        wq, wk, wv = lin.qkv.weight.chunk(3)
        bq, bk, bv = lin.qkv.bias.chunk(3)
        for proj, w, b in ((mha.q_proj, wq, bq), (mha.k_proj, wk, bk), (mha.v_proj, wv, bv),
                           (mha.out_proj, lin.out_proj.weight, lin.out_proj.bias)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
    x = torch.randn(3, n, d)
    torch.testing.assert_close(lin(x), mha(x), atol=1e-5, rtol=1e-4)


def test_sharing_options():
    d, heads, n, k = 16, 4, 32, 8
    none = LinformerSelfAttention(d, heads, n, k, sharing="none")
    headwise = LinformerSelfAttention(d, heads, n, k, sharing="headwise")
    kv = LinformerSelfAttention(d, heads, n, k, sharing="kv")
    assert none.E.shape == none.F.shape == (heads, k, n)
    assert headwise.E.shape == headwise.F.shape == (k, n) and headwise.E is not headwise.F
    assert kv.E.shape == (k, n) and kv.F is None

    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(none) - count(headwise) == 2 * (heads - 1) * k * n
    assert count(headwise) - count(kv) == k * n

    shared = torch.nn.Parameter(torch.randn(k, n) / k ** 0.5)  # layerwise: one matrix for all layers
    layers = torch.nn.Sequential(*(LinformerSelfAttention(d, heads, n, k, projection=shared)
                                   for _ in range(3)))
    assert all(layer.E is shared and layer.sharing == "layerwise" for layer in layers)
    assert sum(p.numel() for p in layers.parameters()) == 3 * (count(kv) - k * n) + k * n
    layers(torch.randn(2, n, d)).sum().backward()
    assert shared.grad is not None and shared.grad.abs().sum() > 0


def test_errors():
    with pytest.raises(ValueError, match="cannot be causal"):
        LinformerSelfAttention(16, 4, seq_len=8, causal=True)
    layer = LinformerSelfAttention(16, 4, seq_len=8, k=4)
    with pytest.raises(ValueError, match="exceeds the Linformer's configured n_max = 8"):
        layer(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match="no attention mask"):
        layer(torch.randn(1, 8, 16), mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(batch, n, d_model=16\)"):
        layer(torch.randn(1, 8, 12))
    with pytest.raises(ValueError, match="sharing must be"):
        LinformerSelfAttention(16, 4, seq_len=8, sharing="all")
    with pytest.raises(ValueError, match=r"\(k, seq_len\) = \(4, 8\)"):
        LinformerSelfAttention(16, 4, seq_len=8, k=4, projection=torch.nn.Parameter(torch.ones(4, 9)))
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="E must be"):
        linformer_attention(q, k, v, torch.ones(2, 4, 12))  # 2 ≠ 3 heads
    with pytest.raises(ValueError, match="E, F must match"):
        linformer_attention(q, k, v, torch.ones(4, 12), torch.ones(5, 12))
    with pytest.raises(ValueError, match="v must be"):
        linformer_attention(q, k, v[:, :, :5], torch.ones(4, 12))
