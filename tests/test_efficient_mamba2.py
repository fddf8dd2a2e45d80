"""tfm_course.efficient.mamba2: SSD's recurrent and chunked forms equal a naive scan and the
quadratic (masked-attention) form; state passing, causality, the mixer's step() == forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.efficient.mamba2 import Mamba2Mixer, Mamba2State, segsum, ssd, ssd_step
from tfm_course.models.mixers import make_mixer, state_bytes, tensor_bytes
from mixer_helpers import step_through

torch.set_num_threads(1)
B, H, L, P, N = 2, 3, 13, 4, 5


def _inputs(dtype=torch.float64, seed=0, length=L):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, length, P, generator=g, dtype=dtype)
    dt = F.softplus(torch.randn(B, H, length, generator=g, dtype=dtype))
    A = -torch.rand(H, generator=g, dtype=dtype) * 2 - 0.1
    Bm, Cm = (torch.randn(B, H, length, N, generator=g, dtype=dtype) for _ in range(2))
    D = torch.randn(H, generator=g, dtype=dtype)
    return x, dt, A, Bm, Cm, D


def _naive(x, dt, A, Bm, Cm, D):
    """The recurrence written out per batch, head and step: S = exp(ΔA) S + (Δx) Bᵀ, y = S C + D x."""
    y, states = torch.zeros_like(x), torch.zeros(B, H, P, N, dtype=x.dtype)
    for b in range(x.shape[0]):
        for h in range(x.shape[1]):
            S = torch.zeros(P, N, dtype=x.dtype)
            for t in range(x.shape[2]):
                S = torch.exp(dt[b, h, t] * A[h]) * S + torch.outer(dt[b, h, t] * x[b, h, t], Bm[b, h, t])
                y[b, h, t] = S @ Cm[b, h, t] + D[h] * x[b, h, t]
            states[b, h] = S
    return y, states


def test_segsum_is_the_sum_between_two_steps():
    a = torch.tensor([0.5, -1.0, 2.0, -0.25], dtype=torch.float64)
    s = segsum(a)
    for i in range(4):
        for j in range(4):
            want = a[j + 1:i + 1].sum() if i >= j else -float("inf")
            assert s[i, j] == want
    assert segsum(a[None].repeat(3, 1)).shape == (3, 4, 4)


@pytest.mark.parametrize("chunk_size", [1, 3, 5, L, L + 7])
def test_recurrent_and_chunked_equal_the_naive_scan(chunk_size):
    inputs = _inputs()
    want_y, want_state = _naive(*inputs)
    for mode in ("recurrent", "chunked"):
        y, state = ssd(*inputs, mode=mode, chunk_size=chunk_size)
        torch.testing.assert_close(y, want_y, atol=1e-11, rtol=1e-11)
        torch.testing.assert_close(state, want_state, atol=1e-11, rtol=1e-11)
    y32, _ = ssd(*(t.float() for t in inputs), mode="chunked", chunk_size=chunk_size)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), want_y, atol=1e-4, rtol=1e-4)


def test_duality_the_scan_is_masked_attention():
    """Y = (C Bᵀ ⊙ L) (ΔX) + D X with L_ij = a_{j+1} ⋯ a_i (a cumulative product, built directly)."""
    x, dt, A, Bm, Cm, D = _inputs()
    a = torch.exp(dt * A[:, None])  # (b, h, L)
    prod = torch.cumprod(a, dim=-1)
    decay = (prod[..., :, None] / prod[..., None, :]).tril()  # a_{j+1} ⋯ a_i for i ≥ j
    want = ((Cm @ Bm.transpose(-1, -2)) * decay) @ (dt[..., None] * x) + D[:, None, None] * x
    torch.testing.assert_close(ssd(x, dt, A, Bm, Cm, D)[0], want, atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_the_final_state_continues_the_sequence(mode):
    x, dt, A, Bm, Cm, D = _inputs()
    full, _ = ssd(x, dt, A, Bm, Cm, D, mode=mode, chunk_size=4)
    cut = 6
    _, state = ssd(*(t[:, :, :cut] for t in (x, dt)), A, Bm[:, :, :cut], Cm[:, :, :cut], D,
                   mode=mode, chunk_size=4)
    rest, _ = ssd(*(t[:, :, cut:] for t in (x, dt)), A, Bm[:, :, cut:], Cm[:, :, cut:], D,
                  mode=mode, chunk_size=4, initial_state=state)
    torch.testing.assert_close(rest, full[:, :, cut:], atol=1e-11, rtol=1e-11)
    y_t, _ = ssd_step(x[:, :, cut], dt[:, :, cut], A, Bm[:, :, cut], Cm[:, :, cut], D, state)
    torch.testing.assert_close(y_t, full[:, :, cut], atol=1e-11, rtol=1e-11)


def test_chunked_form_is_causal():
    inputs = list(_inputs())
    y, _ = ssd(*inputs, chunk_size=5)
    for index in (0, 1, 3, 4):  # x, dt, B, C at t = 7 (mid-chunk)
        changed = [t.clone() for t in inputs]
        changed[index][:, :, 7] += 1.0
        y2, _ = ssd(*changed, chunk_size=5)
        torch.testing.assert_close(y2[:, :, :7], y[:, :, :7], atol=1e-12, rtol=0)
        assert (y2[:, :, 7:] - y[:, :, 7:]).abs().max() > 1e-3


def test_ssd_rejects_bad_shapes_and_arguments():
    x, dt, A, Bm, Cm, D = _inputs()
    with pytest.raises(ValueError, match=r"x must be \(batch, heads, L, head_dim\), got \(2, 3, 13\)"):
        ssd(x[..., 0], dt, A, Bm, Cm)
    with pytest.raises(ValueError, match=r"dt must be .* = \(2, 3, 13\), got \(2, 3, 12\)"):
        ssd(x, dt[..., 1:], A, Bm, Cm)
    with pytest.raises(ValueError, match=r"A must be \(heads,\) = \(3,\), got \(2,\)"):
        ssd(x, dt, A[:2], Bm, Cm)
    with pytest.raises(ValueError, match=r"B and C .* got B \(2, 3, 13, 5\), C \(2, 3, 13, 4\)"):
        ssd(x, dt, A, Bm, Cm[..., 1:])
    with pytest.raises(ValueError, match=r"D must be \(heads,\) = \(3,\), got \(3, 1\)"):
        ssd(x, dt, A, Bm, Cm, D[:, None])
    with pytest.raises(ValueError, match=r"initial_state must be .* = \(2, 3, 4, 5\), got \(2, 3, 5, 4\)"):
        ssd(x, dt, A, Bm, Cm, initial_state=torch.zeros(2, 3, 5, 4, dtype=x.dtype))
    with pytest.raises(ValueError, match="mode must be one of"):
        ssd(x, dt, A, Bm, Cm, mode="parallel")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer, got 0"):
        ssd(x, dt, A, Bm, Cm, chunk_size=0)


# --------------------------------------------------------------------------- the mixer
def _mixer(**kwargs) -> Mamba2Mixer:
    torch.manual_seed(0)
    return Mamba2Mixer(16, 4, d_state=6, chunk_size=5, **kwargs).double().eval()


def test_mixer_forward_forms_and_step_agree():
    mixer, x = _mixer(), torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        chunked, recurrent = mixer(x), mixer(x, mode="recurrent")
        stepped, state = step_through(mixer, x)
    assert chunked.shape == x.shape
    torch.testing.assert_close(recurrent, chunked, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(stepped, chunked, atol=1e-12, rtol=1e-12)
    assert isinstance(state, Mamba2State)
    assert state.conv.shape == (2, 3, 32 + 2 * 6) and state.ssm.shape == (2, 4, 8, 6)
    torch.testing.assert_close(mixer(x, chunk_size=100), chunked, atol=1e-12, rtol=1e-12)


def test_mixer_is_causal_and_its_state_bytes_are_what_step_carries():
    mixer, x = _mixer(), torch.randn(2, 12, 16, dtype=torch.float64)
    later = x.clone()
    later[:, 8] += 1.0
    with torch.no_grad():
        y, y2 = mixer(x), mixer(later)
    torch.testing.assert_close(y2[:, :8], y[:, :8], atol=1e-12, rtol=0)
    assert (y2[:, 8:] - y[:, 8:]).abs().max() > 1e-3
    mixer = make_mixer("mamba2", 16, 4)
    _, state = mixer.step(torch.randn(3, 16))
    assert tensor_bytes(state) == 3 * state_bytes(mixer, 1) == 3 * 4 * (3 * (32 + 32) + 32 * 16)
    assert state_bytes(mixer, 1000) == state_bytes(mixer, 1)
    assert {id(p) for p in mixer.no_weight_decay_parameters()} == {
        id(mixer.A_log), id(mixer.D), id(mixer.dt_bias), id(mixer.norm.weight)}
    assert bool((-torch.exp(mixer.A_log) < 0).all())


def test_mixer_keeps_its_state_in_float32_under_autocast():
    torch.manual_seed(0)
    mixer, x = Mamba2Mixer(16, 2), torch.randn(2, 6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mixer(x)
        _, state = mixer.step(x[:, 0])
    assert torch.isfinite(y).all() and state.ssm.dtype == torch.float32


def test_mixer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="d_inner = expand·d_model = 32 must split into num_heads=3"):
        Mamba2Mixer(16, 3)
    with pytest.raises(ValueError, match="d_state and d_conv must be >= 1, got 0 and 4"):
        Mamba2Mixer(16, 2, d_state=0)
    mixer = Mamba2Mixer(16, 2)
    with pytest.raises(ValueError, match=r"input must be \(batch, L, d_model=16\), got \(2, 5, 8\)"):
        mixer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"u_t must be \(batch, d_model=16\), got \(2, 1, 16\)"):
        mixer.step(torch.randn(2, 1, 16))
    with pytest.raises(ValueError, match="short_conv applies to"):
        make_mixer("mamba2", 16, 2, short_conv=4)
