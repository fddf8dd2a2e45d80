"""Chapter 13's decoder against Hugging Face's LlamaForCausalLM and Qwen3ForCausalLM, built from
tiny random configs offline: logits, a training step's gradients, cached generation, and the
loader of a saved checkpoint (the one the Colab-only cell uses on real weights).

Tolerances: both compute in fp32 with the same operations in a different order (both call PyTorch's SDPA,
through different paths, and HF computes RMSNorm in two steps), so logits of order
1 agree to about 1e-6; 1e-5 leaves room for other BLAS builds. Gradients are compared relative to
each tensor's largest entry."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tfm_course.models.llama_hf import from_hf, hf_name, load_pretrained, sha256_of  # noqa: E402

pytestmark = pytest.mark.hf
V = 101


def _hf(kind, **overrides):
    torch.manual_seed(0)
    sizes = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, max_position_embeddings=64,
                 eos_token_id=None, bos_token_id=None, pad_token_id=None)  # no end token: HF stops at eos (2)
    if kind == "llama":
        config = transformers.LlamaConfig(**{**sizes, "rope_theta": 5000.0, **overrides})
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**{**sizes, "head_dim": 32, "tie_word_embeddings": True, **overrides})
        model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms start at 1: make every tensor count
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


CASES = [("llama", {}), ("llama", {"num_key_value_heads": 1}), ("llama", {"tie_word_embeddings": True}),
         ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}), ("qwen3", {}),
         ("qwen3", {"num_key_value_heads": 4})]
IDS = ["llama-gqa", "llama-mqa", "llama-tied", "llama-linear-rope", "qwen3-gqa", "qwen3-mha"]


def _ids(seed=1, batch=2, seq=19):
    return torch.randint(0, V, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind, overrides", CASES, ids=IDS)
def test_logits_equal(kind, overrides):
    hf = _hf(kind, **overrides)
    ours = from_hf(hf).eval()
    x = _ids()
    torch.testing.assert_close(ours(x)[0], hf(x).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind, overrides", CASES[:1] + CASES[4:5], ids=["llama", "qwen3"])
def test_a_training_steps_gradients_equal(kind, overrides):
    hf = _hf(kind, **overrides).train()
    ours = from_hf(hf).train()
    x = _ids(seq=20)
    inputs, targets = x[:, :-1], x[:, 1:]
    ours(inputs, targets)[1].backward()
    hf(x, labels=x).loss.backward()  # HF shifts the labels itself (its last position enters no loss)
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g, h = p.grad, theirs[hf_name(name)].grad
        assert (g - h).abs().max() <= 1e-4 * h.abs().max() + 1e-7, name


@pytest.mark.parametrize("kind, overrides", CASES[:1] + CASES[4:5], ids=["llama", "qwen3"])
def test_cached_greedy_generation_equals(kind, overrides):
    hf = _hf(kind, **overrides)
    ours = from_hf(hf).eval()
    prompt = _ids(seed=2, seq=6)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False)
    assert theirs.shape == (2, 36)  # HF did not stop early at an end token
    assert torch.equal(ours.generate(prompt, 30, temperature=0), theirs)


def test_the_loader_reads_a_saved_checkpoint_and_checks_its_sha256(tmp_path):
    hf = _hf("qwen3")
    hf.save_pretrained(tmp_path, safe_serialization=True)
    digest = sha256_of(tmp_path / "model.safetensors")
    ours = load_pretrained(tmp_path, sha256=digest).eval()
    x = _ids()
    torch.testing.assert_close(ours(x)[0], hf(x).logits, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="not the pinned"):
        load_pretrained(tmp_path, sha256="0" * 64)
    with pytest.raises(ValueError, match="must hold config.json"):
        load_pretrained(tmp_path / "nowhere")
