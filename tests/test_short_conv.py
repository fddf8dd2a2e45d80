"""tfm_course.efficient.short_conv and make_mixer(short_conv=k): the formula, step == forward,
causality, parameters, and the window counted in state_bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.efficient.short_conv import ShortConvolution, short_convolution
from tfm_course.models.mixer_lm import MixerLM, count_parameters
from tfm_course.models.mixers import CONV_CAPABLE_KINDS, make_mixer, state_bytes, tensor_bytes
from mixer_helpers import step_through as _steps

D, HEADS = 16, 2


def _mixer(kind: str, k: int | None, seed: int = 0):
    torch.manual_seed(seed)
    return make_mixer(kind, D, HEADS, short_conv=k).eval()


def test_short_convolution_is_the_formula():
    """y_t[c] = silu(sum_j w[c, j] x_{t-k+1+j}[c]) with zeros before the start, by explicit loops."""
    torch.manual_seed(0)
    conv, x = ShortConvolution(5, 3), torch.randn(2, 7, 5)
    y, window = conv(x)
    w = conv.weight[:, 0]  # (channels, k)
    want = torch.zeros_like(x)
    for t in range(7):
        for j in range(3):
            s = t - 2 + j
            if s >= 0:
                want[:, t] += w[:, j] * x[:, s]
    torch.testing.assert_close(y, F.silu(want))
    torch.testing.assert_close(window, x[:, -2:])  # the last k - 1 inputs
    plain = ShortConvolution(5, 3, activation=None)
    with torch.no_grad():
        plain.weight.copy_(conv.weight)
    torch.testing.assert_close(plain(x)[0], want)


def test_short_convolution_stepwise_and_in_pieces_equals_whole():
    torch.manual_seed(1)
    conv, x = ShortConvolution(6, 4, bias=True), torch.randn(3, 11, 6)
    whole, last = conv(x)
    window, outs = None, []
    for x_t in x.unbind(1):
        y_t, window = conv(x_t[:, None], window)
        outs.append(y_t)
    torch.testing.assert_close(torch.cat(outs, 1), whole)
    torch.testing.assert_close(window, last)
    head, window = conv(x[:, :2])  # a prefix shorter than the window, then the rest
    tail, _ = conv(x[:, 2:], window)
    torch.testing.assert_close(torch.cat([head, tail], 1), whole)


def test_short_convolution_parameters_and_bad_input():
    assert count_parameters(ShortConvolution(10, 4)) == 10 * 4
    assert count_parameters(ShortConvolution(10, 4, bias=True)) == 10 * 4 + 10
    assert ShortConvolution(10, 4).window_values == 30
    assert short_convolution(8, None) is None and short_convolution(8, 0) is None
    assert short_convolution(8, 2).size == 2
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="short_conv must be"):
            short_convolution(8, bad)
    with pytest.raises(ValueError, match="activation"):
        ShortConvolution(4, 2, activation="gelu")
    conv = ShortConvolution(4, 3)
    with pytest.raises(ValueError, match=r"channels=4"):
        conv(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"window must be .* \(2, 2, 4\)"):
        conv(torch.randn(2, 5, 4), torch.zeros(2, 3, 4))


@pytest.mark.parametrize("kind", CONV_CAPABLE_KINDS)
def test_mixer_with_short_conv_steps_like_forward(kind):
    mixer, x = _mixer(kind, 4), torch.randn(2, 70, D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        steps, state = _steps(mixer, x)
        parallel = mixer(x)
    torch.testing.assert_close(steps, parallel, atol=2e-5, rtol=1e-4)
    assert state.conv.shape == (2, 3, mixer.qkv_conv.channels)


@pytest.mark.parametrize("kind", CONV_CAPABLE_KINDS)
def test_mixer_with_short_conv_is_causal_and_the_conv_matters(kind):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 12, D, generator=g)
    later = x.clone()
    later[:, 8] += torch.randn(2, D, generator=g)  # perturb one future token only
    mixer = _mixer(kind, 4)
    with torch.no_grad():
        y, y_later = mixer(x), mixer(later)
        without = _mixer(kind, None)(x)
    torch.testing.assert_close(y_later[:, :8], y[:, :8], atol=1e-6, rtol=1e-6)  # the past: unchanged
    assert (y_later[:, 8:] - y[:, 8:]).abs().max() > 1e-3
    assert (y - without).abs().max() > 1e-3  # same seed, the conv changes the outputs


@pytest.mark.parametrize("kind", CONV_CAPABLE_KINDS)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_short_conv_parameters_and_state_bytes(kind, k):
    off, on = _mixer(kind, None), _mixer(kind, k)
    channels = on.qkv_conv.channels
    assert channels == 3 * D  # q, k and v (value_factor 1)
    assert count_parameters(on) - count_parameters(off) == channels * k  # no bias
    assert state_bytes(on, 9) - state_bytes(off, 9) == (k - 1) * channels * 4
    for length in (1, 5):
        _, state = _steps(on, torch.randn(3, length, D))
        assert tensor_bytes(state) == 3 * state_bytes(on, length)
    assert _mixer(kind, 0).qkv_conv is None  # 0 is off, like None


def test_mixer_lm_with_short_conv_matches_parameters_and_generates():
    torch.manual_seed(0)
    attention = MixerLM(40, "attention", d_model=32).num_parameters()
    model = MixerLM(40, "retnet", d_model=32, short_conv=4).eval()
    assert abs(model.num_parameters() - attention) / attention < 0.01  # the FFN made room
    assert all(layer.mixer.qkv_conv.size == 4 for layer in model.layers)
    tokens = torch.randint(40, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        last, state = model.prefill(tokens)
    torch.testing.assert_close(last, full[:, -1], atol=2e-5, rtol=1e-4)
    assert tensor_bytes(state) == 2 * model.state_bytes(9)


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_short_conv_is_refused_where_it_does_not_apply(kind):
    with pytest.raises(ValueError, match="short_conv applies to"):
        make_mixer(kind, D, HEADS, short_conv=4)
    assert make_mixer(kind, D, HEADS, short_conv=0) is not None  # off is always fine
    with pytest.raises(ValueError, match="short_conv applies to"):
        MixerLM(40, "hybrid", d_model=32, short_conv=4)
