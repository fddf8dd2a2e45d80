"""DecoderLayer: parity with nn.TransformerDecoderLayer, masks, cross-attention weights, bad input."""

import pytest
import torch
from torch import nn

from tfm_course.attention import causal_mask
from tfm_course.layers import DecoderLayer

D, HEADS, FF = 32, 4, 64


def _inputs(batch=3, n_tgt=5, n_src=7):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n_tgt, D, generator=g)
    memory = torch.randn(batch, n_src, D, generator=g)
    lengths = torch.tensor([n_src, n_src - 2, 3])[:batch]
    src_keep = torch.arange(n_src) < lengths[:, None]  # (batch, n_src), True = real token
    return x, memory, src_keep


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_pytorch(norm_first, activation):
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, activation=activation,
                                        batch_first=True, norm_first=norm_first).eval()
    ours = DecoderLayer.from_torch(theirs).eval()
    x, memory, src_keep = _inputs()
    causal = causal_mask(x.shape[1])
    with torch.no_grad():
        # PyTorch's masks say True = *blocked*; ours say True = may attend
        want = theirs(x, memory, tgt_mask=~causal, memory_key_padding_mask=~src_keep)
        got = ours(x, memory, tgt_mask=causal, memory_mask=src_keep[:, None, None, :])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_matches_pytorch_without_masks():
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True).eval()
    ours = DecoderLayer.from_torch(theirs).eval()
    x, memory, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, memory), theirs(x, memory), atol=1e-5, rtol=1e-5)


def test_copies_are_independent_parameters():
    theirs = nn.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)
    ours = DecoderLayer.from_torch(theirs)
    with torch.no_grad():
        ours.ffn.linear1.weight.zero_()
    assert theirs.linear1.weight.abs().sum() > 0


def test_causal_mask_hides_the_future():
    torch.manual_seed(0)
    layer = DecoderLayer(D, HEADS, FF, dropout=0.0).eval()
    x, memory, _ = _inputs(batch=1)
    changed = x.clone()
    changed[:, 3:] += 10.0  # change positions 3, 4 only
    mask = causal_mask(x.shape[1])
    with torch.no_grad():
        a, b = layer(x, memory, tgt_mask=mask), layer(changed, memory, tgt_mask=mask)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_tgt_is_causal_equals_the_causal_mask(norm_first):
    torch.manual_seed(0)
    layer = DecoderLayer(D, HEADS, FF, dropout=0.0, norm_first=norm_first).eval()
    x, memory, src_keep = _inputs()
    causal = causal_mask(x.shape[1])
    tgt_keep = (torch.arange(x.shape[1]) < torch.tensor([5, 4, 2])[:, None])[:, None, None, :]
    memory_mask = src_keep[:, None, None, :]
    with torch.no_grad():
        torch.testing.assert_close(layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True),
                                   layer(x, memory, tgt_mask=causal, memory_mask=memory_mask))
        torch.testing.assert_close(
            layer(x, memory, tgt_mask=tgt_keep, memory_mask=memory_mask, tgt_is_causal=True),
            layer(x, memory, tgt_mask=tgt_keep & causal, memory_mask=memory_mask))
        # right padding: the causal mask alone gives the real positions the same outputs
        real = tgt_keep[:, 0, 0, :, None]
        alone = layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True)
        both = layer(x, memory, tgt_mask=tgt_keep & causal, memory_mask=memory_mask)
        torch.testing.assert_close(alone * real, both * real)


def test_memory_padding_is_ignored():
    torch.manual_seed(0)
    layer = DecoderLayer(D, HEADS, FF, dropout=0.0).eval()
    x, memory, src_keep = _inputs()
    noisy = memory.masked_fill(~src_keep[..., None], 1e3)  # garbage in the padded positions
    mask = src_keep[:, None, None, :]
    with torch.no_grad():
        torch.testing.assert_close(layer(x, memory, memory_mask=mask), layer(x, noisy, memory_mask=mask))


def test_cross_attention_weights():
    layer = DecoderLayer(D, HEADS, FF, dropout=0.0).eval()
    x, memory, src_keep = _inputs()
    with torch.no_grad():
        out, weights = layer(x, memory, memory_mask=src_keep[:, None, None, :], need_weights=True)
        plain = layer(x, memory, memory_mask=src_keep[:, None, None, :])
    assert weights.shape == (3, HEADS, 5, 7)
    torch.testing.assert_close(out, plain)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 5))
    assert (weights.masked_select(~src_keep[:, None, None, :].expand_as(weights)) == 0).all()


def test_fully_masked_rows_give_no_nan():
    layer = DecoderLayer(D, HEADS, FF, dropout=0.0).eval()
    x, memory, _ = _inputs(batch=1)
    nothing = torch.zeros(1, 1, 5, 5, dtype=torch.bool)
    with torch.no_grad():
        assert torch.isfinite(layer(x, memory, tgt_mask=nothing)).all()


def test_bad_input():
    layer = DecoderLayer(D, HEADS, FF)
    x, memory, _ = _inputs()
    with pytest.raises(ValueError, match="memory"):
        layer(x, memory[:2])  # batch mismatch
    with pytest.raises(ValueError, match="memory"):
        layer(x, memory[..., :16])  # width mismatch
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(x, memory, tgt_mask=torch.ones(3, 5, dtype=torch.bool))  # (batch, n) is ambiguous
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(x, memory, memory_mask=torch.ones(3, 1, 1, 5, dtype=torch.bool))  # wrong n_src
    with pytest.raises(ValueError, match="bool"):
        layer(x, memory, tgt_mask=causal_mask(5).float())
    with pytest.raises(ValueError, match="unsupported activation"):
        DecoderLayer.from_torch(nn.TransformerDecoderLayer(D, HEADS, FF, activation=torch.tanh))
