"""Tiled attention (the online softmax of FlashAttention) is exact softmax attention, in less memory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfm_course.experiments.measure import peak_tensor_bytes, saved_tensor_bytes
from tfm_course.efficient.flash import online_softmax_step, tiled_attention


def _qkv(shape=(2, 3, 37, 8), d_v=None, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (scale * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_()
    k = (scale * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_()
    v = torch.randn(*shape[:-1], d_v or shape[-1], generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _softmax_attention(q, k, v, causal=False):
    """The n × n definition, in the inputs' dtype."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, block_size", [((2, 3, 37, 8), 5), ((2, 3, 37, 8), 16),
                                               ((2, 3, 37, 8), 37), ((2, 3, 37, 8), 64),
                                               ((1, 2, 9, 4), 1)])  # 5 and 16 do not divide 37
def test_outputs_and_gradients_equal_softmax_attention_in_float64(causal, shape, block_size):
    q, k, v = _qkv(shape, d_v=5)
    out = tiled_attention(q, k, v, causal=causal, block_size=block_size)
    want = _softmax_attention(q, k, v, causal)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
    grad = torch.randn_like(want)
    got = torch.autograd.grad(out, (q, k, v), grad)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", got, expected):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=f"d{name} differs")


@pytest.mark.parametrize("causal", [False, True])
def test_hand_written_backward_passes_gradcheck(causal):
    q, k, v = _qkv((1, 1, 7, 4))
    assert torch.autograd.gradcheck(
        lambda q, k, v: tiled_attention(q, k, v, causal=causal, block_size=3), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_float32_matches_pytorch_sdpa(causal):
    q, k, v = (t.detach().float() for t in _qkv((3, 2, 130, 16), scale=2.0))
    out = tiled_attention(q, k, v, causal=causal, block_size=32)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                               atol=2e-6, rtol=1e-5)


def test_cross_attention_lengths_and_three_leading_dims():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 3, 9, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 3, 21, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 3, 21, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(tiled_attention(q, k, v, block_size=8), _softmax_attention(q, k, v),
                               atol=1e-12, rtol=1e-12)


def test_large_scores_do_not_overflow():
    q, k, v = (t.detach().float() for t in _qkv(scale=30.0))  # scores in the hundreds
    out = tiled_attention(q, k, v, block_size=8)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, _softmax_attention(q.double(), k.double(), v.double()).float(),
                               atol=1e-4, rtol=1e-4)


def test_half_precision_inputs_come_back_in_their_dtype():
    q, k, v = (t.detach().float() for t in _qkv())
    ref = tiled_attention(q, k, v)
    out = tiled_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


def test_online_step_over_tiles_equals_softmax_and_survives_masked_tiles():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(4, 12, generator=g, dtype=torch.float64) * 3
    scores[0, :6] = -math.inf  # row 0: its whole first tile is masked
    values = torch.randn(12, 5, generator=g, dtype=torch.float64)
    m = torch.full((4, 1), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4, 5, dtype=torch.float64)
    m, l, acc = online_softmax_step(m, l, acc, scores[:, :6], values[:6])
    assert float(m[0]) == -math.inf and float(l[0]) == 0 and not bool(acc.isnan().any())
    m, l, acc = online_softmax_step(m, l, acc, scores[:, 6:], values[6:])
    torch.testing.assert_close(acc / l, torch.softmax(scores, -1) @ values, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(m, scores.amax(-1, keepdim=True))
    torch.testing.assert_close(l, torch.exp(scores - m).sum(-1, keepdim=True))


def test_memory_grows_linearly_while_the_naive_path_grows_quadratically():
    """Forward peak and the activations kept for backward: O(n·d) tiled, O(n²) naive."""
    def measure(n):
        q, k, v = (t.detach().float().requires_grad_() for t in _qkv((1, 2, n, 16)))
        tiled = lambda: tiled_attention(q, k, v, block_size=32)  # noqa: E731
        naive = lambda: _softmax_attention(q, k, v)  # noqa: E731
        with torch.no_grad():
            peaks = peak_tensor_bytes(tiled), peak_tensor_bytes(naive)
        return peaks, (saved_tensor_bytes(tiled), saved_tensor_bytes(naive))

    (p_tiled_1, p_naive_1), (s_tiled_1, s_naive_1) = measure(64)
    (p_tiled_4, p_naive_4), (s_tiled_4, s_naive_4) = measure(256)
    assert p_naive_4 / p_naive_1 > 12 and s_naive_4 / s_naive_1 > 10  # ~16: quadratic
    assert p_tiled_4 / p_tiled_1 < 5 and s_tiled_4 / s_tiled_1 < 5  # ~4: linear
    matrix_bytes, row_bytes = 2 * 256 * 16 * 4, 2 * 256 * 4  # (heads, n, d) and (heads, n, 1)
    assert s_tiled_4 == 4 * matrix_bytes + row_bytes  # exactly q, k, v, out and the log-sum-exp
    assert s_naive_4 > 2 * 256 * 256 * 4  # at least one (heads, n, n) fp32 matrix


@pytest.mark.parametrize("shapes, kwargs, match", [
    (((2, 5, 8), (2, 6, 8), (2, 6, 8)), {"causal": True}, "n_q = n_k"),
    (((2, 5, 8), (2, 5, 7), (2, 5, 8)), {}, "share d"),
    (((2, 5, 8), (2, 5, 8), (2, 4, 8)), {}, "same number of keys"),
    (((2, 5, 8), (3, 5, 8), (3, 5, 8)), {}, "leading dims"),
    (((8,), (5, 8), (5, 8)), {}, r"\(\.\.\., n, d\)"),
    (((2, 5, 8), (2, 0, 8), (2, 0, 8)), {}, "at least one key"),
    (((2, 5, 8),) * 3, {"block_size": 0}, "block_size"),
    (((2, 5, 8),) * 3, {"block_size": 2.5}, "block_size"),
])
def test_bad_inputs_raise_clear_errors(shapes, kwargs, match):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        tiled_attention(q, k, v, **kwargs)
