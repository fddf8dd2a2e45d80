"""tfm_course.efficient.deltanet: the delta rule's step is its formula, the chunkwise (WY / UT) form
equals the recurrent one with and without the gate, the rule overwrites where linear attention adds,
the gate forgets; the mixer's step() == forward, causality, state bytes, and it trains."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.efficient.deltanet import DeltaNetMixer, DeltaNetState, delta_rule, delta_rule_step
from tfm_course.models.mixer_lm import count_parameters
from tfm_course.models.mixers import make_mixer, state_bytes, tensor_bytes
from mixer_helpers import step_through

torch.set_num_threads(1)
B, H, L, DK, DV = 2, 3, 13, 4, 5


def _inputs(gated: bool, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, DK, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(B, H, L, DK, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, L, DV, generator=g, dtype=dtype)
    beta = torch.rand(B, H, L, generator=g, dtype=dtype)
    log_alpha = -F.softplus(torch.randn(B, H, L, generator=g, dtype=dtype)) if gated else None
    return q, k, v, beta, log_alpha


@pytest.mark.parametrize("gated", [False, True])
def test_step_is_the_formula(gated):
    """S_t = α S (I − β k kᵀ) + β v kᵀ and o = S q, with explicit matrices."""
    q, k, v, beta, log_alpha = (t if t is None else t[:, :, 0] for t in _inputs(gated))
    state = torch.randn(B, H, DV, DK, dtype=torch.float64)
    alpha = torch.ones(B, H, dtype=torch.float64) if log_alpha is None else log_alpha.exp()
    eye = torch.eye(DK, dtype=torch.float64)
    want = torch.empty_like(state)
    for b in range(B):
        for h in range(H):
            kb, bb = k[b, h], beta[b, h]
            want[b, h] = alpha[b, h] * state[b, h] @ (eye - bb * torch.outer(kb, kb)) \
                + bb * torch.outer(v[b, h], kb)
    o, new = delta_rule_step(q, k, v, beta, log_alpha, state)
    torch.testing.assert_close(new, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(o, (want @ q[..., None])[..., 0], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 2, 5, L, L + 4])
def test_chunkwise_equals_recurrent(gated, chunk_size):
    inputs = _inputs(gated)
    want, want_state = delta_rule(*inputs, mode="recurrent")
    got, state = delta_rule(*inputs, mode="chunkwise", chunk_size=chunk_size)
    torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)
    torch.testing.assert_close(state, want_state, atol=1e-11, rtol=1e-11)
    got32, _ = delta_rule(*(None if t is None else t.float() for t in inputs), chunk_size=chunk_size)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["recurrent", "chunkwise"])
def test_the_final_state_continues_the_sequence(mode):
    q, k, v, beta, log_alpha = _inputs(gated=True)
    full, _ = delta_rule(q, k, v, beta, log_alpha, mode, chunk_size=4)
    cut = 6
    first = (t[:, :, :cut] for t in (q, k, v, beta, log_alpha))
    _, state = delta_rule(*first, mode=mode, chunk_size=4)
    rest = (t[:, :, cut:] for t in (q, k, v, beta, log_alpha))
    got, _ = delta_rule(*rest, mode=mode, chunk_size=4, initial_state=state)
    torch.testing.assert_close(got, full[:, :, cut:], atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("gated", [False, True])
def test_chunkwise_form_is_causal(gated):
    inputs = list(_inputs(gated))
    out, _ = delta_rule(*inputs, chunk_size=5)
    for index in range(5 if gated else 4):  # q, k, v, beta, log_alpha at t = 7 (mid-chunk)
        changed = [None if t is None else t.clone() for t in inputs]
        changed[index][:, :, 7] -= 0.3
        out2, _ = delta_rule(*changed, chunk_size=5)
        torch.testing.assert_close(out2[:, :, :7], out[:, :, :7], atol=1e-12, rtol=0)
        assert (out2[:, :, 7:] - out[:, :, 7:]).abs().max() > 1e-4


def test_delta_rule_overwrites_where_linear_attention_adds():
    """β = 1, orthonormal keys: writing v₂ under k₁'s key replaces v₁; a second key is untouched."""
    k1, k2 = torch.eye(4, dtype=torch.float64)[:2]
    v1, v2, v3 = torch.randn(3, 5, dtype=torch.float64)
    k = torch.stack([k1, k2, k1])[None, None]  # (1, 1, 3, 4)
    v = torch.stack([v1, v3, v2])[None, None]
    out, state = delta_rule(k, k, v, torch.ones(1, 1, 3, dtype=torch.float64))  # q = k: read back
    torch.testing.assert_close(out[0, 0, 2], v2)  # linear attention would read v1 + v2
    torch.testing.assert_close(state[0, 0] @ k2, v3)
    torch.testing.assert_close(out[0, 0, 1], v3)


def test_the_gate_forgets():
    """log α = −∞ at step t (α = 0): the outputs from t on equal a run that starts at t."""
    q, k, v, beta, log_alpha = _inputs(gated=True)
    log_alpha[:, :, 6] = -1e4
    full, _ = delta_rule(q, k, v, beta, log_alpha, chunk_size=4)
    rest, _ = delta_rule(*(t[:, :, 6:] for t in (q, k, v, beta, log_alpha)), chunk_size=4)
    torch.testing.assert_close(full[:, :, 6:], rest, atol=1e-12, rtol=1e-12)


def test_delta_rule_rejects_bad_shapes_and_arguments():
    q, k, v, beta, log_alpha = _inputs(gated=True)
    with pytest.raises(ValueError, match=r"q and k .* got q \(2, 3, 13, 4\), k \(2, 3, 13, 3\)"):
        delta_rule(q, k[..., 1:], v, beta)
    with pytest.raises(ValueError, match=r"v must be .* = \(2, 3, 13\) \+ \(d_v,\); got \(2, 3, 12, 5\)"):
        delta_rule(q, k, v[:, :, 1:], beta)
    with pytest.raises(ValueError, match=r"beta must be .* = \(2, 3, 13\), got \(2, 3, 13, 1\)"):
        delta_rule(q, k, v, beta[..., None])
    with pytest.raises(ValueError, match=r"log_alpha must be .* = \(2, 3, 13\), got \(2, 13\)"):
        delta_rule(q, k, v, beta, log_alpha[:, 0])
    with pytest.raises(ValueError, match=r"initial_state must be .* = \(2, 3, 5, 4\), got \(2, 3, 4, 5\)"):
        delta_rule(q, k, v, beta, initial_state=torch.zeros(2, 3, 4, 5, dtype=q.dtype))
    with pytest.raises(ValueError, match="mode must be one of"):
        delta_rule(q, k, v, beta, mode="parallel")
    with pytest.raises(ValueError, match="chunk_size must be a positive integer, got 0"):
        delta_rule(q, k, v, beta, chunk_size=0)


# --------------------------------------------------------------------------- the mixer
def _mixer(gated: bool, short_conv: int | None = 4) -> DeltaNetMixer:
    torch.manual_seed(0)
    return DeltaNetMixer(16, 2, gated=gated, short_conv=short_conv, chunk_size=5).double().eval()


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("short_conv", [4, 0])
def test_mixer_forward_forms_and_step_agree(gated, short_conv):
    mixer, x = _mixer(gated, short_conv), torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        chunkwise, recurrent = mixer(x), mixer(x, mode="recurrent")
        stepped, state = step_through(mixer, x)
    assert chunkwise.shape == x.shape
    torch.testing.assert_close(recurrent, chunkwise, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(stepped, chunkwise, atol=1e-12, rtol=1e-12)
    assert isinstance(state, DeltaNetState) and state.memory.shape == (2, 2, 8, 8)
    assert (state.conv is None) == (short_conv == 0)


@pytest.mark.parametrize("gated", [False, True])
def test_mixer_is_causal_and_its_state_bytes_are_what_step_carries(gated):
    mixer, x = _mixer(gated), torch.randn(2, 12, 16, dtype=torch.float64)
    later = x.clone()
    later[:, 8] += 1.0
    with torch.no_grad():
        y, y2 = mixer(x), mixer(later)
    torch.testing.assert_close(y2[:, :8], y[:, :8], atol=1e-12, rtol=0)
    assert (y2[:, 8:] - y[:, 8:]).abs().max() > 1e-3
    kind = "gated_deltanet" if gated else "deltanet"
    for short_conv, window in ((4, 3 * 48), (None, 0)):
        mixer = make_mixer(kind, 16, 2, short_conv=short_conv)
        _, state = mixer.step(torch.randn(3, 16))
        assert tensor_bytes(state) == 3 * state_bytes(mixer, 1) == 3 * 4 * (2 * 8 * 8 + window)
        assert state_bytes(mixer, 500) == state_bytes(mixer, 1)


def test_mixer_parameters_and_gate():
    plain, gated = DeltaNetMixer(16, 2), DeltaNetMixer(16, 2, gated=True)
    assert count_parameters(plain) == 4 * 16 * 16 + 16 * 2 + 48 * 4 + 8  # q k v o, β, conv, norm
    assert count_parameters(gated) - count_parameters(plain) == 16 * 2 + 2 + 2  # a_proj, A, dt_bias
    assert DeltaNetMixer(16, 2, short_conv=None).qkv_conv is None
    x = torch.randn(1, 4, 16)
    log_alpha = gated._inputs(x)[4]
    assert log_alpha.shape == (1, 4, 2) and bool((log_alpha < 0).all())
    flagged = {n for n, p in gated.named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert flagged == {"A_log", "dt_bias", "o_norm.weight"}


def test_mixer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="d_model 16 must split into num_heads=3 heads"):
        DeltaNetMixer(16, 3)
    with pytest.raises(ValueError, match="short_conv must be"):
        DeltaNetMixer(16, 2, short_conv=-1)
    mixer = DeltaNetMixer(16, 2)
    with pytest.raises(ValueError, match=r"x must be \(batch, L, d_model=16\), got \(2, 5, 8\)"):
        mixer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"x_t must be \(batch, d_model=16\), got \(2, 1, 16\)"):
        mixer.step(torch.randn(2, 1, 16))
