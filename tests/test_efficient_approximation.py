"""The approximation-error experiments: what they measure, and the findings the chapter relies on."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.efficient.approximation import (fixed_subspace_error, linformer_error, uniform_error,
                                                low_rank_error, performer_error, projection_errors,
                                                random_qkv, relative_error, segment_mean_projection)
from tfm_course.efficient.linformer import linformer_attention


def test_random_qkv_has_the_requested_logit_scale_and_is_reproducible():
    q, k, v = random_qkv(256, 32, logit_std=0.5, draws=4, seed=3)
    assert q.shape == k.shape == v.shape == (4, 256, 32)
    logits = q @ k.transpose(-2, -1) / math.sqrt(32)
    assert abs(float(logits.std()) - 0.5) < 0.02
    torch.testing.assert_close(random_qkv(256, 32, 0.5, 4, seed=3)[0], q)


def test_performer_error_falls_with_features_at_a_small_logit_scale():
    errors = [float(performer_error(m, 0.25, n=128, d=32, draws=6).mean()) for m in (16, 256, 4096)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.2 < 0.6 < errors[0]  # 16× the features: about 4× less error (1/√m)


def test_performer_error_stays_large_at_logit_std_one_whatever_the_features():
    """The spec's finding: exp(‖q + k‖²) variance, not the number of features, dominates."""
    for m in (64, 1024, 4096):  # the spec's d = 64; at logit std 0.25 the same m give 0.6 → 0.1
        large = float(performer_error(m, 1.0, n=128, d=64, draws=4).mean())
        small = float(performer_error(m, 0.25, n=128, d=64, draws=4).mean())
        assert large > 1.5 and large > 2.5 * small


def _orthogonal_gain(m: int, d: int, draws: int = 128) -> tuple[float, float]:
    """Paired over draws (the same inputs for both; only the projection differs): the mean of
    error(i.i.d.) - error(orthogonal) and its standard error."""
    iid = performer_error(m, 0.25, orthogonal=False, n=64, d=d, draws=draws)
    orth = performer_error(m, 0.25, orthogonal=True, n=64, d=d, draws=draws)
    diff = (iid - orth).double()
    return float(diff.mean()), float(diff.std() / draws ** 0.5)


def test_orthogonal_features_help_beyond_the_paired_spread_once_m_reaches_d():
    gain, se = _orthogonal_gain(64, 32)  # two orthogonal blocks
    assert gain > 2 * se, (gain, se)


def test_with_fewer_features_than_dimensions_orthogonality_does_not_hurt():
    # m < d: one partial block of orthogonal rows, which might be expected to be worse than i.i.d.;
    # paired over 128 draws it is not (measured gain 0.052 +- 0.023 at m = 8, d = 32)
    gain, se = _orthogonal_gain(8, 32)
    assert gain > se, (gain, se)


def test_linformer_segment_means_are_exact_at_k_equal_n_and_gaussian_is_never_close():
    assert float(linformer_error(64, 1.0, n=64, d=16).max()) < 1e-5  # E = F = I
    for k in (4, 16, 48):
        assert float(linformer_error(k, 1.0, "gaussian", n=64, d=16).min()) > 1.0
        assert 0.05 < float(linformer_error(k, 1.0, n=64, d=16).mean()) < 1.0


def test_low_rank_error_is_eckart_young():
    g = torch.Generator().manual_seed(0)
    A = torch.softmax(torch.randn(3, 20, 20, generator=g, dtype=torch.float64) * 2, -1)
    U, S, Vh = torch.linalg.svd(A)
    for r in (0, 1, 5, 20):
        best = (U[..., :r] * S[..., None, :r]) @ Vh[..., :r, :]
        torch.testing.assert_close(low_rank_error(A, r), relative_error(best, A))
    assert torch.equal(low_rank_error(A, 0), torch.ones(3, dtype=torch.float64))
    several = low_rank_error(A, [0, 1, 5, 20])  # one decomposition, a last dim of ranks
    assert several.shape == (3, 4)
    for i, r in enumerate((0, 1, 5, 20)):
        torch.testing.assert_close(several[:, i], low_rank_error(A, r))


def test_fixed_subspace_error_is_eckart_young_for_one_matrix_and_a_projection_for_several():
    g = torch.Generator().manual_seed(0)
    A = torch.softmax(torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64), -1)
    for r in (0, 3, 16):
        torch.testing.assert_close(fixed_subspace_error(A, r), low_rank_error(A[:, 0], r))
    # rank-4 matrices: all rows in one shared 4-dim subspace, or each in a subspace of its own
    basis = torch.randn(4, 16, generator=g, dtype=torch.float64)
    shared = torch.randn(5, 16, 4, generator=g, dtype=torch.float64) @ basis
    own = torch.randn(5, 16, 4, generator=g, dtype=torch.float64) @ torch.randn(
        5, 4, 16, generator=g, dtype=torch.float64)
    assert float(low_rank_error(shared, 4).max()) < 1e-6 and float(low_rank_error(own, 4).max()) < 1e-6
    assert float(fixed_subspace_error(shared, 4)) < 1e-6  # one projection fits every matrix
    assert float(fixed_subspace_error(own, 4)) > 0.3  # each is rank 4, but no one subspace fits all
    # the definition: project every row on the top right singular vectors of all rows together
    rows = own.flatten(0, 1)
    top = torch.linalg.svd(rows).Vh[:6]
    projected = rows @ top.T @ top
    want = (rows - projected).norm() / rows.norm()
    torch.testing.assert_close(fixed_subspace_error(own, 6), want)
    torch.testing.assert_close(fixed_subspace_error(own, [4, 6])[1], want)


def test_segment_mean_projection_averages_consecutive_segments():
    E = segment_mean_projection(3, 7)
    torch.testing.assert_close(E.sum(-1), torch.ones(3))
    assert (E > 0).sum(-1).tolist() == [3, 2, 2]  # near-equal segments, each position once
    torch.testing.assert_close((E > 0).sum(0), torch.ones(7, dtype=torch.long))
    torch.testing.assert_close(segment_mean_projection(5, 5), torch.eye(5))


@pytest.mark.parametrize("call, match", [
    (lambda: random_qkv(0, 4, 1.0), "positive"),
    (lambda: random_qkv(4, 4, 0.0), "logit_std"),
    (lambda: segment_mean_projection(9, 8), r"k_proj must be in \[1, n=8\]"),
    (lambda: linformer_error(4, projection="svd"), "segment-mean"),
    (lambda: linformer_error(4, measure="weights"), "'output' or 'matrix'"),
    (lambda: low_rank_error(torch.ones(3), 1), r"\(\.\.\., n, n\)"),
    (lambda: low_rank_error(torch.ones(3, 3), -1), "non-negative"),
    (lambda: fixed_subspace_error(torch.ones(3, 3), 1), r"\(\.\.\., batch, n_q, n_k\)"),
    (lambda: fixed_subspace_error(torch.ones(1, 3, 3), -1), "non-negative"),
    (lambda: low_rank_error(torch.ones(3, 3), [2, -1]), "non-negative"),
    (lambda: relative_error(torch.ones(2, 3), torch.ones(3, 2)), "shapes differ"),
    (lambda: projection_errors(*random_qkv(8, 4, 1.0), segment_mean_projection(2, 6)), r"E \(k_proj, n\)"),
])
def test_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_both_kernel_estimates_are_unbiased_but_only_positive_ones_stay_positive():
    from tfm_course.efficient.approximation import kernel_estimates
    g = torch.Generator().manual_seed(0)
    direction = torch.nn.functional.normalize(torch.randn(2, 8, generator=g, dtype=torch.float64), dim=-1)
    x = direction[:1].repeat(2, 1) * 1.5
    y = torch.stack([-direction[0] * 1.5, direction[1] * 0.2])  # x·y = −2.25 (small kernel), ~0
    exact = torch.exp((x * y).sum(-1))
    pos = kernel_estimates(x, y, 16, draws=300, kind="positive")
    trig = kernel_estimates(x, y, 16, draws=300, kind="trigonometric")
    for est in (pos, trig):  # unbiased: the mean of 300 draws is within 4 standard errors
        assert bool(((est.mean(0) - exact).abs() <= 4 * est.std(0) / 300 ** 0.5 + 1e-12).all())
    assert bool((pos > 0).all())
    assert float((trig[:, 0] < 0).float().mean()) > 0.2  # near-zero kernel: often negative
    assert float(trig[:, 0].std()) > 3 * float(pos[:, 0].std())  # and far noisier


def test_linformer_matrix_error_is_zero_at_k_equal_n_and_never_below_the_eckart_young_floor():
    assert float(linformer_error(64, 1.0, n=64, d=16, measure="matrix").max()) < 1e-5  # E = F = I
    q, k, _ = random_qkv(64, 16, 1.0)  # the draws linformer_error uses (same seed)
    floor = low_rank_error(torch.softmax(q @ k.transpose(-2, -1) / 4, -1), [4, 8, 16, 32])
    for i, kk in enumerate([4, 8, 16, 32]):
        for projection in ("segment-mean", "gaussian"):
            got = linformer_error(kk, 1.0, projection, n=64, d=16, measure="matrix")
            assert bool((got >= floor[:, i] - 1e-6).all()), (kk, projection)  # rank <= k
    # the matrix and output measures differ (the output also mixes the values)
    assert not torch.allclose(linformer_error(8, 1.0, n=64, d=16, measure="matrix"),
                              linformer_error(8, 1.0, n=64, d=16))


def test_uniform_attention_is_close_for_flat_logits_and_far_for_sharp_ones():
    flat, sharp = uniform_error(0.05, draws=3), uniform_error(1.0, draws=3)
    assert flat.shape == (3,) and flat.max() < 0.1 < 0.5 < sharp.min()
    # FAVOR+ with few features is worse than this baseline at a small logit scale
    assert performer_error(64, 0.25, True, draws=3).mean() > uniform_error(0.25, draws=3).mean()



def test_projection_errors_score_the_linformer_layer_and_k_1_is_uniform_attention():
    q, k, v = random_qkv(32, 8, 1.0, draws=3, dtype=torch.float64)
    E = segment_mean_projection(4, 32, torch.float64)
    errors = projection_errors(q, k, v, E)
    exact = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1)
    layer = linformer_attention(q[:, None], k[:, None], v[:, None], E)[:, 0]  # the package's layer
    torch.testing.assert_close(errors["output"], relative_error(layer, exact @ v))
    assert errors["matrix"].shape == (3,) and bool((errors["matrix"] >= low_rank_error(exact, 4) - 1e-12).all())
    # one segment: every query averages all values, uniform attention, whatever q and k are
    one = projection_errors(q, k, v, segment_mean_projection(1, 32, torch.float64))
    torch.testing.assert_close(one["matrix"], relative_error(torch.full_like(exact, 1 / 32), exact))
    torch.testing.assert_close(one["output"], relative_error(v.mean(-2, keepdim=True).expand_as(v), exact @ v))
    # k = n with the identity: exact; a separate F is used for the values
    exact_at_n = projection_errors(q, k, v, torch.eye(32, dtype=torch.float64))
    assert float(max(exact_at_n["matrix"].max(), exact_at_n["output"].max())) < 1e-12
    assert not torch.allclose(projection_errors(q, k, v, E, F=segment_mean_projection(4, 32, torch.float64).flip(0))
                              ["output"], errors["output"])
