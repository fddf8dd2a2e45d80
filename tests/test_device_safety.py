"""GPU-correctness that a CPU can check: everything runs on PyTorch's ``meta`` device.

A meta tensor has a shape and a device but no data. Mixing it with a tensor created on the CPU
raises ("Tensor on device cpu is not on the expected device meta"), exactly as a CUDA tensor
would, and reading its value (``.item()``, ``bool(t.all())``, ``int(t.max())``) raises too, where
on a GPU it would silently make the CPU wait. So a forward pass that runs on meta tensors creates
every tensor on its input's device and never syncs.
"""

from __future__ import annotations

import pytest
import torch

from tfm_course.attention import (MultiHeadAttention, causal_mask, fused_attention, masked_softmax,
                                  padding_mask, scaled_dot_product_attention)
from tfm_course.layers import DecoderLayer, EncoderLayer, LayerNorm, RMSNorm
from tfm_course.positional import (LearnedPositionalEmbedding, RotaryEmbedding,
                                   SinusoidalPositionalEncoding, T5RelativeBias, alibi_bias,
                                   alibi_slopes, sinusoidal_encoding)

META = torch.device("meta")


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device=META, dtype=dtype)


def test_the_meta_device_catches_both_mistakes():
    with pytest.raises(RuntimeError, match="device"):
        meta(3) + torch.ones(3)  # a tensor made on the CPU
    with pytest.raises(RuntimeError):
        bool(meta(3).all())  # a host read


@pytest.mark.parametrize("attention", [scaled_dot_product_attention, fused_attention])
@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_functions_stay_on_the_device(attention, is_causal):
    q, k, v = meta(2, 3, 6, 8), meta(2, 3, 6, 8), meta(2, 3, 6, 4)
    keep = padding_mask(torch.full((2,), 6, device=META), 6)[:, None, None, :]
    bias = meta(1, 3, 6, 6)
    for mask in (None, keep, keep & causal_mask(6, device=META)):
        for b in (None, bias):
            out = attention(q, k, v, mask, bias=b, is_causal=is_causal)
            assert out.device == META and out.shape == (2, 3, 6, 4)
    assert attention(q[..., :2, :], k, v, is_causal=is_causal).shape == (2, 3, 2, 4)
    assert masked_softmax(meta(2, 6, 6), keep[:, 0]).device == META


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multi_head_attention_stays_on_the_device(num_kv_heads, need_weights):
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads).to(META)
    rope = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, rotary=RotaryEmbedding(4)).to(META)
    x, memory = meta(2, 5, 16), meta(2, 7, 16)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool, device=META)
    for out in (rope(x, is_causal=True, need_weights=need_weights),
                mha(x, mask=causal_mask(5, device=META), need_weights=need_weights,
                    position_bias=alibi_bias(4, 5, device=META)),
                mha(x, memory, mask=keep, need_weights=need_weights)):
        out = out[0] if need_weights else out
        assert out.device == META and out.shape == (2, 5, 16)


def test_positional_encodings_stay_on_the_device():
    x = meta(2, 5, 16)
    for module in (SinusoidalPositionalEncoding(16, max_len=32), LearnedPositionalEmbedding(32, 16)):
        assert module.to(META)(x, offset=3).device == META
    rotary = RotaryEmbedding(8).to(META)
    q, k = rotary(meta(2, 2, 5, 8), meta(2, 2, 5, 8), offset=4)
    assert q.device == k.device == META
    assert T5RelativeBias(4).to(META)(5, 9).device == META
    assert T5RelativeBias(4, bidirectional=False).to(META)(5).device == META
    assert alibi_bias(4, 5, 9, device=META).device == META
    assert alibi_slopes(6, device=META).device == META
    assert sinusoidal_encoding(8, 16, device=META).device == META


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_stay_on_the_device(norm_first):
    x, memory = meta(2, 5, 16), meta(2, 7, 16)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool, device=META)
    encoder = EncoderLayer(16, 4, 32, norm_first=norm_first).to(META)
    assert encoder(x, is_causal=True).device == META
    assert encoder(memory, mask=keep).device == META
    decoder = DecoderLayer(16, 4, 32, norm_first=norm_first).to(META)
    assert decoder(x, memory, memory_mask=keep, tgt_is_causal=True).device == META
    out, weights = decoder(x, memory, tgt_mask=causal_mask(5, device=META), memory_mask=keep,
                           need_weights=True)
    assert out.device == weights.device == META
    assert LayerNorm(16).to(META)(x).device == RMSNorm(16).to(META)(x).device == META
