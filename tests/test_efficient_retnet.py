"""Retention: parallel, recurrent and chunkwise forms agree; so does the layer's step() loop."""

from __future__ import annotations

import pytest
import torch

from tfm_course.efficient.retnet import (MultiScaleRetention, _rotate, decay_mask, default_gammas,
                                         retention)

B, H, L, DK, DV = 2, 3, 23, 8, 5
TOL = dict(atol=1e-5, rtol=1e-4)


def _inputs(dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, L, DK, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, L, DV, generator=g, dtype=dtype)
    gamma = torch.tensor([0.5, 0.9, 1.0])  # includes no decay at all
    return q, k, v, gamma


def _by_definition(q, k, v, gamma):
    """out_n = Σ_{m ≤ n} γ^(n−m) (q_n · k_m) v_m, term by term (float64)."""
    out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    for n in range(q.shape[2]):
        for m in range(n + 1):
            w = gamma.double() ** (n - m) * (q[:, :, n] * k[:, :, m]).double().sum(-1)
            out[:, :, n] += w[..., None] * v[:, :, m].double()
    return out


def test_parallel_matches_the_definition_in_float64():
    q, k, v, gamma = (t.double() for t in _inputs())
    out = retention(q, k, v, gamma)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _by_definition(q, k, v, gamma), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 16, L, L + 9])  # 4, 7 and 16 do not divide 23
def test_parallel_recurrent_chunkwise_agree_fp32(chunk_size):
    q, k, v, gamma = _inputs()
    parallel = retention(q, k, v, gamma, mode="parallel")
    torch.testing.assert_close(retention(q, k, v, gamma, mode="recurrent"), parallel, **TOL)
    torch.testing.assert_close(retention(q, k, v, gamma, "chunkwise", chunk_size), parallel, **TOL)


def test_forms_agree_in_float64_to_machine_precision():
    q, k, v, gamma = (t.double() for t in _inputs(seed=1))
    parallel = retention(q, k, v, gamma)
    for out in (retention(q, k, v, gamma, "recurrent"), retention(q, k, v, gamma, "chunkwise", 5)):
        torch.testing.assert_close(out, parallel, atol=1e-12, rtol=1e-12)


def test_gradients_agree_between_forms():
    grads = {}
    for mode in ("parallel", "recurrent", "chunkwise"):
        q, k, v, gamma = (t.requires_grad_() if t.is_floating_point() and t.dim() == 4 else t
                          for t in _inputs(seed=2))
        retention(q, k, v, gamma, mode, chunk_size=6).square().sum().backward()
        grads[mode] = [q.grad, k.grad, v.grad]
    for mode in ("recurrent", "chunkwise"):
        for a, b in zip(grads[mode], grads["parallel"]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_scalar_gamma_and_default_chunk():
    q, k, v, _ = _inputs()
    torch.testing.assert_close(retention(q, k, v, 0.8), retention(q, k, v, torch.full((H,), 0.8)))
    torch.testing.assert_close(retention(q, k, v, 0.8, "chunkwise"), retention(q, k, v, 0.8), **TOL)


def test_decay_mask_is_elementwise_causal_decay():
    gamma = torch.tensor([0.5, 1.0])
    D = decay_mask(gamma, 4)
    assert D.shape == (2, 4, 4)
    n, m = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    expected = torch.where(n >= m, 0.5 ** (n - m).clamp(min=0).float(), torch.zeros(()))
    torch.testing.assert_close(D[0], expected)
    torch.testing.assert_close(D[1], torch.ones(4, 4).tril())


def test_default_gammas_follow_the_paper():
    g = default_gammas(4)
    torch.testing.assert_close(g, torch.tensor([1 - 2.0 ** -5, 1 - 2.0 ** -6, 1 - 2.0 ** -7, 1 - 2.0 ** -8]))


def test_rotation_makes_scores_depend_on_distance_only():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)
    inv_freq = 1.0 / 10000 ** torch.linspace(0, 1, 4)

    def score(n: int, m: int) -> torch.Tensor:
        qn = _rotate(q, torch.tensor([n]), inv_freq)
        km = _rotate(k, torch.tensor([m]), inv_freq)
        return (qn * km).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10))
    torch.testing.assert_close(score(0, 0), (q * k).sum())
    torch.testing.assert_close(_rotate(q, torch.tensor([7]), inv_freq).norm(), q.norm())


def test_layer_forms_and_step_loop_equal_parallel_forward():
    torch.manual_seed(0)
    layer = MultiScaleRetention(d_model=16, num_heads=2, value_factor=2).eval()
    x = torch.randn(2, 13, 16)
    full = layer(x)
    assert full.shape == (2, 13, 16)
    torch.testing.assert_close(layer(x, mode="chunkwise", chunk_size=4), full, **TOL)
    torch.testing.assert_close(layer(x, mode="recurrent"), full, **TOL)
    state, outs = None, []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        outs.append(y)
    assert state.position == 13 and state.memory.shape == (2, 2, 8, 16)
    torch.testing.assert_close(torch.stack(outs, 1), full, **TOL)


def test_layer_is_causal():
    torch.manual_seed(0)
    layer = MultiScaleRetention(16, 2)
    x = torch.randn(1, 10, 16)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(1, 4, 16)
    torch.testing.assert_close(layer(x)[:, :6], layer(x2)[:, :6])


def test_low_precision_inputs_are_summed_in_float32():
    q, k, v, gamma = _inputs()
    ref = retention(q, k, v, gamma)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = retention(q.bfloat16(), k.bfloat16(), v.bfloat16(), gamma, "chunkwise", 8)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)  # bf16 rounding of inputs only


@pytest.mark.parametrize("bad, match", [
    (dict(k=torch.randn(B, H, L, DK + 1)), "q and k"),
    (dict(v=torch.randn(B, H, L + 1, DV)), "v must be"),
    (dict(gamma=torch.ones(H + 1)), "gamma must be"),
    (dict(gamma=torch.tensor([0.5, 1.5, 0.9])), r"\(0, 1\]"),
    (dict(mode="fast"), "mode must be"),
    (dict(mode="chunkwise", chunk_size=0), "chunk_size"),
])
def test_bad_inputs_raise(bad, match):
    q, k, v, gamma = _inputs()
    args = dict(q=q, k=k, v=v, gamma=gamma) | bad
    with pytest.raises(ValueError, match=match):
        retention(**args)


def test_layer_bad_inputs_raise():
    with pytest.raises(ValueError, match="even size"):
        MultiScaleRetention(12, 4)  # d_k = 3 cannot be rotated in pairs
    layer = MultiScaleRetention(16, 2)
    with pytest.raises(ValueError, match=r"\(batch, L, d_model=16\)"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"\(batch, d_model=16\)"):
        layer.step(torch.randn(2, 1, 16))


@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunkwise"])
@pytest.mark.parametrize("gamma", [0.9, [0.9, 0.71, 1.0]], ids=["float", "list"])
def test_float64_inputs_keep_every_digit_of_a_python_gamma(mode, gamma):
    """γ given as Python numbers is not rounded to float32 (that alone costs ~4e-6 here)."""
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(B, H, L, DK, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, L, DV, generator=g, dtype=torch.float64)
    exact = torch.tensor(gamma, dtype=torch.float64).expand(H)
    out = retention(q, k, v, gamma, mode=mode, chunk_size=5)
    torch.testing.assert_close(out, _by_definition(q, k, v, exact), atol=1e-12, rtol=1e-12)
    rounded = exact.float().double()  # what a float32 γ would compute
    assert float((_by_definition(q, k, v, rounded) - out).abs().max()) > 1e-7


def test_layer_keeps_its_gammas_exact():
    layer = MultiScaleRetention(16, 2, gammas=[0.9, 0.8]).double()
    assert layer.gammas.dtype == torch.float64
    assert layer.gammas.tolist() == [0.9, 0.8]
