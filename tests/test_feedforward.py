"""FeedForward's weight names: SwiGLU's ``gate`` is the branch through the SiLU (as in LLaMA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.layers import EncoderLayer, FeedForward

D, FF = 8, 12


def swiglu_by_hand(x, w_gate, w_up, w_down):
    """(SiLU(x W1) ⊙ x W3) W2 with W1 the gate, W3 the up branch, W2 the down projection."""
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def test_swiglu_weights_are_named_gate_up_down_with_their_shapes():
    ffn = FeedForward(D, FF, activation="swiglu", bias=False)
    shapes = {name: tuple(p.shape) for name, p in ffn.named_parameters()}
    assert shapes == {"gate.weight": (FF, D), "up.weight": (FF, D), "down.weight": (D, FF)}
    assert (ffn.d_model, ffn.d_ff) == (D, FF)


def test_gate_is_the_branch_through_the_silu():
    torch.manual_seed(0)
    ffn = FeedForward(D, FF, activation="swiglu", bias=False)
    x = torch.randn(2, 5, D)
    want = swiglu_by_hand(x, ffn.gate.weight.T, ffn.up.weight.T, ffn.down.weight.T)
    swapped = swiglu_by_hand(x, ffn.up.weight.T, ffn.gate.weight.T, ffn.down.weight.T)
    torch.testing.assert_close(ffn(x), want)
    assert (ffn(x) - swapped).abs().max() > 1e-2  # the two branches are not interchangeable


def test_a_closed_gate_shuts_the_block_whatever_the_up_branch_says():
    """SiLU(z) -> 0 for z -> -inf: a gate biased far negative zeroes the output; the up branch,
    linear, passes a large value through. This fails for an implementation that puts the SiLU on
    ``up``."""
    torch.manual_seed(0)
    x = torch.randn(3, D)
    closed_gate = FeedForward(D, FF, activation="swiglu")
    very_negative_up = FeedForward(D, FF, activation="swiglu")
    with torch.no_grad():
        for ffn, branch in ((closed_gate, "gate"), (very_negative_up, "up")):
            getattr(ffn, branch).weight.zero_()
            getattr(ffn, branch).bias.fill_(-60.0)   # SiLU(-60) ≈ -5e-25; the linear branch stays -60
            ffn.down.bias.zero_()
        assert closed_gate(x).abs().max() < 1e-20
        assert very_negative_up(x).abs().max() > 1.0


def test_relu_and_gelu_blocks_keep_pytorchs_names():
    for activation in ("relu", "gelu"):
        ffn = FeedForward(D, FF, activation=activation)
        assert {name for name, _ in ffn.named_parameters()} == {
            "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}
        assert not hasattr(ffn, "gate") and not hasattr(ffn, "up") and not hasattr(ffn, "down")


def test_the_other_layouts_names_fail_with_a_message_that_gives_the_right_ones():
    swiglu = FeedForward(D, FF, activation="swiglu")
    with pytest.raises(AttributeError, match=r"'swiglu' FeedForward has no 'linear1'.*gate, up, down"):
        swiglu.linear1
    with pytest.raises(AttributeError, match=r"gate = W1 through the SiLU"):
        swiglu.linear2
    with pytest.raises(AttributeError, match=r"'relu' FeedForward has no 'gate': its weights are linear1, linear2"):
        FeedForward(D, FF).gate
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):  # other names: as usual
        swiglu.nonexistent


def test_an_encoder_layers_swiglu_block_uses_the_same_names():
    layer = EncoderLayer(D, 2, FF, activation="swiglu", bias=False)
    names = {name for name, _ in layer.named_parameters() if name.startswith("ffn.")}
    assert names == {"ffn.gate.weight", "ffn.up.weight", "ffn.down.weight"}


@pytest.mark.hf
def test_same_names_and_output_as_hugging_face_llama_mlp():
    """Copy weights *by name* into Hugging Face's LlamaMLP (gate_proj, up_proj, down_proj): a
    branch stored under the wrong name would give another output."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=2,
                                      num_key_value_heads=2, hidden_act="silu",
                                      mlp_bias=False)
    hf = LlamaMLP(config).eval()
    torch.manual_seed(0)
    ours = FeedForward(D, FF, activation="swiglu", bias=False).eval()
    hf.load_state_dict({f"{name}_proj.weight": p for name, p in
                        ((n.removesuffix(".weight"), p) for n, p in ours.state_dict().items())})
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), atol=1e-6, rtol=1e-6)
