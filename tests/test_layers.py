"""FeedForward, LayerNorm, RMSNorm and EncoderLayer: maths, parity with PyTorch, masks, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfm_course.attention import padding_mask
from tfm_course.layers import EncoderLayer, FeedForward, LayerNorm, RMSNorm
from tfm_course.layers.encoder_layer import _activation_name, copy_linear

D, HEADS, FF = 16, 4, 32


def _randomise_norms(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random values for every parameter. PyTorch starts biases at 0 and norm weights at 1, which
    would hide a bias, or a norm weight, copied to the wrong place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            offset = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(offset + 0.3 * torch.randn(p.shape, generator=g))
    return module


# --------------------------------------------------------------------------- FeedForward
@pytest.mark.parametrize("activation, fn", [("relu", F.relu), ("gelu", F.gelu)])
def test_feedforward_is_two_linears_around_the_activation(activation, fn):
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, activation=activation)
    x = torch.randn(2, 5, D)
    want = ffn.linear2(fn(ffn.linear1(x)))
    torch.testing.assert_close(ffn(x), want)
    assert not hasattr(ffn, "gate")  # SwiGLU's names (gate, up, down): tests/test_feedforward.py
    assert sum(p.numel() for p in ffn.parameters()) == 2 * D * FF + FF + D


def test_swiglu_formula_and_parameter_count():
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, activation="swiglu", bias=False)
    x = torch.randn(3, D)
    w_gate, w_up, w_down = ffn.gate.weight.T, ffn.up.weight.T, ffn.down.weight.T
    torch.testing.assert_close(ffn(x), (F.silu(x @ w_gate) * (x @ w_up)) @ w_down)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * D * FF


def test_swiglu_at_two_thirds_width_matches_the_relu_block_size():
    d, d_ff = 48, 4 * 48
    relu = FeedForward(d, d_ff, bias=False)
    swiglu = FeedForward(d, 2 * d_ff // 3, activation="swiglu", bias=False)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(relu) == count(swiglu) == 2 * d * d_ff


def test_feedforward_is_position_wise():
    """Each position is transformed on its own: permuting positions permutes the output."""
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, activation="gelu")
    x = torch.randn(2, 7, D)
    perm = torch.randperm(7)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm])
    torch.testing.assert_close(ffn(x[:, 3:4]), ffn(x)[:, 3:4])


def test_feedforward_dropout_only_in_training():
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, dropout=0.5)
    x = torch.randn(4, 6, D)
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn(x))
    ffn.train()
    assert not torch.allclose(ffn(x), ffn(x))


def test_feedforward_bad_input():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(D, FF, activation="tanh")
    with pytest.raises(ValueError, match=r"expected \(\.\.\., d_model=16\), got \(2, 5, 8\)"):
        FeedForward(D, FF)(torch.randn(2, 5, 8))


# --------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_pytorch(bias, fused):
    theirs = _randomise_norms(nn.LayerNorm(D, eps=1e-3, bias=bias))
    ours = LayerNorm.from_torch(theirs)
    ours.fused = fused  # F.layer_norm, or the formula written out
    x = (4 * torch.randn(3, 5, D) + 2).requires_grad_()
    torch.testing.assert_close(ours(x), theirs(x))
    grad_ours, = torch.autograd.grad(ours(x).pow(2).sum(), x)
    grad_theirs, = torch.autograd.grad(theirs(x).pow(2).sum(), x)
    torch.testing.assert_close(grad_ours, grad_theirs)
    assert ours.eps == 1e-3 and (ours.bias is None) == (not bias)


def test_layer_norm_uses_the_biased_variance_and_eps_inside_the_root():
    x = torch.randn(6, D)
    norm = LayerNorm(D, eps=0.5)
    centred = x - x.mean(-1, keepdim=True)
    want = centred / (centred.pow(2).sum(-1, keepdim=True) / D + 0.5).sqrt()
    torch.testing.assert_close(norm(x), want)
    wrong = centred / (x.var(-1, keepdim=True, unbiased=True) + 0.5).sqrt()
    assert not torch.allclose(norm(x), wrong)


def test_layer_norm_output_has_zero_mean_unit_variance_before_the_affine():
    x = 10 * torch.randn(4, 9, D) - 3
    y = LayerNorm(D, eps=0.0)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 9), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 9), atol=1e-4, rtol=0)


def test_layer_norm_copy_is_independent():
    theirs = nn.LayerNorm(D)
    ours = LayerNorm.from_torch(theirs)
    with torch.no_grad():
        ours.weight.zero_()
    assert torch.equal(theirs.weight, torch.ones(D))


def test_layer_norm_bad_input():
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 16\), got \(2, 8\)"):
        LayerNorm(D)(torch.randn(2, 8))
    with pytest.raises(ValueError, match="1-D normalized_shape"):
        LayerNorm.from_torch(nn.LayerNorm((4, D)))


# --------------------------------------------------------------------------- RMSNorm
def test_rms_norm_formula():
    x = torch.randn(3, 4, D) + 1
    norm = _randomise_norms(RMSNorm(D, eps=1e-4))
    want = x / (x.pow(2).mean(-1, keepdim=True) + 1e-4).sqrt() * norm.weight
    torch.testing.assert_close(norm(x), want)
    # no centring: a constant vector c·1 is normalised to sign(c)·weight, not to 0
    torch.testing.assert_close(RMSNorm(D, eps=0.0)(torch.full((D,), -3.0)), -torch.ones(D))


def test_rms_norm_in_bf16_takes_its_mean_in_fp32():
    """Hugging Face's rule: upcast, normalise, cast back, then the weight. The bf16 result is
    then the fp32 one rounded once; the mean taken in bf16 is further off."""
    x = (torch.randn(64, 512) * 4 + 2).to(torch.bfloat16)
    norm = RMSNorm(512).to(torch.bfloat16)  # a model cast to bf16
    exact = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.eps)).to(torch.bfloat16)
    assert norm(x).dtype == torch.bfloat16 and torch.equal(norm(x), exact)
    in_bf16 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    assert not torch.equal(in_bf16, exact)


@pytest.mark.skipif(not hasattr(nn, "RMSNorm"), reason="nn.RMSNorm needs PyTorch >= 2.4")
@pytest.mark.parametrize("eps", [1e-6, None])
def test_rms_norm_matches_pytorch(eps):
    theirs = _randomise_norms(nn.RMSNorm(D, eps=eps))
    ours = RMSNorm.from_torch(theirs)
    x = torch.randn(5, 7, D) * 3
    torch.testing.assert_close(ours(x), theirs(x))
    assert ours.eps == (eps if eps is not None else torch.finfo(torch.float32).eps)


@pytest.mark.skipif(not hasattr(nn, "RMSNorm"), reason="nn.RMSNorm needs PyTorch >= 2.4")
def test_rms_norm_from_torch_bad_input():
    with pytest.raises(ValueError, match="1-D normalized_shape"):
        RMSNorm.from_torch(nn.RMSNorm((4, D)))
    with pytest.raises(ValueError, match="no weight"):
        RMSNorm.from_torch(nn.RMSNorm(D, elementwise_affine=False))


def test_rms_norm_bad_input():
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 16\), got \(3, 15\)"):
        RMSNorm(D)(torch.randn(3, 15))


# --------------------------------------------------------------------------- EncoderLayer
def _torch_layer(norm_first: bool, activation: str, batch_first: bool = True, seed: int = 0,
                 dropout: float = 0.0) -> nn.TransformerEncoderLayer:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=dropout, activation=activation,
                                       batch_first=batch_first, norm_first=norm_first)
    return _randomise_norms(layer, seed).eval()


def _batch(batch: int = 3, seq: int = 7, lengths=(7, 5, 2)):
    x = torch.randn(batch, seq, D, generator=torch.Generator().manual_seed(1))
    keep = padding_mask(torch.tensor(lengths), seq)  # (batch, seq), True = real token
    return x, keep


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_matches_pytorch(norm_first, activation, batch_first):
    theirs = _torch_layer(norm_first, activation, batch_first)
    ours = EncoderLayer.from_torch(theirs).eval()
    assert ours.norm_first == norm_first and ours.ffn.activation == activation
    x, keep = _batch()
    with torch.no_grad():
        for mask in (None, keep):
            theirs_in = x if batch_first else x.transpose(0, 1)      # (seq, batch, d) for PyTorch
            pad = None if mask is None else ~mask                    # PyTorch: True = padding
            want = theirs(theirs_in, src_key_padding_mask=pad)
            want = want if batch_first else want.transpose(0, 1)
            got = ours(x, mask=None if mask is None else mask[:, None, None, :])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_is_causal_matches_pytorch_with_a_causal_mask(norm_first):
    """A causal encoder layer (a decoder-only block): is_causal=True, alone or with padding."""
    theirs = _torch_layer(norm_first, "gelu")
    ours = EncoderLayer.from_torch(theirs).eval()
    x, keep = _batch()
    blocked = torch.ones(7, 7, dtype=torch.bool).triu(1)  # PyTorch: True = blocked
    with torch.no_grad():
        want = theirs(x, src_mask=blocked, is_causal=True)
        torch.testing.assert_close(ours(x, is_causal=True), want, atol=1e-5, rtol=1e-5)
        want = theirs(x, src_mask=blocked, src_key_padding_mask=~keep)
        got = ours(x, mask=keep[:, None, None, :], is_causal=True)
        real = keep[..., None]  # PyTorch's fast path may leave padded rows undefined
        torch.testing.assert_close(got * real, want * real, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_pytorch_in_training_mode_without_dropout(norm_first):
    """Training mode takes PyTorch's ordinary (non fast-path) route; gradients must agree too."""
    theirs = _torch_layer(norm_first, "gelu").train()
    ours = EncoderLayer.from_torch(theirs).train()
    x, keep = _batch()
    want = theirs(x, src_key_padding_mask=~keep)
    got = ours(x, mask=keep[:, None, None, :])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    (want * keep[..., None]).sum().backward()
    (got * keep[..., None]).sum().backward()
    torch.testing.assert_close(ours.ffn.linear1.weight.grad, theirs.linear1.weight.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.norm1.weight.grad, theirs.norm1.weight.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("nested", [False, True])
def test_encoder_stack_matches_nn_transformer_encoder(norm_first, nested):
    """A stack of copied layers equals nn.TransformerEncoder. With nested tensors (PyTorch's eval
    fast path, Post-LN only) the padded positions come back as zeros, so compare real tokens."""
    layer = _torch_layer(norm_first, "relu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors: "prototype stage" / "not used with norm_first"
        theirs = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=nested).eval()
        for i, block in enumerate(theirs.layers):
            _randomise_norms(block, seed=10 + i)
        ours = nn.ModuleList(EncoderLayer.from_torch(block) for block in theirs.layers).eval()
        x, keep = _batch()
        with torch.no_grad():
            want = theirs(x, src_key_padding_mask=~keep)
            got = x
            for block in ours:
                got = block(got, mask=keep[:, None, None, :])
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    if nested and not norm_first:
        assert torch.equal(want[~keep], torch.zeros_like(want[~keep]))  # the fast path's padding
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_encoder_layer_padding_does_not_change_real_tokens():
    """With a key-padding mask, what sits in the padded slots cannot reach the real tokens."""
    torch.manual_seed(0)
    layer = EncoderLayer(D, HEADS, FF, dropout=0.0).eval()
    x, keep = _batch()
    noisy = x.clone()
    noisy[~keep] = 100 * torch.randn(int((~keep).sum()), D)
    mask = keep[:, None, None, :]
    with torch.no_grad():
        torch.testing.assert_close(layer(noisy, mask=mask)[keep], layer(x, mask=mask)[keep])
        short = layer(x[1:2, :5])                               # the second sequence, unpadded
    torch.testing.assert_close(layer(x, mask=mask)[1, :5], short[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_is_post_or_pre_ln(norm_first):
    torch.manual_seed(0)
    layer = _randomise_norms(EncoderLayer(D, HEADS, FF, dropout=0.0, norm_first=norm_first)).eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        if norm_first:
            h = x + layer.self_attn(layer.norm1(x))
            want = h + layer.ffn(layer.norm2(h))
        else:
            h = layer.norm1(x + layer.self_attn(x))
            want = layer.norm2(h + layer.ffn(h))
        torch.testing.assert_close(layer(x), want)


def test_encoder_layer_dropout_is_random_in_training_only():
    torch.manual_seed(0)
    layer = EncoderLayer(D, HEADS, FF, dropout=0.3)
    x = torch.randn(2, 5, D)
    assert not torch.allclose(layer(x), layer(x))
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_encoder_layer_options(activation):
    layer = EncoderLayer(D, HEADS, FF, activation=activation, bias=False, num_kv_heads=2)
    assert layer.ffn.activation == activation
    assert all(name.endswith("weight") for name, _ in layer.named_parameters())
    assert layer(torch.randn(2, 3, D)).shape == (2, 3, D)


def test_encoder_layer_from_torch_copies_are_independent():
    theirs = _torch_layer(False, "relu")
    ours = EncoderLayer.from_torch(theirs)
    before = theirs.linear1.weight.clone()
    with torch.no_grad():
        ours.ffn.linear1.weight.zero_()
        ours.self_attn.q_proj.weight.zero_()
    assert torch.equal(theirs.linear1.weight, before)
    assert theirs.self_attn.in_proj_weight.abs().sum() > 0


def test_encoder_layer_bad_input():
    layer = EncoderLayer(D, HEADS, FF)
    with pytest.raises(ValueError, match=r"\(batch, seq, d_model=16\), got \(5, 16\)"):
        layer(torch.randn(5, D))
    with pytest.raises(ValueError, match="got"):
        layer(torch.randn(2, 5, D + 1))
    with pytest.raises(ValueError, match="bool"):
        layer(torch.randn(2, 5, D), mask=torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(torch.randn(2, 5, D), mask=torch.ones(2, 5, dtype=torch.bool))  # needs [:, None, None, :]
    with pytest.raises(ValueError, match="activation must be one of"):
        EncoderLayer(D, HEADS, FF, activation="tanh")
    with pytest.raises(ValueError, match="not divisible"):
        EncoderLayer(D, 3, FF)


def test_activation_name_and_copy_linear():
    assert _activation_name(F.relu) == "relu" and _activation_name(nn.GELU()) == "gelu"
    with pytest.raises(ValueError, match="only ReLU and GELU"):
        _activation_name(torch.tanh)
    with pytest.raises(ValueError, match="shape mismatch"):
        copy_linear(nn.Linear(3, 4), nn.Linear(4, 3))
    a, b = nn.Linear(3, 4), nn.Linear(3, 4)
    copy_linear(a, b)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
