"""tfm_course.models.t5: T5's departures from the 2017 Transformer, the KV cache, Hugging Face parity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cuda_helpers import fp32_matmuls, needs_cuda
from tfm_course import decoding
from tfm_course.layers import RMSNorm
from tfm_course.models.t5 import T5, T5Attention, T5Config, prefix_lm_mask, shift_right
from tfm_course.models.t5_hf import hf_key
from tfm_course.positional import relative_position_bucket

SMALL = dict(vocab_size=61, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_heads=3, dropout=0.0,
             num_buckets=8, max_distance=20)


def small(seed: int = 0, **overrides) -> T5:
    torch.manual_seed(seed)
    return T5(T5Config(**{**SMALL, **overrides})).eval()


def batch(seed: int = 0, batch_size: int = 3, src_len: int = 13, tgt_len: int = 7, vocab: int = 61):
    """Source ids with right padding (lengths 13, 9, 4), the bool mask, decoder inputs."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, vocab, (batch_size, src_len), generator=g)
    lengths = torch.tensor([src_len, src_len - 4, 4][:batch_size])
    mask = torch.arange(src_len)[None, :] < lengths[:, None]
    src = src.masked_fill(~mask, 0)
    dec = torch.randint(2, vocab, (batch_size, tgt_len), generator=g)
    dec[:, 0] = 0  # the decoder starts from <pad>
    return src, mask, dec


# --------------------------------------------------------------------------- structure
def test_shapes_and_what_t5_leaves_out():
    model = small()
    src, mask, dec = batch()
    assert model(src, dec, mask).shape == (3, 7, 61)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith(".bias") for n in names), "T5 has no bias vectors"
    assert not any("pos" in n for n in names), "no position embeddings"
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 3 * 2 + 2  # encoder 2 per block, decoder 3, two final norms
    assert model.lm_head.weight is model.shared.weight


def test_relative_bias_owned_by_the_first_block_of_each_stack():
    model = small(num_layers=3, num_decoder_layers=2)
    owners = [b.relative_bias is not None for b in model.encoder.blocks]
    assert owners == [True, False, False]
    assert [b.relative_bias is not None for b in model.decoder.blocks] == [True, False]
    assert model.encoder.blocks[0].relative_bias.bidirectional
    assert not model.decoder.blocks[0].relative_bias.bidirectional
    # every block receives the first block's bias: zeroing the table changes every layer's scores
    seen = []
    for block in model.encoder.blocks:
        block.self_attn.register_forward_hook(lambda m, args, out: seen.append(args[3]))
    src, mask, _ = batch()
    model.encode(src, mask)
    assert len(seen) == 3 and all(b is seen[0] for b in seen)
    n = src.shape[1]
    want = model.encoder.blocks[0].relative_bias.embedding.weight[
        relative_position_bucket(torch.arange(n)[None] - torch.arange(n)[:, None], True, 8, 20)]
    torch.testing.assert_close(seen[0][0], want.permute(2, 0, 1))  # row 0 has no padding
    assert (seen[0][2, :, :, 4:] == torch.finfo(torch.float32).min).all()  # row 2's padded keys


def test_bucket_golden_values_both_directions():
    bidirectional = {-200: 15, -64: 14, -32: 12, -16: 10, -8: 8, -7: 7, 0: 0, 1: 17, 7: 23, 8: 24,
                     16: 26, 32: 28, 64: 30, 127: 31, 128: 31, 1000: 31}
    causal = {0: 0, 3: 0, -1: 1, -15: 15, -16: 16, -32: 21, -64: 26, -128: 31, -1000: 31}
    for table, bidi in ((bidirectional, True), (causal, False)):
        rel = torch.tensor(list(table))
        assert relative_position_bucket(rel, bidi, 32, 128).tolist() == list(table.values())
    model = T5(T5Config(vocab_size=10, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2))
    bias = model.decoder.blocks[0].relative_bias(1, 200)  # one query at position 199
    table = model.decoder.blocks[0].relative_bias.embedding.weight
    torch.testing.assert_close(bias[0, :, 0, 199 - 64], table[26])  # key 64 to the left: bucket 26


@pytest.mark.parametrize("fused", [True, False])
def test_scores_are_not_scaled(fused):
    torch.manual_seed(0)
    attn = T5Attention(d_model=12, num_heads=2, d_kv=5, fused=fused)
    x, bias = torch.randn(2, 4, 12), torch.randn(1, 2, 4, 4)
    k, v = attn.keys_values(x)
    q = attn.q(x).view(2, 4, 2, 5).transpose(1, 2)
    want = (q @ k.transpose(-2, -1) + bias).softmax(-1) @ v  # no / sqrt(5)
    torch.testing.assert_close(attn(x, k, v, bias), attn.o(want.transpose(1, 2).reshape(2, 4, 10)))


def test_fused_and_written_out_attention_agree():
    model = small(8, dropout=0.0)
    src, mask, dec = batch(8)
    fused = model(src, dec, mask)
    for m in model.modules():
        if isinstance(m, T5Attention):
            m.fused = False
    torch.testing.assert_close(model(src, dec, mask), fused, atol=1e-5, rtol=1e-5)


def test_tied_output_is_rescaled_and_untied_is_not():
    for tie in (True, False):
        model = small(tie_embeddings=tie)
        src, mask, dec = batch()
        hidden = model.decoder(model.shared(dec), torch.ones(7, 7, dtype=torch.bool).tril(),
                               model.encode(src, mask), mask[:, None, None, :])
        scale = model.config.d_model ** -0.5 if tie else 1.0
        torch.testing.assert_close(model(src, dec, mask), F.linear(hidden * scale, model.lm_head.weight))
        assert (model.lm_head.weight is model.shared.weight) == tie


def test_gated_gelu_feed_forward():
    model = small(feed_forward="gated-gelu")
    ffn = model.encoder.blocks[0].ffn
    x = torch.randn(2, 3, 24)
    want = ffn.down(F.gelu(ffn.gate(x), approximate="tanh") * ffn.up(x))
    torch.testing.assert_close(ffn(x), want)
    src, mask, dec = batch()
    assert model(src, dec, mask).shape == (3, 7, 61)


def test_initialisation_folds_the_scaling_into_the_queries():
    model = T5(T5Config(vocab_size=500, d_model=256, d_kv=64, d_ff=512, num_layers=1, num_heads=4))
    attn = model.encoder.blocks[0].self_attn
    assert attn.q.weight.std().item() == pytest.approx((256 * 64) ** -0.5, rel=0.05)
    assert attn.k.weight.std().item() == pytest.approx(256 ** -0.5, rel=0.05)
    assert model.shared.weight.std().item() == pytest.approx(1.0, rel=0.05)


# --------------------------------------------------------------------------- masks
def test_padding_changes_nothing_for_the_real_tokens():
    model = small()
    src, mask, dec = batch()
    padded = model(src, dec, mask)
    for row, length in enumerate(mask.sum(1).tolist()):
        alone = model(src[row:row + 1, :length], dec[row:row + 1])
        torch.testing.assert_close(padded[row:row + 1], alone, atol=1e-5, rtol=1e-5)
    # left padding works too: T5 has no absolute positions
    left = torch.cat([torch.zeros(1, 4, dtype=torch.long), src[2:3, :4]], dim=1)
    left_mask = torch.cat([torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)], 1)
    torch.testing.assert_close(model(left, dec[2:3], left_mask), padded[2:3], atol=1e-5, rtol=1e-5)


def test_decoder_is_causal_and_encoder_is_not():
    model = small()
    src, mask, dec = batch()
    base = model(src, dec, mask)
    later = dec.clone()
    later[:, 4:] = 3
    torch.testing.assert_close(model(src, later, mask)[:, :4], base[:, :4])
    assert not torch.allclose(model(src, later, mask)[:, 4:], base[:, 4:])
    src2 = src.clone()
    src2[0, -1] = 5  # the last source token reaches every decoder position
    assert not torch.allclose(model(src2, dec, mask)[0, 0], base[0, 0])


def test_prefix_lm_mask():
    m = prefix_lm_mask(5, 2)
    assert m.tolist() == [[True, True, False, False, False], [True, True, False, False, False],
                          [True, True, True, False, False], [True, True, True, True, False],
                          [True, True, True, True, True]]
    assert torch.equal(prefix_lm_mask(4, 0), torch.ones(4, 4, dtype=torch.bool).tril())
    assert prefix_lm_mask(4, 4).all()


def test_shift_right():
    labels = torch.tensor([[5, 6, 1], [7, 1, 0]])
    assert shift_right(labels).tolist() == [[0, 5, 6], [0, 7, 1]]


# --------------------------------------------------------------------------- generation
@pytest.mark.parametrize("overrides", [{}, {"feed_forward": "gated-gelu", "tie_embeddings": False},
                                       {"num_layers": 1, "num_decoder_layers": 3, "d_kv": 5}])
def test_cache_gives_the_same_tokens_as_recomputing(overrides):
    model = small(1, **overrides)
    src, mask, _ = batch(1)
    cached = model.generate(src, mask, max_new_tokens=25)
    recomputed = model.generate(src, mask, max_new_tokens=25, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert cached.shape[1] > 20  # a random model rarely stops: the cache was exercised


def test_cached_logits_match_step_by_step_and_several_tokens_per_call():
    model = small(2)
    src, mask, dec = batch(2)
    full = model(src, dec, mask)
    with torch.no_grad():
        stepper = model.stepper(src, attention_mask=mask)
        first = stepper(dec[:, :3])  # three tokens in one call
        torch.testing.assert_close(first, full[:, 2], atol=1e-5, rtol=1e-5)
        for t in range(4, 8):
            torch.testing.assert_close(stepper(dec[:, :t]), full[:, t - 1], atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="must be longer"):
            stepper(dec[:, :7])


def test_stepper_reorder_and_beam_search_cached_equals_recomputed():
    model = small(3)
    src, mask, _ = batch(3)
    beams = 3
    out = []
    for use_cache in (True, False):
        stepper = model.stepper(src.repeat_interleave(beams, 0), use_cache=use_cache,
                                attention_mask=mask.repeat_interleave(beams, 0))
        with torch.no_grad():
            out.append(decoding.beam_search(stepper, 3, beams, bos_id=0, eos_id=1, max_len=12))
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], atol=1e-4, rtol=1e-4)


def test_stepper_default_mask_is_src_not_pad_and_generate_keeps_the_mode():
    model = small(4)
    src, mask, _ = batch(4)
    model.train()  # generate switches dropout off and gives the mode back
    assert torch.equal(model.generate(src, mask, max_new_tokens=6),
                       model.generate(src, None, max_new_tokens=6))
    assert model.training
    stepper = model.stepper(src)  # mask from pad_id = 0
    assert torch.equal(stepper.mask, mask)


def test_forward_and_cached_steps_read_nothing_back_from_the_device():
    """On the meta device a host read or a tensor made on the CPU fails: none in forward or steps."""
    model = small().to("meta")
    src, mask, dec = (t.to("meta") for t in batch())
    assert model(src, dec, mask).shape == (3, 7, 61)
    stepper = model.stepper(src, attention_mask=mask)
    assert stepper(dec[:, :1]).shape == stepper(dec[:, :3]).shape == (3, 61)


# --------------------------------------------------------------------------- training
def test_a_few_steps_fit_one_span_corruption_batch():
    from tfm_course.data.span_corruption import span_corrupt_batch, t5_sentinel_ids

    model = small(5, vocab_size=40)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 30, (8, 40), generator=g)
    inputs, targets = span_corrupt_batch(ids, t5_sentinel_ids(40, 10), eos_id=1, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        logits = model(inputs, shift_right(targets))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 0.8 * math.log(40) and losses[-1] < 0.5 * losses[0]


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, match", [
    (lambda m, s, k, d: m(s.float(), d, k), "input_ids must be integer"),
    (lambda m, s, k, d: m(s[0], d, k), r"input_ids must be integer token ids \(batch, seq\)"),
    (lambda m, s, k, d: m(s, d[:2], k), "share the batch"),
    (lambda m, s, k, d: m(s, d, k.long()), "attention_mask must be bool"),
    (lambda m, s, k, d: m(s, d, k[:, :5]), r"\(batch, src_len\) = \(3, 13\)"),
    (lambda m, s, k, d: m.stepper(s)(d[:1]), "prefix has 1 rows"),
    (lambda m, s, k, d: T5Config(**{**SMALL, "feed_forward": "swiglu"}), "'relu' or 'gated-gelu'"),
    (lambda m, s, k, d: T5Config(**{**SMALL, "vocab_size": 0}), "vocab_size must be a positive int"),
    (lambda m, s, k, d: T5Config(**{**SMALL, "eos_id": 61}), r"eos_id must be in \[0, 61\)"),
    (lambda m, s, k, d: T5Config(**{**SMALL, "dropout": 1.0}), "dropout"),
    (lambda m, s, k, d: prefix_lm_mask(3, 4), "prefix_len <= seq_len"),
    (lambda m, s, k, d: T5.from_pretrained("/nonexistent-folder"), "no config.json"),
])
def test_bad_input_gives_clear_errors(call, match):
    model = small()
    src, mask, dec = batch()
    with pytest.raises(ValueError, match=match):
        call(model, src, mask, dec)


# --------------------------------------------------------------------------- Hugging Face
def test_hf_key_names():
    assert hf_key("decoder.block.3.layer.1.EncDecAttention.q.weight") == \
        "decoder.blocks.3.cross_attn.q.weight"
    assert hf_key("decoder.block.3.layer.2.layer_norm.weight") == "decoder.blocks.3.norm_ffn.weight"
    assert hf_key("encoder.block.3.layer.1.layer_norm.weight") == "encoder.blocks.3.norm_ffn.weight"
    assert hf_key("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight") == \
        "encoder.blocks.0.relative_bias.embedding.weight"
    assert hf_key("decoder.block.0.layer.2.DenseReluDense.wi_1.weight", gated=True) == \
        "decoder.blocks.0.ffn.up.weight"
    assert hf_key("decoder.block.0.layer.2.DenseReluDense.wo.weight", gated=True) == \
        "decoder.blocks.0.ffn.down.weight"
    assert hf_key("decoder.block.0.layer.2.DenseReluDense.wo.weight") == "decoder.blocks.0.ffn.linear2.weight"
    assert hf_key("decoder.final_layer_norm.weight") == "decoder.final_norm.weight"


HF_CONFIGS = {
    "v1.0 relu, tied": dict(vocab_size=61, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_heads=3),
    "v1.1 gated-gelu, no rescale": dict(vocab_size=61, d_model=24, d_kv=8, d_ff=40, num_layers=2,
                                        num_heads=3, feed_forward_proj="gated-gelu",
                                        tie_word_embeddings=False),
    "odd sizes": dict(vocab_size=53, d_model=20, d_kv=5, d_ff=33, num_layers=1, num_decoder_layers=3,
                      num_heads=3, relative_attention_num_buckets=8, relative_attention_max_distance=20),
    "eager attention, 40 tokens": dict(vocab_size=61, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                       num_heads=4, attn_implementation="eager"),
}


def hf_model(name: str):
    transformers = pytest.importorskip("transformers")
    kwargs = dict(HF_CONFIGS[name])
    attn = kwargs.pop("attn_implementation", None)
    torch.manual_seed(0)
    config = transformers.T5Config(dropout_rate=0.0, decoder_start_token_id=0, **kwargs)
    if attn is not None:
        config._attn_implementation = attn
    return transformers.T5ForConditionalGeneration(config).eval()


@pytest.mark.hf
@pytest.mark.parametrize("name", HF_CONFIGS)
def test_same_logits_as_hugging_face(name):
    hf = hf_model(name)
    ours = T5.from_hf(hf)
    assert not ours.training  # the copy keeps the original's mode
    vocab = hf.config.vocab_size
    src_len = 40 if "40" in name else 13  # 40 tokens: distances beyond max_distance share a bucket
    src, mask, dec = batch(7, src_len=src_len, tgt_len=9, vocab=vocab)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=dec).logits
    got = ours(src, dec, mask)
    assert (got - want).abs().max().item() <= 1e-5
    assert ours.config.rescale_output == hf.config.scale_decoder_outputs


@pytest.mark.hf
@pytest.mark.parametrize("name", ["v1.0 relu, tied", "v1.1 gated-gelu, no rescale"])
def test_same_greedy_tokens_as_hugging_face_generate(name):
    hf = hf_model(name)
    ours = T5.from_hf(hf).eval()
    src, mask, _ = batch(8)
    want = hf.generate(src, attention_mask=mask.long(), max_new_tokens=15, do_sample=False, num_beams=1)
    assert torch.equal(ours.generate(src, mask, max_new_tokens=15), want[:, 1:])  # HF keeps the start token


@pytest.mark.hf
def test_from_pretrained_reads_a_save_pretrained_folder(tmp_path):
    import hashlib

    hf = hf_model("v1.1 gated-gelu, no rescale")
    hf.save_pretrained(tmp_path)
    weights = next(p for p in tmp_path.iterdir() if p.suffix in (".safetensors", ".bin"))
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    ours = T5.from_pretrained(tmp_path, sha256=digest)
    assert not ours.training  # dropout off, as Hugging Face's from_pretrained
    src, mask, dec = batch(9)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=dec).logits
    assert (ours(src, dec, mask) - want).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="sha256"):
        T5.from_pretrained(tmp_path, sha256="0" * 64)


@pytest.mark.hf
def test_from_pretrained_reads_pytorch_model_bin_and_untied_heads(tmp_path):
    hf = hf_model("v1.0 relu, tied")
    hf.config.to_json_file(tmp_path / "config.json")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])  # a v1.1-style separate head
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = T5.from_pretrained(tmp_path).eval()
    assert ours.lm_head.weight is not ours.shared.weight
    torch.testing.assert_close(ours.lm_head.weight, state["lm_head.weight"])


# --------------------------------------------------------------------------- CUDA (pytest -m gpu)
@needs_cuda
def test_cuda_matches_cpu_and_cache_equals_recompute():
    model = small(6)
    src, mask, dec = batch(6)
    with fp32_matmuls():
        want = model(src, dec, mask)
        gpu = model.to("cuda")
        got = gpu(src.cuda(), dec.cuda(), mask.cuda())
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
        cached = gpu.generate(src.cuda(), mask.cuda(), max_new_tokens=20)
        assert cached.device.type == "cuda"
        assert torch.equal(cached, gpu.generate(src.cuda(), mask.cuda(), max_new_tokens=20, use_cache=False))


@needs_cuda
def test_cuda_bf16_training_step_and_span_corruption_on_the_gpu():
    from tfm_course.data.span_corruption import fill_spans, span_corrupt_batch, t5_lengths, t5_sentinel_ids

    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(2, 50, (4, 64), device="cuda", generator=g)
    inputs, targets = span_corrupt_batch(ids, t5_sentinel_ids(61, 20), eos_id=1, generator=g)
    assert inputs.device.type == "cuda" and (inputs.shape[1], targets.shape[1]) == t5_lengths(64)
    assert fill_spans(inputs[0].cpu(), targets[0].cpu(), t5_sentinel_ids(61, 20), 1) == ids[0].tolist()
    model = small(7).cuda().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(inputs, shift_right(targets))
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                        if p.grad is not None)
