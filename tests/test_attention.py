"""Unit tests of tfm_course.attention's functions (MultiHeadAttention has its own tests).

Every function: the right values, parity with PyTorch where PyTorch has the same thing, bad input
-> ValueError naming the shapes, and fully masked rows -> zeros (no NaN) in fp32 / fp16 / bf16.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfm_course.attention import (
    causal_mask,
    check_mask,
    fused_attention,
    masked_softmax,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
ATTENTIONS = [scaled_dot_product_attention, fused_attention]


def qkv(*lead: int, n_q: int = 5, n_k: int = 7, d_k: int = 8, d_v: int = 6, seed: int = 0,
        dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(*lead, n_q, d_k), (*lead, n_k, d_k), (*lead, n_k, d_v)]
    return tuple(torch.randn(*s, generator=g).to(dtype) for s in shapes)


def random_mask(*shape: int, seed: int = 1, empty_rows: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*shape, generator=g) > 0.4
    mask[..., 0] = True  # every row has a key ...
    for row in empty_rows:
        mask[..., row, :] = False  # ... except these
    return mask


# --------------------------------------------------------------------------- the maths
def test_sdpa_is_softmax_of_scaled_scores_times_v():
    q, k, v = qkv(2, 3)
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    expected_weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected_weights @ v)
    assert out.shape == (2, 3, 5, 6) and weights.shape == (2, 3, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("lead", [(), (4,), (2, 3)], ids=["2d", "3d", "4d"])
def test_parity_with_pytorch_without_mask(attention, lead):
    q, k, v = qkv(*lead)
    torch.testing.assert_close(attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (2, 1, 1, 7)])
def test_parity_with_pytorch_with_bool_masks(attention, mask_shape):
    q, k, v = qkv(2, 3)
    mask = random_mask(*mask_shape)
    torch.testing.assert_close(attention(q, k, v, mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_causal_mask_matches_pytorch_is_causal(attention):
    q, k, v = qkv(2, 3, n_q=6, n_k=6)
    torch.testing.assert_close(attention(q, k, v, causal_mask(6)),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_bias_is_added_to_the_scaled_scores_like_pytorch_float_mask(attention):
    q, k, v = qkv(2, 3)
    bias = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(attention(q, k, v, bias=bias),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_bias_and_mask_together(attention):
    q, k, v = qkv(2, 3)
    bias = torch.randn(5, 7, generator=torch.Generator().manual_seed(6))
    mask = random_mask(2, 1, 5, 7)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")))
    torch.testing.assert_close(attention(q, k, v, mask, bias=bias), expected)


def test_weights_are_zero_on_blocked_keys_and_sum_to_one():
    q, k, v = qkv(2, 3)
    mask = random_mask(2, 3, 5, 7)
    _, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert (weights[~mask] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_output_does_not_depend_on_masked_keys_and_values():
    q, k, v = qkv(2, n_k=7)
    mask = padding_mask(torch.tensor([7, 4]), 7)[:, None, :]  # (batch, 1, n_k)
    k2, v2 = k.clone(), v.clone()
    k2[1, 4:], v2[1, 4:] = 1e4, -1e4  # garbage in the padded positions
    for attention in ATTENTIONS:
        torch.testing.assert_close(attention(q, k, v, mask), attention(q, k2, v2, mask))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_low_precision_matches_fp32_and_keeps_dtype(attention, dtype):
    q, k, v = qkv(2, 3, dtype=dtype)
    mask = random_mask(2, 1, 5, 7)
    out = attention(q, k, v, mask)
    assert out.dtype == dtype
    reference = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(out.float(), reference, atol=ATOL[dtype] * 5, rtol=ATOL[dtype] * 5)


def test_dropout_zeroes_some_weights_and_rescales_the_rest():
    torch.manual_seed(0)
    q, k, v = qkv(4, 8, n_q=16, n_k=16)
    _, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    _, dropped = scaled_dot_product_attention(q, k, v, return_weights=True, dropout_p=0.5)
    zeroed = dropped == 0
    assert 0.3 < zeroed.float().mean() < 0.7
    torch.testing.assert_close(dropped[~zeroed], 2 * weights[~zeroed])


# --------------------------------------------------------------------------- fully masked rows
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_fully_masked_rows_give_zeros_not_nan(attention, dtype):
    q, k, v = qkv(2, 3, dtype=dtype)
    mask = random_mask(2, 1, 5, 7, empty_rows=(1, 3))
    out = attention(q, k, v, mask)
    assert not torch.isnan(out).any()
    assert (out[:, :, [1, 3]] == 0).all()
    reference = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
    torch.testing.assert_close(out.float(), reference, atol=ATOL[dtype] * 5, rtol=ATOL[dtype] * 5)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_fully_masked_rows_have_zero_finite_gradients(attention):
    q, k, v = (t.requires_grad_() for t in qkv(2, 3))
    mask = random_mask(5, 7, empty_rows=(2,))
    attention(q, k, v, mask).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, 2] == 0).all()


def test_an_entirely_masked_batch_element_gives_zeros():
    q, k, v = qkv(2, 3)
    mask = padding_mask(torch.tensor([7, 0]), 7)[:, None, None, :]  # the second sequence is empty
    for attention in ATTENTIONS:
        out = attention(q, k, v, mask)
        assert (out[1] == 0).all() and not torch.isnan(out).any()
        torch.testing.assert_close(out[0], scaled_dot_product_attention(q[0], k[0], v[0]))


# --------------------------------------------------------------------------- is_causal
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_is_causal_equals_the_causal_mask(attention):
    q, k, v = qkv(2, 3, n_q=6, n_k=6)
    torch.testing.assert_close(attention(q, k, v, is_causal=True), attention(q, k, v, causal_mask(6)))
    torch.testing.assert_close(attention(q, k, v, is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_is_causal_combines_with_a_padding_mask_and_a_bias(attention):
    q, k, v = qkv(2, 3, n_q=6, n_k=6)
    keep = padding_mask(torch.tensor([6, 3]), 6)[:, None, None, :]
    bias = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(7))
    both = keep & causal_mask(6)
    torch.testing.assert_close(attention(q, k, v, keep, is_causal=True), attention(q, k, v, both))
    torch.testing.assert_close(attention(q, k, v, keep, bias=bias, is_causal=True),
                               scaled_dot_product_attention(q, k, v, both, bias=bias))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_is_causal_with_fewer_queries_puts_them_at_the_last_positions(attention):
    """As with a KV cache: 2 new queries after 5 cached keys sit at positions 5 and 6 of 7."""
    q, k, v = qkv(2, n_q=2, n_k=7)
    full_q = torch.cat([torch.randn(2, 5, 8), q], dim=1)
    expected = scaled_dot_product_attention(full_q, k, v, causal_mask(7))[:, 5:]
    torch.testing.assert_close(attention(q, k, v, is_causal=True), expected)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_is_causal_with_more_queries_than_keys_gives_zero_rows(attention):
    q, k, v = qkv(n_q=5, n_k=3)  # queries at positions -2..2: the first two see no key
    out = attention(q, k, v, is_causal=True)
    assert (out[:2] == 0).all() and not torch.isnan(out).any()
    torch.testing.assert_close(out[2:], scaled_dot_product_attention(q[2:], k, v, causal_mask(3)))


def test_fused_is_causal_hands_the_kernel_no_mask(monkeypatch):
    """Only a kernel told is_causal=True, with no attn_mask, may be FlashAttention on CUDA."""
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    q, k, v = qkv(2, 3, n_q=6, n_k=6)
    fused_attention(q, k, v, is_causal=True)
    assert calls[-1].get("is_causal") is True and calls[-1].get("attn_mask") is None
    fused_attention(q, k, v, causal_mask(6))  # a materialised mask goes to the kernel as it is
    assert calls[-1].get("attn_mask") is not None and not calls[-1].get("is_causal", False)


@pytest.mark.parametrize("n_q, n_k, causal", [(5, 5, True), (2, 7, True), (3, 6, False)])
def test_fused_grouped_query_heads_read_their_groups_kv(n_q, n_k, causal):
    """enable_gqa: query head h reads K/V head h // group, as repeat_interleave arranges them
    (Hugging Face's repeat_kv); a cache's n_q < n_k and a padding mask go through the same path."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, 8, generator=g) for heads, n in ((6, n_q), (2, n_k), (2, n_k)))
    mask = torch.rand(2, 1, n_q, n_k, generator=g) > 0.3
    for m in (None, mask):
        expected = fused_attention(q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), m, is_causal=causal)
        torch.testing.assert_close(fused_attention(q, k, v, m, is_causal=causal, enable_gqa=True), expected)
    wrong = fused_attention(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1), is_causal=causal)  # head h reads h % 2
    assert not torch.allclose(fused_attention(q, k, v, is_causal=causal, enable_gqa=True), wrong)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        fused_attention(q, k[:, :1].expand(2, 4, n_k, 8), v[:, :1].expand(2, 4, n_k, 8), enable_gqa=True)


def test_fused_attention_never_reads_a_tensor_on_the_host(monkeypatch):
    """No bool(row_ok.all()) or .item(): on a GPU each would make the CPU wait at every call."""
    q, k, v = qkv(2, 3)
    mask = random_mask(2, 1, 5, 7, empty_rows=(1, 3))
    reads = []
    for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _real=real, _name=name: reads.append(_name) or _real(self, *a))
    out = fused_attention(q, k, v, mask)
    fused_attention(q, k, v, mask, is_causal=True, bias=torch.zeros(5, 7))
    assert reads == [], reads
    monkeypatch.undo()
    assert (out[:, :, [1, 3]] == 0).all()


# --------------------------------------------------------------------------- precision
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_fp16_scores_whose_unscaled_product_overflows_stay_finite(attention):
    """q · k = 102400 > fp16's 65504 for the matching key, but q · k / √d = 6400 fits: scaling q
    before the product keeps it finite; dividing afterwards gave inf, and the softmax NaN."""
    d, n = 256, 6
    g = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (n, d), generator=g) * 2.0 - 1.0  # (n, d) of ±1
    q = 20 * signs  # query i matches key perm[i] exactly: score 20·20·256 = 102400
    perm = torch.randperm(n, generator=g)
    k = torch.empty(n, d)
    k[perm] = 20 * signs
    v = torch.randn(n, 4, generator=g)
    q16, k16, v16 = q.half(), k.half(), v.half()
    assert torch.isinf(q16 @ k16.T).any(), "the unscaled product must overflow for this test"
    out = attention(q16, k16, v16)
    assert torch.isfinite(out).all()
    # every other key scores at most 6400 - 2·20²·(number of differing signs)/16: weights one-hot
    torch.testing.assert_close(out.float(), v16.float()[perm], atol=1e-3, rtol=1e-3)
    reference = scaled_dot_product_attention(q16.double(), k16.double(), v16.double())
    torch.testing.assert_close(out.double(), reference, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_keys_get_fp32s_minimum_not_the_input_dtypes(dtype):
    """The scores are fp32 once the bias is added, so the fill must be fp32's minimum: a score of
    -1e5 (below fp16's most negative number, -65504) must still beat a masked key."""
    q, k, v = qkv(2, dtype=dtype)
    mask = random_mask(2, 5, 7)
    bias = torch.full((5, 7), -1e5)  # fp32
    out, weights = scaled_dot_product_attention(q, k, v, mask, bias=bias, return_weights=True)
    assert (weights[~mask.expand_as(weights)] == 0).all()
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(2, 5), atol=1e-2, rtol=0)
    # a constant bias does not change a softmax: the same as without it, up to the rounding of
    # scores near -1e5 in fp32 (steps of 2^-7)
    _, unbiased = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    torch.testing.assert_close(weights.float(), unbiased.float(), atol=2e-2, rtol=0)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_mismatched_d_k_names_both_shapes(attention):
    q, k, v = qkv(2, d_k=8)
    with pytest.raises(ValueError, match=r"d_k.*\(2, 5, 8\).*\(2, 7, 9\)"):
        attention(q, torch.randn(2, 7, 9), v)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_mismatched_number_of_keys_and_values(attention):
    q, k, _ = qkv(2)
    with pytest.raises(ValueError, match=r"n_k.*\(2, 7, 8\).*\(2, 6, 6\)"):
        attention(q, k, torch.randn(2, 6, 6))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_batch_dims_that_do_not_broadcast(attention):
    q, k, v = qkv(2)
    with pytest.raises(ValueError, match=r"do not broadcast"):
        attention(q, k[:1].expand(3, -1, -1), v[:1].expand(3, -1, -1))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_one_dimensional_inputs_are_rejected(attention):
    with pytest.raises(ValueError, match=r"at least 2 dims"):
        attention(torch.randn(8), torch.randn(8), torch.randn(8))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_non_bool_mask_is_rejected(attention):
    q, k, v = qkv(2, 3)
    with pytest.raises(ValueError, match=r"bool.*torch.float32"):
        attention(q, k, v, causal_mask(7)[:5].float())


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_mask_that_does_not_broadcast_names_the_shapes(attention):
    q, k, v = qkv(2, 3)
    with pytest.raises(ValueError, match=r"\(5, 6\).*\(2, 3, 5, 7\)"):
        attention(q, k, v, torch.ones(5, 6, dtype=torch.bool))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_key_padding_mask_without_broadcast_dims_is_rejected(attention):
    """(batch, n_k) against (batch, heads, n_q, n_k) scores would line batch up with n_q."""
    q, k, v = qkv(2, 3, n_q=5, n_k=7)
    lengths = torch.tensor([7, 3])
    with pytest.raises(ValueError, match=r"\(2, 7\).*\(2, 3, 5, 7\).*mask\[:, None, None, :\]"):
        attention(q, k, v, padding_mask(lengths, 7))
    right = attention(q, k, v, padding_mask(lengths, 7)[:, None, None, :])
    torch.testing.assert_close(right[1], attention(q[1], k[1, :, :3], v[1, :, :3]))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_bias_that_is_not_float_or_does_not_broadcast(attention):
    q, k, v = qkv(2, 3)
    with pytest.raises(ValueError, match=r"float"):
        attention(q, k, v, bias=torch.ones(5, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(4, 7\).*\(2, 3, 5, 7\)"):
        attention(q, k, v, bias=torch.ones(4, 7))


def test_check_mask_accepts_broadcastable_bool_masks_and_rejects_growth():
    check_mask(torch.ones(7, dtype=torch.bool), (2, 3, 5, 7))
    check_mask(torch.ones(2, 1, 1, 7, dtype=torch.bool), (2, 3, 5, 7))
    check_mask(torch.ones(5, 1, dtype=torch.bool), (2, 3, 5, 7))  # a query-padding mask
    with pytest.raises(ValueError, match=r"\(1, 1, 5, 7\).*\(5, 7\)"):
        check_mask(torch.ones(1, 1, 5, 7, dtype=torch.bool), (5, 7))
    with pytest.raises(ValueError, match=r"dtype torch.int64"):
        check_mask(torch.ones(5, 7, dtype=torch.long), (5, 7))


# --------------------------------------------------------------------------- masked_softmax
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_zero_weights_on_blocked_keys_and_empty_rows(dtype):
    scores = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(3)).to(dtype)
    mask = random_mask(5, 7, empty_rows=(4,))
    weights = masked_softmax(scores, mask)
    assert weights.dtype == dtype and not torch.isnan(weights).any()
    assert (weights[:, ~mask] == 0).all()
    torch.testing.assert_close(weights[:, :4].float().sum(-1), torch.ones(2, 4), atol=ATOL[dtype],
                               rtol=0)
    assert (weights[:, 4] == 0).all()
    expected = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), -1)[:, :4]
    torch.testing.assert_close(weights[:, :4].float(), expected, atol=ATOL[dtype], rtol=0)


def test_masked_softmax_without_mask_is_softmax():
    scores = torch.randn(3, 4)
    torch.testing.assert_close(masked_softmax(scores), torch.softmax(scores, -1))


def test_masked_softmax_rejects_bad_masks():
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(3, 4\)"):
        masked_softmax(torch.randn(3, 4), torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool"):
        masked_softmax(torch.randn(3, 4), torch.ones(3, 4))


# --------------------------------------------------------------------------- masks
def test_causal_mask_is_lower_triangular_bool():
    mask = causal_mask(4)
    assert mask.dtype == torch.bool and mask.shape == (4, 4)
    for i in range(4):
        for j in range(4):
            assert bool(mask[i, j]) == (j <= i)
    assert causal_mask(0).shape == (0, 0)


def test_causal_mask_matches_pytorch_convention():
    """nn.Transformer's mask is float with -inf on the blocked (future) positions."""
    from torch import nn

    torch_mask = nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.equal(causal_mask(6), torch_mask == 0)


def test_causal_mask_rejects_negative_n():
    with pytest.raises(ValueError, match="-1"):
        causal_mask(-1)


def test_padding_mask_marks_real_tokens():
    mask = padding_mask(torch.tensor([3, 1, 0]), 4)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert padding_mask(torch.tensor([2, 5])).shape == (2, 5)  # default max_len: the longest
    assert padding_mask([2, 3]).dtype == torch.bool  # plain lists work too


def test_padding_mask_bad_input():
    with pytest.raises(ValueError, match=r"1-D.*\(2, 2\)"):
        padding_mask(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"6 exceeds max_len 4"):
        padding_mask(torch.tensor([2, 6]), 4)


# --------------------------------------------------------------------------- heads
def test_split_heads_gives_each_head_its_slice_of_columns():
    x = torch.arange(2 * 3 * 12, dtype=torch.float32).view(2, 3, 12)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 3)
    for h in range(4):
        assert torch.equal(heads[:, h], x[:, :, 3 * h:3 * (h + 1)])


def test_merge_heads_inverts_split_heads():
    x = torch.randn(2, 5, 12)
    assert torch.equal(merge_heads(split_heads(x, 3)), x)
    y = torch.randn(2, 3, 5, 4)
    assert torch.equal(split_heads(merge_heads(y), 3), y)


def test_split_and_merge_heads_bad_input():
    with pytest.raises(ValueError, match=r"\(2, 5, 12\).*5 heads"):
        split_heads(torch.randn(2, 5, 12), 5)
    with pytest.raises(ValueError, match=r"\(5, 12\)"):
        split_heads(torch.randn(5, 12), 3)
    with pytest.raises(ValueError, match=r"\(2, 5, 12\)"):
        merge_heads(torch.randn(2, 5, 12))
