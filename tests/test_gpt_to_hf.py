"""tfm_course.models.gpt_hf.to_hf_gpt2: Hugging Face's GPT2LMHeadModel holding our weights."""

import pytest
import torch

from tfm_course.models.gpt import GPT, GPTConfig
from tfm_course.models.gpt_hf import to_hf_gpt2

TINY = dict(vocab_size=29, max_len=13, d_model=24, n_layers=2, n_heads=3)


def _ours(seed, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # GPT-2's init leaves biases 0 and norms 1: make every tensor count
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.hf
@pytest.mark.parametrize("overrides", [dict(bias=False), dict(bias=True),
                                       dict(bias=False, activation="gelu")],
                         ids=["no-bias", "bias", "exact-gelu"])
def test_hf_copy_gives_our_logits_and_loss(overrides):
    pytest.importorskip("transformers")
    ours = _ours(0, **overrides)
    hf = to_hf_gpt2(ours)
    assert not hf.training and hf.lm_head.weight is hf.transformer.wte.weight  # tied, like ours
    assert hf.config.activation_function == ("gelu" if "activation" in overrides else "gelu_new")
    ids = torch.randint(0, TINY["vocab_size"], (3, TINY["max_len"]),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(ids, labels=ids)
        logits, _ = ours(ids)
        _, loss = ours(ids[:, :-1], ids[:, 1:])  # Hugging Face shifts the labels inside
    assert logits.abs().max() > 0.1  # not a trivially small output
    torch.testing.assert_close(theirs.logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs.loss, loss, atol=1e-5, rtol=0)
    # the copy owns its weights: changing it leaves ours alone
    with torch.no_grad():
        hf.transformer.wte.weight.zero_()
    assert ours.tok_embed.weight.abs().sum() > 0


@pytest.mark.hf
def test_hf_copy_keeps_dropout_mode_and_round_trips():
    pytest.importorskip("transformers")
    ours = _ours(2, dropout=0.1).train()
    hf = to_hf_gpt2(ours)
    assert hf.training
    assert (hf.config.embd_pdrop, hf.config.attn_pdrop, hf.config.resid_pdrop) == (0.1, 0.1, 0.1)
    assert hf.config.layer_norm_epsilon == 1e-5 and hf.config.n_positions == TINY["max_len"]
    back = GPT.from_hf(hf)  # the existing direction: same configuration, same tensors
    assert back.config == ours.config
    for (name, mine), theirs in zip(ours.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(theirs, mine, atol=0, rtol=0, msg=name)


def test_hf_copy_refuses_a_model_that_is_not_our_gpt():
    with pytest.raises(ValueError, match="expected a tfm_course GPT, got Linear"):
        to_hf_gpt2(torch.nn.Linear(2, 2))
