"""tfm_course.models.position_probe: one tiny model, several ways to know positions."""

from __future__ import annotations

import pytest
import torch

from tfm_course.models.position_probe import POSITIONS, PositionProbe


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("causal", [True, False])
def test_probe_runs_and_backpropagates(position, causal):
    torch.manual_seed(0)
    model = PositionProbe(11, position, d_model=16, num_heads=2, num_layers=2, max_len=12, causal=causal,
                          num_classes=5)
    logits = model(torch.randint(11, (3, 9)))
    assert logits.shape == (3, 9, 5)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.embed.parameters())


def test_probe_without_positions_is_permutation_equivariant_when_bidirectional():
    torch.manual_seed(0)
    model = PositionProbe(11, "none", d_model=16, num_heads=2, causal=False).eval()
    tokens = torch.randint(11, (2, 8))
    perm = torch.randperm(8)
    assert torch.allclose(model(tokens)[:, perm], model(tokens[:, perm]), atol=1e-5)
    with_pe = PositionProbe(11, "rope", d_model=16, num_heads=2, causal=False).eval()
    assert not torch.allclose(with_pe(tokens)[:, perm], with_pe(tokens[:, perm]), atol=1e-3)


def test_probe_is_causal_when_asked():
    torch.manual_seed(0)
    model = PositionProbe(11, "alibi", d_model=16, num_heads=2, causal=True).eval()
    tokens = torch.randint(11, (1, 8))
    changed = tokens.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 11
    assert torch.allclose(model(tokens)[:, :5], model(changed)[:, :5], atol=1e-5)


@pytest.mark.parametrize("position", POSITIONS)
def test_probe_is_causal_flag_equals_an_explicit_causal_mask(position):
    """The probe passes is_causal=True (no mask built); that must equal the layers run with causal_mask."""
    from tfm_course.attention import causal_mask

    torch.manual_seed(0)
    model = PositionProbe(11, position, d_model=16, num_heads=2, num_layers=2, max_len=12).eval()
    tokens = torch.randint(11, (2, 9))
    with torch.no_grad():
        x = model.embed(tokens)
        if model.absolute is not None:
            x = model.absolute(x)
        bias = model.relative(9) if model.relative is not None else None
        if position == "alibi":
            from tfm_course.positional import alibi_bias
            bias = alibi_bias(2, 9)
        for layer in model.layers:
            x = layer(x, mask=causal_mask(9), position_bias=bias)
        assert torch.allclose(model(tokens), model.head(model.norm(x)), atol=1e-5)


def test_probe_shares_one_rotary_module_across_layers():
    model = PositionProbe(11, "rope", d_model=16, num_heads=2, num_layers=3)
    rotaries = {id(layer.self_attn.rotary) for layer in model.layers}
    assert len(rotaries) == 1


def test_probe_rejects_bad_input():
    with pytest.raises(ValueError, match="position must be one of"):
        PositionProbe(11, "absolute")
    with pytest.raises(ValueError, match="batch, seq"):
        PositionProbe(11, "none")(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=8"):
        PositionProbe(11, "learned", d_model=16, num_heads=2, max_len=8)(torch.zeros(1, 9, dtype=torch.long))
