"""tfm_course.positional: sinusoidal, learned, rotary, ALiBi and T5 relative bias."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.attention import MultiHeadAttention, causal_mask
from tfm_course.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    relative_position_bucket,
    rotate_half,
    sinusoidal_encoding,
)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- sinusoidal
def test_sinusoidal_matches_the_formula_written_with_scalars():
    max_len, d = 12, 8
    pe = sinusoidal_encoding(max_len, d)
    assert pe.shape == (max_len, d) and pe.dtype == torch.float32
    for p in range(max_len):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert math.isclose(pe[p, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_first_rows_are_not_the_seed_table():
    pe = sinusoidal_encoding(2, 8)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 4))  # not 0.01, 1.00, ... (ERRATA 4)
    # dims 2-3 at position 1: angle 1/10000^(2/8) = 0.1 -> (sin, cos) = (0.0998, 0.995), not (0.01, 1.00)
    assert math.isclose(pe[1, 2].item(), math.sin(0.1), abs_tol=1e-6)
    assert math.isclose(pe[1, 3].item(), math.cos(0.1), abs_tol=1e-6)


def test_sinusoidal_shift_is_a_position_independent_block_rotation():
    d, k = 16, 5
    pe = sinusoidal_encoding(64, d).double()
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(omega):
        c, s = math.cos(k * w), math.sin(k * w)
        m[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
    assert torch.allclose(pe[k:], pe[:-k] @ m.T, atol=1e-5)


def test_sinusoidal_dot_product_depends_only_on_distance():
    pe = sinusoidal_encoding(40, 32).double()
    gram = pe @ pe.T
    for offset in range(-10, 11):
        diagonal = torch.diagonal(gram, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)
    assert torch.allclose(torch.diagonal(gram, 3), torch.diagonal(gram, -3))


@pytest.mark.parametrize("args", [(10, 7), (0, 8), (10, 0), (-1, 4)])
def test_sinusoidal_rejects_bad_sizes(args):
    with pytest.raises(ValueError):
        sinusoidal_encoding(*args)


def test_sinusoidal_module_broadcasts_over_the_batch_batch_first():
    module = SinusoidalPositionalEncoding(8, max_len=20)
    x = torch.zeros(3, 5, 8)  # (batch, seq, d): the same row must be added to every sequence
    out = module(x)
    for b in range(3):
        assert torch.equal(out[b], sinusoidal_encoding(20, 8)[:5])
    assert torch.equal(module(x, offset=4)[0], sinusoidal_encoding(20, 8)[4:9])


def test_sinusoidal_module_buffer_is_not_saved_but_moves():
    module = SinusoidalPositionalEncoding(8, max_len=20)
    assert "pe" not in module.state_dict()
    assert "pe" in dict(module.named_buffers())
    assert module.to(torch.float64).pe.dtype == torch.float64


@pytest.mark.parametrize("shape, offset", [((2, 21, 8), 0), ((2, 5, 8), 16), ((2, 5, 6), 0), ((5, 8), 0)])
def test_sinusoidal_module_rejects_bad_input(shape, offset):
    with pytest.raises(ValueError, match="max_len|batch, seq"):
        SinusoidalPositionalEncoding(8, max_len=20)(torch.zeros(shape), offset=offset)


# --------------------------------------------------------------------------- learned
def test_learned_embedding_counts_and_adds_rows():
    module = LearnedPositionalEmbedding(10, 4)
    assert sum(p.numel() for p in module.parameters()) == 10 * 4
    x = randn(2, 3, 4)
    assert torch.equal(module(x), x + module.weight[:3])
    assert torch.equal(module(x, offset=7), x + module.weight[7:10])


def test_learned_embedding_only_trains_rows_it_sees():
    module = LearnedPositionalEmbedding(10, 4)
    module(randn(2, 6, 4)).sum().backward()
    assert module.weight.grad[:6].abs().sum() > 0
    assert torch.equal(module.weight.grad[6:], torch.zeros(4, 4))


@pytest.mark.parametrize("seq, offset", [(11, 0), (4, 7), (1, -1)])
def test_learned_embedding_past_max_len_is_a_clear_value_error(seq, offset):
    with pytest.raises(ValueError, match="max_len=10"):
        LearnedPositionalEmbedding(10, 4)(torch.zeros(1, seq, 4), offset=offset)


def test_learned_embedding_rejects_bad_shapes_and_sizes():
    with pytest.raises(ValueError, match="batch, seq"):
        LearnedPositionalEmbedding(10, 4)(torch.zeros(3, 4))
    with pytest.raises(ValueError):
        LearnedPositionalEmbedding(0, 4)


# --------------------------------------------------------------------------- rotary
def rope_adjacent_complex(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    """The RoFormer / Meta LLaMA formulation: adjacent pairs as complex numbers times e^{i p θ}."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    position = torch.arange(offset, offset + x.shape[-2], dtype=torch.float64)
    rotation = torch.polar(torch.ones(len(position), d // 2, dtype=torch.float64),
                           position[:, None] * theta)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rotation).flatten(-2)


def halves_permutation(d: int) -> torch.Tensor:
    return torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))


def test_rotate_half():
    assert torch.equal(rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])), torch.tensor([-3.0, -4.0, 1.0, 2.0]))


@pytest.mark.parametrize("offset", [0, 9])
def test_rotary_equals_the_complex_adjacent_pair_form_up_to_a_fixed_permutation(offset):
    d = 16
    perm = halves_permutation(d)
    x = randn(2, 3, 7, d)  # adjacent layout
    ours = RotaryEmbedding(d).rotate(x[..., perm], offset=offset)  # split-halves layout
    assert torch.allclose(ours.double(), rope_adjacent_complex(x, offset)[..., perm], atol=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(8)
    q, k = randn(1, 1, 1, 8, seed=1), randn(1, 1, 1, 8, seed=2)
    q_line, k_line = q.expand(1, 1, 30, 8), k.expand(1, 1, 30, 8)
    qr, kr = rope(q_line, k_line)
    scores = (qr @ kr.transpose(-1, -2))[0, 0]  # (30, 30): q at m, k at n
    for offset in range(-5, 6):
        diagonal = torch.diagonal(scores, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4)


def test_rotary_keeps_norms_position_zero_and_dtype():
    rope = RotaryEmbedding(8)
    x = randn(2, 2, 6, 8)
    out = rope.rotate(x)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(out[..., 0, :], x[..., 0, :])
    assert rope.rotate(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert "inv_freq" not in rope.state_dict()


def test_rotary_offset_matches_the_tail_of_the_full_sequence():
    rope = RotaryEmbedding(8)
    q, k = randn(1, 2, 10, 8, seed=3), randn(1, 2, 10, 8, seed=4)
    full_q, full_k = rope(q, k)
    tail_q, tail_k = rope(q[..., 7:, :], k[..., 7:, :], offset=7)
    assert torch.allclose(tail_q, full_q[..., 7:, :], atol=1e-6)
    assert torch.allclose(tail_k, full_k[..., 7:, :], atol=1e-6)


class ShiftedRotary(RotaryEmbedding):
    """RoPE as if the whole sequence started at position 13."""

    def forward(self, q, k, offset=0):
        return super().forward(q, k, offset=13)


def test_rotary_inside_attention_is_shift_invariant_and_not_a_no_op():
    x = randn(2, 6, 16)
    torch.manual_seed(0)
    a = MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4))
    b = MultiHeadAttention(16, 4, rotary=ShiftedRotary(4))
    plain = MultiHeadAttention(16, 4)
    b.load_state_dict(a.state_dict())
    plain.load_state_dict(a.state_dict())
    mask = causal_mask(6)
    assert torch.allclose(a(x, mask=mask), b(x, mask=mask), atol=1e-5)
    assert not torch.allclose(a(x, mask=mask), plain(x, mask=mask), atol=1e-3)


@pytest.mark.parametrize("make, call", [
    (lambda: RotaryEmbedding(7), None),
    (lambda: RotaryEmbedding(8), lambda r: r.rotate(torch.zeros(2, 5, 8))),
    (lambda: RotaryEmbedding(8), lambda r: r.rotate(torch.zeros(1, 2, 5, 6))),
    (lambda: RotaryEmbedding(8), lambda r: r(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 5, 8))),
    (lambda: RotaryEmbedding(8), lambda r: r.rotate(torch.zeros(1, 2, 5, 8), offset=-1)),
])
def test_rotary_rejects_bad_input(make, call):
    with pytest.raises(ValueError):
        rope = make()
        call(rope)


# --------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_for_powers_of_two_are_the_geometric_sequence():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    for h in (1, 2, 4, 16, 32):
        slopes = alibi_slopes(h).double()
        assert math.isclose(slopes[0].item(), 2 ** (-8 / h), rel_tol=1e-6)
        assert torch.allclose(slopes[1:] / slopes[:-1], torch.full((h - 1,), 2 ** (-8 / h), dtype=torch.float64))


@pytest.mark.parametrize("h", [3, 6, 12, 24, 112])
def test_alibi_slopes_for_other_head_counts_interleave_the_next_power_of_two(h):
    closest = 2 ** int(math.log2(h))
    slopes = alibi_slopes(h)
    assert slopes.shape == (h,) and bool((slopes > 0).all())
    assert torch.equal(slopes[:closest], alibi_slopes(closest))
    assert torch.equal(slopes[closest:], alibi_slopes(2 * closest)[0::2][: h - closest])
    assert len(set(slopes.tolist())) == h


def test_alibi_bias_is_minus_slope_times_distance():
    bias = alibi_bias(4, 5)
    assert bias.shape == (1, 4, 5, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert math.isclose(bias[0, h, i, j].item(), -slopes[h].item() * abs(i - j), rel_tol=1e-6)


def test_alibi_queries_are_the_last_positions_when_fewer_than_keys():
    assert torch.equal(alibi_bias(4, 2, 7), alibi_bias(4, 7)[..., 5:, :])
    with pytest.raises(ValueError, match="n_q=8"):
        alibi_bias(4, 8, 7)
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_alibi_under_a_causal_mask_equals_the_key_position_only_bias():
    """The reference implementation adds slope·j; softmax ignores a per-row constant (slope·i)."""
    n = 6
    scores = randn(1, 4, n, n)
    mask = causal_mask(n)
    key_only = (alibi_slopes(4)[:, None, None] * torch.arange(n))[None].expand(1, 4, n, n)
    ours = torch.softmax((scores + alibi_bias(4, n)).masked_fill(~mask, float("-inf")), -1)
    theirs = torch.softmax((scores + key_only).masked_fill(~mask, float("-inf")), -1)
    assert torch.allclose(ours, theirs, atol=1e-6)


# --------------------------------------------------------------------------- T5
def bucket_scalar(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket for one relative position, written with plain Python numbers."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance",
                         [(True, 32, 128), (False, 32, 128), (True, 16, 40), (False, 8, 20)])
def test_relative_bucket_matches_a_scalar_implementation(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-400, 401)
    got = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long
    want = torch.tensor([bucket_scalar(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()])
    assert torch.equal(got, want)
    assert int(got.min()) >= 0 and int(got.max()) == num_buckets - 1


def test_relative_bucket_structure():
    rel = torch.arange(-200, 201)
    b = relative_position_bucket(rel, True, 32, 128)
    left, right = b[rel <= 0], b[rel > 0]
    assert int(left.max()) < 16 <= int(right.min())  # halves: keys to the left / right
    assert torch.equal(b[(rel >= -7) & (rel <= 0)], torch.arange(7, -1, -1))  # exact near the query
    assert bool((b[rel <= -128] == 15).all()) and bool((b[rel >= 128] == 31).all())  # saturates
    causal = relative_position_bucket(rel, False, 32, 128)
    assert bool((causal[rel > 0] == 0).all())  # future keys share bucket 0 (masked anyway)


@pytest.mark.parametrize("kwargs", [dict(num_buckets=31), dict(num_buckets=32, max_distance=8),
                                    dict(num_buckets=0)])
def test_relative_bucket_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        relative_position_bucket(torch.arange(5), True, **kwargs)
    with pytest.raises(ValueError, match="integer"):
        relative_position_bucket(torch.arange(5.0))


def test_t5_bias_shape_toeplitz_and_gradient():
    module = T5RelativeBias(num_heads=3, num_buckets=8, max_distance=20)
    bias = module(9)
    assert bias.shape == (1, 3, 9, 9)
    for offset in range(-8, 9):  # depends only on key − query
        diagonal = torch.diagonal(bias[0], offset, dim1=-2, dim2=-1)
        assert torch.equal(diagonal, diagonal[:, :1].expand_as(diagonal))
    assert torch.equal(module(2, 9), bias[..., 7:, :])
    bias.sum().backward()
    assert module.embedding.weight.grad.abs().sum() > 0


def test_t5_bias_plugs_into_attention():
    attention = MultiHeadAttention(12, 3)
    bias = T5RelativeBias(3)(5)
    out = attention(randn(2, 5, 12), position_bias=bias)
    assert out.shape == (2, 5, 12)


@pytest.mark.hf
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (128, 100), (64, 300), (16, 50)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_equal_hugging_face_at_every_distance(num_buckets, max_distance, bidirectional):
    """Same order of operations as T5: at exact bucket boundaries another order rounds differently
    (128 buckets, max distance 100, causal, -80 gave 95 instead of 96 before)."""
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    from tfm_course.positional import relative_position_bucket

    rel = torch.arange(-5000, 5001)
    ours = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance)
    theirs = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional,
                                                   num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(ours, theirs)
