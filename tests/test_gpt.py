"""tfm_course.models.gpt: Hugging Face parity, tying, initialisation, causality, the KV cache,
FLOPs per token, a short training run, bad input."""

import hashlib
import math

import pytest
import torch

from cuda_helpers import fp32_matmuls, needs_cuda
from tfm_course.attention import MultiHeadAttention, kv_cache_bytes
from tfm_course.experiments.measure import count_flops
import tfm_course.decoding as decoding
from tfm_course.decoding import beam_search
from tfm_course.models.gpt import GPT, CausalSelfAttention, GPTConfig, KVCache, Recompute

SMALL = dict(vocab_size=23, max_len=24, d_model=32, n_layers=2, n_heads=4)


def _model(seed=0, sharpen=True, **overrides):
    """A random GPT whose next-token distributions are peaked (GPT-2's 0.02 init gives nearly
    uniform ones, where float rounding could decide a greedy choice)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**SMALL, **overrides})).eval()
    if sharpen:
        with torch.no_grad():
            model.tok_embed.weight.mul_(40)
    return model


def _ids(batch, length, vocab=SMALL["vocab_size"], seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- config and structure
@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 0, "vocab_size must be a positive integer"),
    ("n_layers", 1.5, "n_layers must be a positive integer"),
    ("n_heads", 5, "d_model 32 is not divisible by n_heads 5"),
    ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
    ("activation", "relu", "activation must be 'gelu' or 'gelu_tanh'"),
])
def test_config_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**SMALL, field: value})


def test_output_layer_is_the_token_embedding():
    model = _model(sharpen=False)
    assert model.lm_head.weight is model.tok_embed.weight
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(p.numel() for n, p in model.named_parameters() if n != "lm_head.weight")
    logits, loss = model(_ids(2, 8), _ids(2, 8, seed=1))
    loss.backward()
    assert model.tok_embed.weight.grad is model.lm_head.weight.grad
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["tok_embed.weight"].data_ptr()


def test_gpt2_initialisation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, max_len=256, d_model=256, n_layers=8, n_heads=4))
    residual = 0.02 / math.sqrt(2 * 8)
    for name, p in model.named_parameters():
        if name.endswith("attn.out_proj.weight") or name.endswith("ffn.linear2.weight"):
            assert abs(p.std().item() - residual) < 0.05 * residual, name
        elif p.dim() == 2:
            assert abs(p.std().item() - 0.02) < 0.05 * 0.02 and abs(p.mean().item()) < 1e-3, name
        elif name.endswith("bias") and "norm" not in name:
            assert (p == 0).all(), name
        elif "norm" in name:
            assert (p == (1 if name.endswith("weight") else 0)).all(), name


@pytest.mark.parametrize("bias", [True, False])
def test_packed_attention_equals_multi_head_attention_with_the_three_matrices(bias):
    """One (d, 3d) projection is W_q, W_k and W_v stacked: the same function as the package's
    MultiHeadAttention with is_causal=True; and its cached step gives the rows of the full pass."""
    torch.manual_seed(0)
    ours, mha = CausalSelfAttention(32, 4, bias=bias).eval(), MultiHeadAttention(32, 4, bias=bias).eval()
    with torch.no_grad():
        w_q, w_k, w_v = ours.qkv.weight.chunk(3)
        for proj, w in ((mha.q_proj, w_q), (mha.k_proj, w_k), (mha.v_proj, w_v),
                        (mha.out_proj, ours.out_proj.weight)):
            proj.weight.copy_(w)
        if bias:
            for proj, b in zip((mha.q_proj, mha.k_proj, mha.v_proj), ours.qkv.bias.chunk(3)):
                proj.bias.copy_(b)
            mha.out_proj.bias.copy_(ours.out_proj.bias)
        x = torch.randn(3, 10, 32)
        full = ours(x)
        torch.testing.assert_close(full, mha(x, is_causal=True), atol=1e-6, rtol=1e-5)
        out, cache = ours.step(x[:, :4], None)  # a prompt of 4, then 1, then 5 at once
        rows = [out]
        for a, b in ((4, 5), (5, 10)):
            out, cache = ours.step(x[:, a:b], cache)
            rows.append(out)
        torch.testing.assert_close(torch.cat(rows, 1), full, atol=1e-6, rtol=1e-5)
        assert cache[0].shape == (3, 4, 10, 8)


def test_no_position_reads_the_future():
    model = _model()
    ids = _ids(3, 20)
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % SMALL["vocab_size"]
    with torch.no_grad():
        a, b = model(ids)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :12], b[:, :12], atol=1e-5, rtol=0)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-2


def test_loss_is_the_next_token_cross_entropy_and_ignores_minus_100():
    model = _model(sharpen=False)
    ids = _ids(2, 10)
    logits, loss = model(ids[:, :-1], ids[:, 1:])
    logp = torch.log_softmax(logits, -1)
    want = -logp.gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(loss, want)
    targets = ids[:, 1:].clone()
    targets[0, 3:] = -100
    _, partial = model(ids[:, :-1], targets)
    keep = targets != -100
    want = -logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[keep].mean()
    torch.testing.assert_close(partial, want)


# --------------------------------------------------------------------------- Hugging Face
HF_CONFIGS = [
    dict(vocab_size=101, n_positions=37, n_embd=48, n_layer=3, n_head=4),  # gelu_new (GPT-2)
    dict(vocab_size=50, n_positions=16, n_embd=30, n_layer=1, n_head=5),  # d_head = 6
    dict(vocab_size=7, n_positions=9, n_embd=12, n_layer=2, n_head=1, activation_function="gelu"),
]


def _hf_model(seed, **config):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**config, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.hf
@pytest.mark.parametrize("config", HF_CONFIGS, ids=["gpt2-like", "odd-head-width", "exact-gelu"])
def test_from_hf_gives_the_same_logits_and_loss(config):
    hf = _hf_model(1, **config)
    ours = GPT.from_hf(hf).eval()
    assert ours.config.n_layers == config["n_layer"] and ours.lm_head.weight is ours.tok_embed.weight
    ids = _ids(3, config["n_positions"], config["vocab_size"])
    with torch.no_grad():
        theirs = hf(ids, labels=ids)
        logits, _ = ours(ids)
        _, loss = ours(ids[:, :-1], ids[:, 1:])  # Hugging Face shifts the labels inside
    torch.testing.assert_close(logits, theirs.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=0)


@pytest.mark.hf
def test_from_hf_refuses_what_it_cannot_copy():
    hf = _hf_model(0, **HF_CONFIGS[1], n_inner=17)
    with pytest.raises(ValueError, match="n_inner"):
        GPT.from_hf(hf)
    hf = _hf_model(0, **HF_CONFIGS[1], activation_function="relu")
    with pytest.raises(ValueError, match="activation_function 'relu'"):
        GPT.from_hf(hf)
    hf = _hf_model(0, **HF_CONFIGS[1], attn_pdrop=0.0)  # resid_pdrop and embd_pdrop stay 0.1
    with pytest.raises(ValueError, match="embd_pdrop/attn_pdrop/resid_pdrop"):
        GPT.from_hf(hf)
    hf = _hf_model(0, **HF_CONFIGS[1], embd_pdrop=0.2, attn_pdrop=0.2, resid_pdrop=0.2)
    assert GPT.from_hf(hf).config.dropout == 0.2


@pytest.mark.hf
def test_from_pretrained_loads_a_saved_folder_and_checks_its_hash(tmp_path):
    hf = _hf_model(2, **HF_CONFIGS[0])
    hf.save_pretrained(tmp_path)
    digest = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    ours = GPT.from_pretrained(tmp_path, sha256=digest).eval()
    ids = _ids(2, 11, HF_CONFIGS[0]["vocab_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="expected 00"):
        GPT.from_pretrained(tmp_path, sha256="00" * 32)


# --------------------------------------------------------------------------- generation
@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8), dict(temperature=1.0, top_k=10, top_p=0.9)],
    ids=["greedy", "T=1", "top-k", "top-p", "both"])
def test_generate_with_and_without_the_cache_gives_identical_tokens(sampling):
    model = _model()
    prompt = _ids(4, 3)
    n = SMALL["max_len"] - prompt.shape[1]  # right up to max_len
    outs = [model.generate(prompt, n, use_cache=use_cache,
                           generator=torch.Generator().manual_seed(7), **sampling)
            for use_cache in (True, False)]
    assert outs[0].shape == (4, SMALL["max_len"]) and torch.equal(outs[0][:, :3], prompt)
    assert torch.equal(outs[0], outs[1])


def test_kv_cache_logits_equal_recompute_and_its_size_is_as_computed():
    model = _model()
    ids = _ids(3, 12)
    cache, full = KVCache(model), Recompute(model)
    per_token = model.kv_cache_bytes_per_token(torch.float32)
    assert per_token == kv_cache_bytes(SMALL["n_layers"], SMALL["n_heads"], 32 // 4, 4)
    with torch.no_grad():
        for t in (5, 6, 7, 12):  # a 5-token prompt, then one token at a time, then five at once
            torch.testing.assert_close(cache(ids[:, :t]), full(ids[:, :t]), atol=1e-4, rtol=1e-5)
            assert cache.nbytes() == 3 * t * per_token
    assert cache.kv[0][0].shape == (3, 4, 12, 8)  # (batch, heads, positions, d_head)


def test_beam_search_decodes_a_gpt_through_the_same_interface():
    model = _model()
    prompt = _ids(2, 4)
    with torch.no_grad():
        a = beam_search(model.stepper(use_cache=True), 2, 3, bos_id=0, eos_id=1, max_len=10,
                        prompt=prompt)
        b = beam_search(model.stepper(use_cache=False), 2, 3, bos_id=0, eos_id=1, max_len=10,
                        prompt=prompt)
    assert torch.equal(a[0], b[0])
    torch.testing.assert_close(a[1], b[1], atol=1e-4, rtol=1e-5)


def test_generate_restores_training_mode_and_stops_at_eos():
    model = _model(dropout=0.3).train()
    prompt = _ids(2, 2)
    a = model.generate(prompt, 10, temperature=0.0)
    b = model.generate(prompt, 10, temperature=0.0)
    assert torch.equal(a, b), "dropout is off while generating"
    assert model.training
    eos = int(a[0, 4])  # the row-0 token at step 3: make it the end marker
    out = model.generate(prompt, 10, temperature=0.0, eos_id=eos)
    assert out.shape[1] <= 12 and (out[0, 5:] == 0).all()


@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate(_ids(1, 20), 5), r"prompt \(20 tokens\) plus max_new_tokens \(5\) exceed max_len 24"),
    (lambda m: m(_ids(1, 25)), "positions up to 25 exceed max_len 24"),
    (lambda m: m(torch.rand(2, 5)), "ids must be integer token ids"),
    (lambda m: m(torch.tensor([1, 2, 3])), "ids must be integer token ids"),
    (lambda m: m(torch.tensor([[1, 23]])), r"token ids must lie in \[0, 23\), got values in \[1, 23\]"),
    (lambda m: m(_ids(2, 5), _ids(2, 4)), r"targets \(2, 4\) must have the shape of ids"),
    (lambda m: m(_ids(1, 3), torch.tensor([[0, 1, 30]])), r"target ids must lie in \[0, 23\)"),
    (lambda m: m.generate(_ids(1, 3), 5, top_k=0), "top_k must be an integer >= 1"),
    (lambda m: m.generate(_ids(1, 3), 5, top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (lambda m: m.generate(_ids(1, 3), 5, top_p=1.01), r"top_p must be a number in \(0, 1\]"),
    (lambda m: m.generate(_ids(1, 3), 5, temperature=-0.5), "temperature must be a number >= 0"),
    (lambda m: KVCache(m)(_ids(1, 30)), "positions up to 30 exceed max_len 24"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(_model(sharpen=False))


# --------------------------------------------------------------------------- cost
@pytest.mark.parametrize("seq_len", [8, 24])
def test_flops_per_token_equals_the_counted_flops(seq_len):
    model = _model(sharpen=False).train()
    ids = _ids(2, seq_len)

    def train_pass():
        model(ids, ids)[1].backward()

    counted = count_flops(train_pass) / ids.numel()
    assert counted == model.flops_per_token(seq_len)
    d, L, V = SMALL["d_model"], SMALL["n_layers"], SMALL["vocab_size"]
    assert model.flops_per_token(seq_len) == 6 * (12 * L * d * d + V * d) + 12 * L * d * seq_len
    mfu = model.estimate_mfu(tokens_per_second=1e4, peak_flops=1e12, seq_len=seq_len)
    assert mfu == pytest.approx(model.flops_per_token(seq_len) * 1e4 / 1e12)
    with pytest.raises(ValueError, match="peak_flops must be positive"):
        model.estimate_mfu(1e4, 0.0)


# --------------------------------------------------------------------------- training
def test_a_short_training_run_learns_a_sequence_rule():
    """x[t+1] = (x[t] + step) mod V with a random step in {1, 2, 3, 5} per sequence: after two
    tokens the rest is determined, so the loss can fall from ln V towards ln(4) / (T - 1)."""
    V, T, steps = 16, 17, 120
    g = torch.Generator().manual_seed(0)

    def batch(n):
        start = torch.randint(0, V, (n, 1), generator=g)
        step = torch.tensor([1, 2, 3, 5])[torch.randint(0, 4, (n, 1), generator=g)]
        seq = (start + step * torch.arange(T)) % V
        return seq[:, :-1], seq[:, 1:]

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, max_len=T - 1, d_model=48, n_layers=2, n_heads=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(*batch(32))[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        held_out = model(*batch(256))[1].item()
    floor = math.log(4) / (T - 1)  # the data's own uncertainty per predicted token
    assert floor - 0.01 < held_out < 0.25 * math.log(V), held_out


# --------------------------------------------------------------------------- on a GPU
@needs_cuda
def test_on_cuda_cache_equals_recompute_and_logits_equal_the_cpu(monkeypatch):
    model = _model()
    ids = _ids(3, 10)
    with fp32_matmuls(), torch.no_grad():
        want = model(ids)[0]
        model = model.cuda()
        got = model(ids.cuda())[0]
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    prompt = ids.cuda()[:, :4]
    for sampling in (dict(temperature=0.0), dict(temperature=0.9, top_k=8, top_p=0.9)):
        outs = [model.generate(prompt, 20, use_cache=use_cache,
                               generator=torch.Generator("cuda").manual_seed(0), **sampling)
                for use_cache in (True, False)]
        assert outs[0].device.type == "cuda" and torch.equal(outs[0], outs[1])
    eos = int(outs[0][0, 6])
    stopped = model.generate(prompt, 20, temperature=0.0, eos_id=eos)  # looks every 8 steps
    monkeypatch.setattr(decoding, "_checks_every", lambda device: 1)
    assert torch.equal(stopped, model.generate(prompt, 20, temperature=0.0, eos_id=eos))


@needs_cuda
def test_on_cuda_a_training_step_under_autocast_is_finite():
    from tfm_course.device import autocast_dtype

    model = _model(sharpen=False).cuda().train()
    dtype = autocast_dtype(torch.device("cuda"))
    ids = _ids(4, 24).cuda()
    with torch.autocast("cuda", dtype=dtype):
        logits, loss = model(ids[:, :-1], ids[:, 1:])
    assert logits.dtype == dtype
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.hf
def test_gpt1_count_is_hugging_faces_once_the_final_layernorm_it_lacks_is_left_out():
    """Chapter 8's table: GPT-1 is post-LN, so our pre-LN GPT's final LayerNorm is not in it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.OpenAIGPTConfig(vocab_size=40478, n_positions=512, n_embd=768, n_layer=12, n_head=12)
    with torch.device("meta"):
        theirs = sum(p.numel() for p in transformers.OpenAIGPTLMHeadModel(config).parameters())
        ours = GPT(GPTConfig(vocab_size=40478, max_len=512, d_model=768, n_layers=12, n_heads=12))
    n = sum(p.numel() for p in ours.parameters()) - sum(p.numel() for p in ours.norm.parameters())
    assert n == theirs == 116_534_784
