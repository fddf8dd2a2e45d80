"""Mamba: the parallel scan equals the sequential one (values and gradients); step() equals forward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfm_course.efficient.mamba import MambaBlock, linear_scan, selective_scan

TOL = dict(atol=1e-5, rtol=1e-4)


def _scan_inputs(batch=2, length=19, d=6, n=4, seed=0, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d, generator=g, dtype=dtype)
    delta = F.softplus(torch.randn(batch, length, d, generator=g, dtype=dtype))
    A = -torch.rand(d, n, generator=g, dtype=dtype) * 2
    B = torch.randn(batch, length, n, generator=g, dtype=dtype)
    C = torch.randn(batch, length, n, generator=g, dtype=dtype)
    D = torch.randn(d, generator=g, dtype=dtype)
    tensors = [x, delta, A, B, C, D]
    return [t.requires_grad_() for t in tensors] if grad else tensors


def _by_definition(x, delta, A, B, C, D):
    """h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t, y_t = C_t · h_t + D x_t with explicit loops (float64)."""
    x, delta, A, B, C, D = (t.double() for t in (x, delta, A, B, C, D))
    batch, length, d = x.shape
    y = torch.zeros(batch, length, d, dtype=torch.float64)
    for b in range(batch):
        for c in range(d):
            h = torch.zeros(A.shape[1], dtype=torch.float64)
            for t in range(length):
                h = torch.exp(delta[b, t, c] * A[c]) * h + delta[b, t, c] * B[b, t] * x[b, t, c]
                y[b, t, c] = (C[b, t] * h).sum() + D[c] * x[b, t, c]
    return y


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_selective_scan_matches_the_definition(mode):
    inputs = _scan_inputs(batch=1, length=9, d=3, n=2, dtype=torch.float64)
    torch.testing.assert_close(selective_scan(*inputs, mode=mode), _by_definition(*inputs),
                               atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("length", [1, 2, 7, 16, 33])  # odd lengths exercise the padding
def test_linear_scan_forms_agree(length):
    g = torch.Generator().manual_seed(length)
    a, b = torch.rand(3, length, 5, generator=g), torch.randn(3, length, 5, generator=g)
    h, expected = torch.zeros(3, 5), []
    for t in range(length):
        h = a[:, t] * h + b[:, t]
        expected.append(h)
    expected = torch.stack(expected, 1)
    torch.testing.assert_close(linear_scan(a, b, "sequential"), expected, **TOL)
    torch.testing.assert_close(linear_scan(a, b, "parallel"), expected, **TOL)


@pytest.mark.parametrize("length", [1, 5, 19, 32])
def test_parallel_scan_equals_sequential_outputs_and_gradients(length):
    results = {}
    for mode in ("sequential", "parallel"):
        inputs = _scan_inputs(length=length, grad=True)
        y = selective_scan(*inputs, mode=mode)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results[mode] = (y.detach(), [t.grad for t in inputs])
    y_seq, g_seq = results["sequential"]
    y_par, g_par = results["parallel"]
    torch.testing.assert_close(y_par, y_seq, **TOL)
    for name, a, b in zip(["x", "delta", "A", "B", "C", "D"], g_par, g_seq):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"gradient of {name} differs")


def test_exp_minus_softplus_is_one_minus_sigmoid():
    z = torch.linspace(-20, 20, 401, dtype=torch.float64)
    torch.testing.assert_close(torch.exp(-F.softplus(z)), 1 - torch.sigmoid(z), atol=1e-12, rtol=1e-9)


def test_scalar_state_with_a_minus_one_is_a_gated_recurrence():
    """N = 1, A = −1, B = C = 1, Δ = softplus(z): the decay exp(ΔA) is the forget gate 1 − σ(z)."""
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(1, 12, 1, generator=g), torch.randn(1, 12, 1, generator=g)
    delta = F.softplus(z)
    ones = torch.ones(1, 12, 1)
    y = selective_scan(x, delta, -torch.ones(1, 1), ones, ones)
    h, expected = torch.zeros(1), []
    for t in range(12):
        h = (1 - torch.sigmoid(z[0, t])) * h + delta[0, t] * x[0, t]
        expected.append(h)
    torch.testing.assert_close(y[0], torch.stack(expected), **TOL)


def test_scan_runs_in_float32_under_autocast():
    inputs = _scan_inputs()
    ref = selective_scan(*inputs)
    low = [t.bfloat16() for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = selective_scan(*low, mode="parallel")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.15, rtol=0.05)  # input rounding only


def test_block_step_loop_equals_forward():
    torch.manual_seed(0)
    block = MambaBlock(d_model=16, d_state=4)
    u = torch.randn(2, 11, 16)
    full = block(u)
    assert full.shape == (2, 11, 16)
    torch.testing.assert_close(block(u, scan_mode="parallel"), full, **TOL)
    state, outs = None, []
    for t in range(u.shape[1]):
        y, state = block.step(u[:, t], state)
        outs.append(y)
    assert state.conv.shape == (2, 32, 3) and state.ssm.shape == (2, 32, 4)
    torch.testing.assert_close(torch.stack(outs, 1), full, **TOL)


def test_block_is_causal():
    torch.manual_seed(0)
    block = MambaBlock(16, d_state=4)
    u = torch.randn(1, 10, 16)
    u2 = u.clone()
    u2[:, 7:] = torch.randn(1, 3, 16)
    torch.testing.assert_close(block(u)[:, :7], block(u2)[:, :7])


def test_block_initialisation():
    torch.manual_seed(0)
    d, n, dt_min, dt_max = 64, 8, 1e-3, 0.1
    block = MambaBlock(d, d_state=n, dt_min=dt_min, dt_max=dt_max)
    d_inner, rank = 2 * d, math.ceil(d / 16)
    assert block.d_inner == d_inner and block.dt_rank == rank
    torch.testing.assert_close(-torch.exp(block.A_log), -torch.arange(1, n + 1.0).repeat(d_inner, 1))
    torch.testing.assert_close(block.D.detach(), torch.ones(d_inner))
    dt = F.softplus(block.dt_proj.bias.detach())
    assert float(dt.min()) >= dt_min * 0.999 and float(dt.max()) <= dt_max * 1.001
    # parameters: the two big projections are 6·d² (2·E·d² in, E·d² out with E = 2)
    expected = (2 * d_inner * d + d_inner * d  # in_proj, out_proj
                + d_inner * 4 + d_inner  # depthwise conv + bias
                + d_inner * (rank + 2 * n) + rank * d_inner + d_inner  # x_proj, dt_proj
                + d_inner * n + d_inner)  # A_log, D
    assert sum(p.numel() for p in block.parameters()) == expected
    assert 2 * d_inner * d + d_inner * d == 6 * d * d


@pytest.mark.parametrize("change, match", [
    (dict(delta=torch.ones(2, 19, 5)), "delta must match"),
    (dict(A=torch.ones(5, 4)), r"A must be \(d_inner=6, N\)"),
    (dict(B=torch.ones(2, 19, 3)), r"B must be \(batch, L, N\)"),
    (dict(C=torch.ones(2, 18, 4)), r"C must be \(batch, L, N\)"),
    (dict(D=torch.ones(4)), "D must be"),
    (dict(x=torch.ones(19, 6)), "x must be"),
    (dict(mode="fast"), "mode must be"),
])
def test_scan_bad_inputs_raise(change, match):
    x, delta, A, B, C, D = _scan_inputs()
    args = dict(x=x, delta=delta, A=A, B=B, C=C, D=D) | change
    with pytest.raises(ValueError, match=match):
        selective_scan(**args)


def test_block_bad_inputs_raise():
    with pytest.raises(ValueError, match="scan_mode"):
        MambaBlock(8, scan_mode="fast")
    block = MambaBlock(8, d_state=2)
    with pytest.raises(ValueError, match=r"\(batch, L, d_model=8\)"):
        block(torch.randn(1, 4, 9))
    with pytest.raises(ValueError, match=r"\(batch, d_model=8\)"):
        block.step(torch.randn(1, 1, 8))
    with pytest.raises(ValueError, match="same shape"):
        linear_scan(torch.ones(2, 3), torch.ones(2, 4))


def test_a_log_and_d_are_marked_no_weight_decay_as_in_mamba_ssm():
    block = MambaBlock(16)
    marked = block.no_weight_decay_parameters()
    assert len(marked) == 2
    assert marked[0] is block.A_log and marked[1] is block.D
