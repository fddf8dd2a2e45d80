"""Chapter 13's decoder: each switch, the preallocated KV cache, GPT-2's setting equal to chapter 8's
GPT, and the Hugging Face weight names (the parity with HF itself is in test_llama_hf.py)."""

import pytest
import torch

from tfm_course.models.gpt import GPT, GPTConfig
from tfm_course.models.llama import ConcatCache, KVCache, Llama, LlamaConfig, swiglu_width
from tfm_course.models.llama_hf import config_from_hf, hf_name
from tfm_course.positional import RotaryEmbedding

SIZES = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, max_len=40)


def ids(batch=2, seq=12, seed=0):
    return torch.randint(0, SIZES["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bad, says", [
    (dict(norm="batch"), "norm must be one of"),
    (dict(ffn="relu"), "ffn must be one of"),
    (dict(n_kv_heads=3), "multiple of n_kv_heads"),
    (dict(d_model=30), "divisible by n_heads"),
    (dict(positions="rope", head_dim=7), "head_dim must be even"),
])
def test_bad_configs_say_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match=says):
        LlamaConfig(**{**SIZES, **bad})


def test_presets_set_the_switches():
    g, l, q = LlamaConfig.gpt2(**SIZES), LlamaConfig.llama(**SIZES), LlamaConfig.qwen3(**SIZES)
    assert (g.norm, g.ffn, g.positions, g.bias, g.tie, g.qk_norm) == ("layer", "gelu", "learned", True, True, False)
    assert (l.norm, l.ffn, l.positions, l.bias, l.tie, l.qk_norm, l.eps) == ("rms", "swiglu", "rope", False, False, False, 1e-6)
    assert q.qk_norm and q.positions == "rope"


def test_swiglu_width_matches_the_gelu_parameters():
    for d in (32, 64, 128, 768):
        w = swiglu_width(d)
        assert w % 8 == 0 and abs(3 * d * w - 8 * d * d) <= 3 * d * 8  # within one rounding step
    gelu = Llama(LlamaConfig.gpt2(**SIZES)).blocks[0].ffn
    swiglu = Llama(LlamaConfig.llama(**SIZES)).blocks[0].ffn
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(n(swiglu) - n(gelu)) / n(gelu) < 0.05


def test_gpt2_setting_equals_chapter_8s_gpt():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**{k: SIZES[k] for k in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len")})).eval()
    ours = Llama.from_gpt(gpt).eval()
    x = ids()
    torch.testing.assert_close(ours(x)[0], gpt(x)[0], rtol=0, atol=1e-6)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in gpt.parameters())


@pytest.mark.parametrize("preset", ["gpt2", "llama", "qwen3"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_cached_decoding_equals_the_full_forward(preset, n_kv_heads):
    torch.manual_seed(1)
    model = Llama(getattr(LlamaConfig, preset)(**SIZES, n_kv_heads=n_kv_heads)).eval()
    x = ids(seq=15)
    full = model(x)[0]
    cache = model.new_cache(batch=2)
    steps = [model(x[:, :6], cache=cache)[0]] + [model(x[:, t:t + 1], cache=cache)[0] for t in range(6, 12)]
    steps.append(model(x[:, 12:], cache=cache)[0])  # several new tokens at once, after a cache
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 15
    assert cache.nbytes() == 15 * 2 * model.kv_cache_bytes_per_token(bytes_per_value=4)


def test_the_concatenating_cache_gives_the_same_logits():
    torch.manual_seed(4)
    model = Llama(LlamaConfig.llama(**SIZES, n_kv_heads=2)).eval()
    x = ids(seq=10)
    caches = [model.new_cache(2), model.new_cache(2, kind=ConcatCache)]
    for cache in caches:
        cache.out = torch.cat([model(x[:, :4], cache=cache)[0]] +
                              [model(x[:, t:t + 1], cache=cache)[0] for t in range(4, 10)], dim=1)
    torch.testing.assert_close(caches[0].out, caches[1].out, rtol=0, atol=1e-6)
    assert caches[0].nbytes() == caches[1].nbytes()


@pytest.mark.parametrize("kind", [KVCache, ConcatCache])
def test_a_rewound_cache_decodes_as_if_the_forgotten_positions_never_came(kind):
    torch.manual_seed(5)
    model = Llama(LlamaConfig.llama(**SIZES, n_kv_heads=2)).eval()
    x, other = ids(seq=10), ids(seq=10, seed=9)
    with torch.no_grad():
        cache = model.new_cache(2, kind=kind)
        model(x[:, :6], cache=cache)
        want = model(x[:, 6:], cache=cache)[0]
        cache.rewind(6)
        model(other[:, 6:], cache=cache)  # positions 6..9 overwritten, then forgotten again
        cache.rewind(6)
        c = model.config
        assert cache.length == 6 and cache.nbytes() == 2 * c.n_layers * 2 * c.kv_heads * c.d_head * 6 * 4
        torch.testing.assert_close(model(x[:, 6:], cache=cache)[0], want, rtol=0, atol=1e-6)
        with pytest.raises(ValueError, match="between 0 and the 10 positions"):
            cache.rewind(11)


def test_grouped_heads_share_their_keys_and_values():
    torch.manual_seed(2)
    model = Llama(LlamaConfig.llama(**SIZES, n_kv_heads=2)).eval()
    attn = model.blocks[0].attn
    assert attn.k_proj.out_features == 2 * 8 and attn.q_proj.out_features == 4 * 8
    # with the second K/V head's keys made huge, query heads 2, 3 (which read it) change; 0, 1 do not
    x = torch.randn(1, 6, 32)
    seen = {}

    def keep(module, args, output):
        seen["out"] = args[0]

    hook = attn.o_proj.register_forward_hook(keep)
    attn(x)
    before = seen["out"].view(1, 6, 4, 8).clone()
    with torch.no_grad():
        attn.k_proj.weight[8:] *= 50
    attn(x)
    after = seen["out"].view(1, 6, 4, 8)
    hook.remove()
    assert torch.allclose(before[:, :, :2], after[:, :, :2], atol=1e-6)
    assert not torch.allclose(before[:, :, 2:], after[:, :, 2:], atol=1e-3)


def test_the_cache_refuses_what_it_cannot_hold():
    model = Llama(LlamaConfig.llama(**SIZES))
    cache = KVCache(model.config, batch=1, max_len=8)
    model(ids(1, 8), cache=cache)
    with pytest.raises(ValueError, match="holds 8 positions"):
        model(ids(1, 1), cache=cache)


def test_generate_with_the_cache_equals_greedy_argmax_without_it():
    torch.manual_seed(3)
    model = Llama(LlamaConfig.qwen3(**SIZES, n_kv_heads=2)).eval()
    prompt = ids(2, 5)
    out = model.generate(prompt, max_new_tokens=8, temperature=0)
    seq = prompt
    for _ in range(8):
        seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_rope_scale_rotates_position_p_as_p_over_scale():
    plain, scaled = RotaryEmbedding(8), RotaryEmbedding(8, scale=4.0)
    x = torch.randn(1, 1, 1, 8)
    torch.testing.assert_close(scaled.rotate(x, offset=12), plain.rotate(x, offset=3))
    with pytest.raises(ValueError, match="scale must be positive"):
        RotaryEmbedding(8, scale=0)


def test_hf_names_cover_every_parameter_once():
    model = Llama(LlamaConfig.qwen3(**SIZES, n_kv_heads=2))
    names = [hf_name(k) for k in model.state_dict()]
    assert len(set(names)) == len(names)
    assert hf_name("blocks.1.ffn.gate.weight") == "model.layers.1.mlp.gate_proj.weight"
    assert hf_name("blocks.0.attn.k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_name("blocks.0.norm2.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="not a parameter"):
        hf_name("blocks.0.attn.qkv.weight")


def test_config_from_hf_reads_a_config_json():
    c = config_from_hf({"model_type": "qwen3", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                        "intermediate_size": 48, "rope_theta": 1e6, "tie_word_embeddings": True})
    assert (c.d_head, c.kv_heads, c.rope_base, c.qk_norm, c.tie, c.hidden) == (16, 2, 1e6, True, True, 48)
    with pytest.raises(ValueError, match="model_type"):
        config_from_hf({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="not supported"):
        config_from_hf({"model_type": "llama", "hidden_act": "silu", "rope_scaling": {"rope_type": "yarn"},
                        "vocab_size": 5, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "intermediate_size": 8})



def test_the_loader_refuses_a_checkpoint_with_missing_extra_or_misshapen_tensors():
    from tfm_course.models.llama_hf import _load, hf_name

    config = LlamaConfig.qwen3(**SIZES, n_kv_heads=2)
    state = {hf_name(k): v for k, v in Llama(config).state_dict().items()}
    torch.testing.assert_close(_load(config, state).state_dict()["blocks.0.ffn.up.weight"],
                               state["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match="has no place for"):
        _load(config, {**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(SIZES["d_model"])})
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        _load(config, {k: v for k, v in state.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="expected shape"):
        _load(config, {**state, "model.norm.weight": torch.ones(3)})
