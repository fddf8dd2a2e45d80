"""Unit tests of MultiHeadAttention, split_heads / merge_heads and kv_cache_bytes.

Parity is checked against PyTorch's ``nn.MultiheadAttention`` (through ``from_torch``), and the
shape rules against the silent view-without-transpose bug.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tfm_course.attention import (
    MultiHeadAttention,
    causal_mask,
    kv_cache_bytes,
    merge_heads,
    padding_mask,
    split_heads,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def torch_pair(d_model=16, heads=4, bias=True, random_bias=True):
    ref = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).eval()
    if bias and random_bias:  # PyTorch starts its biases at zero; random ones test the copy
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return ref, MultiHeadAttention.from_torch(ref).eval()


# --------------------------------------------------------------------------- split / merge heads
def test_split_heads_gives_each_head_a_slice_of_channels_at_the_same_position():
    b, n, h, dh = 2, 5, 3, 4
    x = torch.randn(b, n, h * dh)
    heads = split_heads(x, h)
    assert heads.shape == (b, h, n, dh)
    for i in range(h):
        assert torch.equal(heads[:, i], x[:, :, i * dh:(i + 1) * dh])


def test_the_view_without_transpose_bug_is_caught():
    """x.view(b, h, n, d_head) has the right shape and even round-trips, but is wrong."""
    b, n, h, dh = 2, 6, 3, 4
    x = torch.randn(b, n, h * dh)
    buggy = x.view(b, h, n, dh)
    assert buggy.shape == split_heads(x, h).shape
    assert torch.equal(buggy.reshape(b, n, h * dh), x)  # a round-trip test would not notice
    assert not torch.equal(buggy, split_heads(x, h))     # the slice test does


def test_merge_heads_inverts_split_heads():
    x = torch.randn(2, 7, 12)
    assert torch.equal(merge_heads(split_heads(x, 4)), x)
    y = torch.randn(2, 4, 7, 3)
    assert torch.equal(split_heads(merge_heads(y), 4), y)


def test_split_and_merge_reject_bad_shapes():
    with pytest.raises(ValueError, match="not divisible"):
        split_heads(torch.randn(2, 5, 10), 3)
    with pytest.raises(ValueError, match=r"\(batch, seq, heads \* d_head\)"):
        split_heads(torch.randn(5, 12), 3)
    with pytest.raises(ValueError, match=r"\(batch, heads, seq, d_head\)"):
        merge_heads(torch.randn(2, 5, 12))


# --------------------------------------------------------------------------- construction
def test_constructor_rejects_indivisible_sizes():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(16, 4, num_kv_heads=3)


@pytest.mark.parametrize("heads, kv_heads, bias", [(4, None, True), (4, None, False), (8, 2, True), (8, 1, False)])
def test_parameter_count_matches_the_formula(heads, kv_heads, bias):
    d = 32
    m = MultiHeadAttention(d, heads, num_kv_heads=kv_heads, bias=bias)
    d_kv = (kv_heads or heads) * (d // heads)
    expected = 2 * d * d + 2 * d * d_kv + (2 * d + 2 * d_kv if bias else 0)
    assert sum(p.numel() for p in m.parameters()) == expected


# --------------------------------------------------------------------------- forward
def test_output_shapes_and_weights():
    m = MultiHeadAttention(16, 4).eval()
    q, kv = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    assert m(q).shape == (2, 3, 16)
    out, w = m(q, kv, kv, need_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 4, 3, 5)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 3))


def test_fused_and_naive_paths_agree_with_masks():
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    naive = MultiHeadAttention(16, 4, fused=False).eval()
    naive.load_state_dict(m.state_dict())
    for mask in (None, causal_mask(6), padding_mask(torch.tensor([6, 2]))[:, None, None, :]):
        torch.testing.assert_close(m(x, mask=mask), naive(x, mask=mask), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(m(x, mask=mask), m(x, mask=mask, need_weights=True)[0],
                                   atol=1e-5, rtol=1e-4)


def test_fully_masked_rows_give_zeros_before_out_proj():
    m = MultiHeadAttention(8, 2, bias=False).eval()
    x = torch.randn(1, 3, 8)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    for need_weights in (False, True):
        out = m(x, mask=mask, need_weights=need_weights)
        out = out[0] if need_weights else out
        assert not torch.isnan(out).any()
        assert torch.equal(out[0, 1], torch.zeros(8))  # no bias: zero heads -> zero output


def test_forward_rejects_bad_input():
    m = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="d_model=16"):
        m(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match="d_model=16"):
        m(torch.randn(5, 16))
    with pytest.raises(ValueError, match="mismatch"):
        m(torch.randn(2, 5, 16), torch.randn(3, 5, 16), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match="mismatch"):
        m(torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(2, 4, 16))
    with pytest.raises(ValueError, match="bool"):
        m(torch.randn(2, 5, 16), mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match="broadcast"):
        m(torch.randn(2, 5, 16), mask=torch.ones(2, 5, dtype=torch.bool))  # key padding without [:, None, None, :]


def test_the_view_bug_inside_attention_blocks_information_flow():
    """With x.view(b, h, n, d_head) each 'head' sees only a block of positions; the real MHA sees all."""
    d, h, n = 16, 4, 8
    m = MultiHeadAttention(d, h).eval()
    x = torch.randn(1, n, d, requires_grad=True)

    def buggy(x):
        q, k, v = (p(x).view(1, h, n, d // h) for p in (m.q_proj, m.k_proj, m.v_proj))
        w = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1)
        return m.out_proj((w @ v).reshape(1, n, d))

    for fn, reaches_last in ((m, True), (buggy, False)):
        (grad,) = torch.autograd.grad(fn(x)[0, 0].sum(), x)
        assert bool(grad[0, -1].abs().sum() > 0) == reaches_last


def test_self_attention_is_permutation_equivariant():
    m = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm], atol=1e-5, rtol=1e-4)


def test_dropout_only_in_training():
    m = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))


# --------------------------------------------------------------------------- grouped-query attention
def test_gqa_equals_mha_with_each_kv_head_repeated():
    d, h, h_kv = 24, 6, 2
    gqa = MultiHeadAttention(d, h, num_kv_heads=h_kv).eval()
    mha = MultiHeadAttention(d, h).eval()
    group, dh = h // h_kv, d // h
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            small, big = getattr(gqa, name), getattr(mha, name)
            big.weight.copy_(small.weight.view(h_kv, dh, d).repeat_interleave(group, 0).reshape(d, d))
            big.bias.copy_(small.bias.view(h_kv, dh).repeat_interleave(group, 0).reshape(d))
    x = torch.randn(2, 5, d)
    torch.testing.assert_close(gqa(x, mask=causal_mask(5)), mha(x, mask=causal_mask(5)),
                               atol=1e-5, rtol=1e-4)


def test_mqa_shares_one_key_value_head():
    m = MultiHeadAttention(32, 8, num_kv_heads=1)
    assert m.k_proj.weight.shape == (4, 32) and m.v_proj.weight.shape == (4, 32)
    assert m(torch.randn(2, 5, 32)).shape == (2, 5, 32)


# --------------------------------------------------------------------------- parity with PyTorch
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_self_attention_with_causal_mask(bias):
    ref, ours = torch_pair(bias=bias)
    x = torch.randn(3, 7, 16)
    mask = causal_mask(7)
    want, want_w = ref(x, x, x, attn_mask=~mask, average_attn_weights=False)  # PyTorch: True = blocked
    got, got_w = ours(x, mask=mask, need_weights=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x, mask=mask), want, atol=1e-5, rtol=1e-5)  # fused path
    _, averaged = ref(x, x, x, attn_mask=~mask)  # default: weights averaged over heads
    torch.testing.assert_close(got_w.mean(dim=1), averaged, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_cross_attention_with_key_padding(bias):
    ref, ours = torch_pair(bias=bias)
    q, kv = torch.randn(2, 4, 16), torch.randn(2, 6, 16)
    keep = padding_mask(torch.tensor([6, 3]))  # (batch, n_k), True = real token
    want = ref(q, kv, kv, key_padding_mask=~keep, need_weights=False)[0]
    got = ours(q, kv, kv, mask=keep[:, None, None, :])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_from_torch_with_seq_first_module():
    ref = nn.MultiheadAttention(8, 2).eval()  # batch_first=False: (seq, batch, d)
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(2, 5, 8)
    want = ref(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), need_weights=False)[0]
    torch.testing.assert_close(ours(x), want.transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_from_torch_copies_double_precision_and_dropout():
    ref = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True).double()
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.q_proj.weight.dtype == torch.float64 and ours.dropout == 0.25


def test_from_torch_rejects_unsupported_modules():
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))


def test_training_step_matches_pytorch_gradients():
    ref, ours = torch_pair()
    x = torch.randn(2, 5, 16)
    mask = causal_mask(5)
    ref(x, x, x, attn_mask=~mask, need_weights=False)[0].square().sum().backward()
    ours(x, mask=mask).square().sum().backward()
    wq, wk, wv = ref.in_proj_weight.grad.chunk(3)
    for grad, proj in ((wq, ours.q_proj), (wk, ours.k_proj), (wv, ours.v_proj)):
        torch.testing.assert_close(proj.weight.grad, grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fused", [True, False])
def test_is_causal_equals_passing_the_causal_mask(fused):
    ref, ours = torch_pair()
    ours.fused = fused
    x = torch.randn(3, 7, 16)
    want = ref(x, x, x, attn_mask=~causal_mask(7), need_weights=False)[0]
    torch.testing.assert_close(ours(x, is_causal=True), want, atol=1e-5, rtol=1e-5)
    keep = padding_mask(torch.tensor([7, 4, 2]))  # causal and key padding together
    want = ref(x, x, x, attn_mask=~causal_mask(7), key_padding_mask=~keep, need_weights=False)[0]
    got = ours(x, mask=keep[:, None, None, :], is_causal=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    out, weights = ours(x, is_causal=True, need_weights=True)
    assert (weights[..., ~causal_mask(7)] == 0).all()


# --------------------------------------------------------------------------- KV-cache arithmetic
def test_kv_cache_bytes():
    # derived from the formula 2 (K and V) * layers * kv heads * d_head * bytes
    assert kv_cache_bytes(1, 1, 1, 1) == 2
    assert kv_cache_bytes(32, 8, 128, 2) == 2 * 32 * 8 * 128 * 2
    assert kv_cache_bytes(80, 64, 128) == 8 * kv_cache_bytes(80, 8, 128)  # MHA vs GQA-8
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_cache_bytes(2, 0, 64)
