"""Performer / FAVOR+: exact linear-time rewrites of one estimator, and how good the estimator is."""

from __future__ import annotations

import pytest
import torch

from tfm_course.attention import causal_mask, scaled_dot_product_attention
from tfm_course.efficient.performer import (PerformerAttention, draw_projection, favor_attention,
                                            positive_random_features)


def _qkv(n=37, d=8, scale=0.5, seed=0, batch=2, heads=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=g) * scale
    k = torch.randn(batch, heads, n, d, generator=g) * scale
    v = torch.randn(batch, heads, n, d, generator=g)
    return q, k, v


def _quadratic(q, k, v, projection, causal):
    """The same estimator written with the n × n matrix: A = φ(Q)φ(K)ᵀ (masked), out = A V / A 1."""
    phi_q = positive_random_features(q, projection, is_query=True)
    phi_k = positive_random_features(k, projection, is_query=False)
    A = phi_q @ phi_k.transpose(-2, -1)
    if causal:
        A = A * causal_mask(q.shape[-2])
    return A @ v / A.sum(-1, keepdim=True)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 37, 64])  # 5 and 16 do not divide 37
def test_causal_prefix_sums_equal_masked_quadratic_form(chunk_size):
    q, k, v = _qkv()
    P = draw_projection(32, 8, generator=torch.Generator().manual_seed(0))
    out = favor_attention(q, k, v, 32, causal=True, projection=P, chunk_size=chunk_size)
    torch.testing.assert_close(out, _quadratic(q, k, v, P, causal=True), atol=1e-6, rtol=1e-5)


def test_noncausal_linear_form_equals_quadratic_form():
    q, k, v = _qkv()
    P = draw_projection(32, 8, orthogonal=False, generator=torch.Generator().manual_seed(0))
    out = favor_attention(q, k, v, 32, projection=P)
    torch.testing.assert_close(out, _quadratic(q, k, v, P, causal=False), atol=1e-6, rtol=1e-5)


def test_causal_output_ignores_the_future():
    q, k, v = _qkv(scale=0.3)
    P = draw_projection(16, 8, generator=torch.Generator().manual_seed(0))
    out = favor_attention(q, k, v, 16, causal=True, projection=P)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[..., 20:, :] = torch.randn_like(t[..., 20:, :])
    out2 = favor_attention(q2, k2, v2, 16, causal=True, projection=P)
    torch.testing.assert_close(out2[..., :20, :], out[..., :20, :], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 64])
def test_a_large_future_key_leaves_past_outputs_unchanged(chunk_size):
    """Keys of norm ~6·√d have log-features near −100; a later key on a feature direction has the
    largest possible one (‖ω‖²/2). A maximum over the whole sequence subtracted that and pushed
    every earlier feature below float32's range (past outputs moved by 1.36); the prefix maximum
    leaves them as they were, and both agree with float64."""
    g = torch.Generator().manual_seed(0)
    n, d = 48, 16
    q, k, v = (s * torch.randn(1, 2, n, d, generator=g) for s in (1.0, 6.0, 1.0))
    P = draw_projection(32, d, generator=torch.Generator().manual_seed(1))
    out = favor_attention(q, k, v, 32, causal=True, projection=P, chunk_size=chunk_size)
    k2 = k.clone()
    k2[..., -1, :] = P[0] * d ** 0.25  # x' = ω_0: exponent ‖ω_0‖²/2, the largest there is
    out2 = favor_attention(q, k2, v, 32, causal=True, projection=P, chunk_size=chunk_size)
    torch.testing.assert_close(out2[..., :-1, :], out[..., :-1, :], atol=1e-6, rtol=1e-6)
    reference = favor_attention(q.double(), k2.double(), v.double(), 32, causal=True,
                                projection=P.double())
    torch.testing.assert_close(out2.double(), reference, atol=1e-4, rtol=1e-4)


def _mean_error(num_features: int, orthogonal: bool, seeds: int) -> float:
    """Relative error against exact softmax, averaged over ``seeds`` independent problems and draws.

    One call: batch element s has its own inputs and its own (num_features, d) projection. With
    num_features a multiple of d, consecutive rows of one big orthogonal draw are independent
    orthogonal projections.
    """
    d = 16
    q, k, v = _qkv(n=32, d=d, scale=0.3, batch=seeds, heads=4)  # small logits
    P = draw_projection(seeds * num_features, d, orthogonal, torch.Generator().manual_seed(1))
    P = P.view(seeds, 1, num_features, d)  # one projection per batch element, shared by its heads
    exact = scaled_dot_product_attention(q, k, v)
    approx = favor_attention(q, k, v, num_features, projection=P)
    errors = (approx - exact).flatten(1).norm(dim=1) / exact.flatten(1).norm(dim=1)
    return float(errors.mean())


def test_batched_projection_equals_one_call_per_batch_element():
    q, k, v = _qkv(batch=3)
    P = draw_projection(3 * 16, 8, generator=torch.Generator().manual_seed(0)).view(3, 1, 16, 8)
    out = favor_attention(q, k, v, 16, causal=True, projection=P)
    for b in range(3):
        one = favor_attention(q[b], k[b], v[b], 16, causal=True, projection=P[b, 0])
        torch.testing.assert_close(out[b], one)


def test_error_falls_with_more_features_and_orthogonal_helps():
    seeds, sizes = 32, (16, 64, 256)  # multiples of d = 16
    iid = [_mean_error(m, False, seeds) for m in sizes]
    orth = [_mean_error(m, True, seeds) for m in sizes]
    for errors in (iid, orth):  # each 4× more features: error ≈ halves (Monte Carlo, 1/√m)
        assert errors[0] > errors[1] > errors[2]
        assert errors[2] < 0.7 * errors[0] / 2
    assert sum(orth) < sum(iid)  # orthogonal features: lower error on average


def test_many_features_approach_softmax():
    q, k, v = _qkv(n=16, d=8, scale=0.3, batch=1, heads=1)
    approx = favor_attention(q, k, v, 8192, generator=torch.Generator().manual_seed(0))
    exact = scaled_dot_product_attention(q, k, v)
    assert float((approx - exact).norm() / exact.norm()) < 0.03


def test_projection_rows_are_gaussian_sized_and_orthogonal_within_blocks():
    P = draw_projection(40, 16, orthogonal=True, generator=torch.Generator().manual_seed(0))
    assert P.shape == (40, 16)
    directions = P / P.norm(dim=1, keepdim=True)
    for block in (directions[:16], directions[16:32]):
        torch.testing.assert_close(block @ block.T, torch.eye(16), atol=1e-5, rtol=0)
    again = draw_projection(40, 16, orthogonal=True, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(P, again)  # reproducible from the generator
    # rows keep Gaussian norms: E‖ω‖² = d, for orthogonal and iid draws alike
    for orthogonal in (True, False):
        big = draw_projection(4096, 16, orthogonal, generator=torch.Generator().manual_seed(1))
        assert abs(float(big.square().sum(1).mean()) - 16) < 0.7


def test_features_are_positive_and_stabilised_for_large_inputs():
    q, k, v = _qkv(scale=20.0)  # logits far beyond exp's range without the max subtraction
    P = draw_projection(16, 8, generator=torch.Generator().manual_seed(0))
    phi = positive_random_features(q, P, is_query=True)
    assert bool((phi >= 0).all()) and bool(torch.isfinite(phi).all())
    for causal in (False, True):
        out = favor_attention(q, k, v, 16, causal=causal, projection=P)
        assert bool(torch.isfinite(out).all())


def test_low_precision_inputs_computed_in_float32():
    q, k, v = _qkv()
    P = draw_projection(16, 8, generator=torch.Generator().manual_seed(0))
    ref = favor_attention(q, k, v, 16, projection=P)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = favor_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 16, projection=P)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


def test_module_redraws_features_on_request():
    torch.manual_seed(0)
    layer = PerformerAttention(16, 2, num_features=8, causal=True)
    x = torch.randn(2, 10, 16)
    y = layer(x)
    assert y.shape == (2, 10, 16)
    torch.testing.assert_close(layer(x), y)  # fixed features: deterministic
    before = layer.projection.clone()
    layer.redraw_features(torch.Generator().manual_seed(5))
    assert layer.projection.shape == before.shape and not torch.equal(layer.projection, before)
    assert not torch.allclose(layer(x), y)
    assert "projection" in layer.state_dict()


@pytest.mark.parametrize("q_shape, v_shape, P_shape, match", [
    ((2, 2, 10, 8), (2, 2, 10, 8), (4, 7), "projection must be"),
    ((2, 2, 10, 8), (2, 2, 10, 8), (3, 1, 4, 8), "projection must be"),  # 3 ≠ batch 2
    ((2, 2, 10, 8), (2, 2, 9, 8), (4, 8), "v must be"),
])
def test_bad_inputs_raise(q_shape, v_shape, P_shape, match):
    q, v = torch.randn(q_shape), torch.randn(v_shape)
    with pytest.raises(ValueError, match=match):
        favor_attention(q, q, v, 4, projection=torch.randn(P_shape))


def test_more_bad_inputs_raise():
    q = torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="same shape"):
        favor_attention(q, torch.randn(1, 1, 5, 3), q, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        favor_attention(q, q, q, 4, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="positive"):
        draw_projection(0, 4)
    with pytest.raises(ValueError, match="divisible"):
        PerformerAttention(10, 3)
    with pytest.raises(ValueError, match=r"d_model=8"):
        PerformerAttention(8, 2)(torch.randn(1, 3, 6))


@pytest.mark.parametrize("causal", [False, True])
def test_large_norm_queries_do_not_underflow_to_zero_rows(causal):
    """q ~ 8·N(0, 1), d = 16: exp(ω·q' − ‖q'‖²/2) is ~e^-128 for every feature, below float32's
    range, unless −‖q'‖²/2 sits inside the row maximum (it used to give 22 of 32 zero rows)."""
    g = torch.Generator().manual_seed(0)
    q = 8 * torch.randn(2, 2, 32, 16, generator=g)
    k, v = torch.randn(2, 2, 32, 16, generator=g), torch.randn(2, 2, 32, 16, generator=g)
    P = draw_projection(64, 16, generator=torch.Generator().manual_seed(1))
    out = favor_attention(q, k, v, 64, projection=P, causal=causal)
    reference = favor_attention(q.double(), k.double(), v.double(), 64, projection=P.double(),
                                causal=causal)
    assert int((out.abs().sum(-1) == 0).sum()) == 0
    assert float(reference.abs().sum(-1).min()) > 0.01  # the true rows are far from zero
    torch.testing.assert_close(out.double(), reference, atol=1e-4, rtol=1e-4)
    phi = positive_random_features(q, P, is_query=True)
    torch.testing.assert_close(phi.amax(-1), torch.full(q.shape[:-1], 64 ** -0.5))  # top = 1/√m
