"""BERT: parity with Hugging Face, the input sum, tying, parameter count, padding, bad input,
and a short pretraining run that beats the unigram baseline."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfm_course.data.mlm import IGNORE, mask_tokens, unigram_cross_entropy
from tfm_course.device import one_cpu_thread
from tfm_course.models.bert import (Bert, BertConfig, BertForPreTraining, bert_num_parameters,
                                    hf_parameter_map, load_hf_bert)

SMALL = BertConfig(vocab_size=53, max_positions=20, type_vocab_size=3, d_model=24, num_layers=2,
                   num_heads=3, d_ff=40, dropout=0.0)


def _inputs(config: BertConfig, lengths: list[int], seq: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (len(lengths), seq), generator=g)
    segments = torch.randint(0, config.type_vocab_size, (len(lengths), seq), generator=g)
    mask = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
    return ids, segments, mask


# --------------------------------------------------------------------------- Hugging Face parity
HF_CONFIGS = {  # odd sizes: heads of width 8, 2 and 9; one segment type; a single layer
    "3 heads, 3 types": dict(vocab_size=101, hidden_size=24, num_hidden_layers=3, num_attention_heads=3,
                             intermediate_size=40, max_position_embeddings=33, type_vocab_size=3),
    "5 heads of 2": dict(vocab_size=37, hidden_size=10, num_hidden_layers=1, num_attention_heads=5,
                         intermediate_size=7, max_position_embeddings=21, type_vocab_size=2),
    "1 type, eps 1e-5": dict(vocab_size=257, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=100, max_position_embeddings=64, type_vocab_size=1,
                             layer_norm_eps=1e-5),
}


def _hf_model(kind: str, name: str, attn: str = "eager"):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(sum(map(ord, name)))
    config = transformers.BertConfig(**HF_CONFIGS[name], attn_implementation=attn)
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():  # HF starts biases at 0 and norms at 1: randomise all, so each is checked
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _hf_inputs(hf_config, seed: int = 1):
    lengths = [13, 9, 1, 6]
    return _inputs(BertConfig.from_hf(hf_config), lengths, 13, seed)


@pytest.mark.hf
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", HF_CONFIGS)
def test_bert_matches_hugging_face_bert_model(name, attn):
    hf = _hf_model("BertModel", name, attn)
    ours = Bert.from_hf(hf)
    ids, segments, mask = _hf_inputs(hf.config)
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=segments, attention_mask=mask.long())
        hidden, pooled = ours(ids, segments, mask)
    assert (hidden - want.last_hidden_state).abs().max() <= 1e-5
    assert (pooled - want.pooler_output).abs().max() <= 1e-5


@pytest.mark.hf
@pytest.mark.parametrize("name", HF_CONFIGS)
def test_pretraining_model_matches_hugging_face(name):
    hf = _hf_model("BertForPreTraining", name)
    ours = BertForPreTraining.from_hf(hf)
    ids, segments, mask = _hf_inputs(hf.config, seed=2)
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=segments, attention_mask=mask.long())
        mlm_logits, nsp_logits = ours(ids, segments, mask)
        no_segments = hf(input_ids=ids, attention_mask=mask.long()).prediction_logits
    assert mlm_logits.shape == (4, 13, hf.config.vocab_size) and nsp_logits.shape == (4, 2)
    assert (mlm_logits - want.prediction_logits).abs().max() <= 1e-5
    assert (nsp_logits - want.seq_relationship_logits).abs().max() <= 1e-5
    assert (ours(ids, attention_mask=mask)[0] - no_segments).abs().max() <= 1e-5  # defaults agree
    assert ours.mlm.decoder.weight is ours.bert.token_embedding.weight


@pytest.mark.hf
def test_parameter_names_and_shapes_match_hugging_face_one_to_one():
    hf = _hf_model("BertForPreTraining", "3 heads, 3 types")
    ours = BertForPreTraining(BertConfig.from_hf(hf.config))
    names = hf_parameter_map(ours.config.num_layers, pretraining_heads=True)
    theirs = dict(hf.named_parameters())  # tied copies listed once
    mine = dict(ours.named_parameters())
    assert set(names) == set(mine) and set(names.values()) == set(theirs)
    assert all(mine[a].shape == theirs[b].shape for a, b in names.items())
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.hf
def test_from_hf_refuses_what_it_cannot_copy():
    transformers = pytest.importorskip("transformers")
    base = dict(HF_CONFIGS["5 heads of 2"])
    with pytest.raises(ValueError, match="gelu"):
        Bert.from_hf(transformers.BertModel(transformers.BertConfig(**base, hidden_act="gelu_new")))
    untied = transformers.BertForPreTraining(transformers.BertConfig(**base, tie_word_embeddings=False))
    with pytest.raises(ValueError, match="not tied"):
        BertForPreTraining.from_hf(untied)
    with pytest.raises(ValueError, match="no pooler"):
        Bert.from_hf(transformers.BertModel(transformers.BertConfig(**base), add_pooling_layer=False))


@pytest.mark.hf
def test_load_hf_bert_reads_a_saved_checkpoint_offline(tmp_path):
    hf = _hf_model("BertForPreTraining", "5 heads of 2")
    hf.save_pretrained(tmp_path)
    ours = load_hf_bert(str(tmp_path))
    assert not ours.training
    ids, segments, mask = _hf_inputs(hf.config, seed=3)
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=segments, attention_mask=mask.long()).prediction_logits
        assert (ours(ids, segments, mask)[0] - want).abs().max() <= 1e-5


# --------------------------------------------------------------------------- the input and the stack
def test_input_is_layernorm_of_token_plus_segment_plus_position():
    model = Bert(SMALL).eval()
    ids, segments, _ = _inputs(SMALL, [7, 7], 7)
    x = (model.token_embedding.weight[ids] + model.segment_embedding.weight[segments]
         + model.position_embedding.weight[:7])
    want = F.layer_norm(x, (SMALL.d_model,), model.embedding_norm.weight, model.embedding_norm.bias,
                        SMALL.layer_norm_eps)
    assert torch.allclose(model.embed(ids, segments), want, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(model(ids, segments)[0], model(ids, torch.zeros_like(ids))[0]), \
            "segment ids must change the output"


def test_padding_does_not_change_real_positions():
    model = Bert(SMALL).eval()
    ids, segments, mask = _inputs(SMALL, [6, 4], 6)
    longer = torch.cat([ids, torch.randint(0, SMALL.vocab_size, (2, 5))], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], dim=1)
    longer_segments = torch.cat([segments, torch.ones(2, 5, dtype=torch.long)], dim=1)
    with torch.no_grad():
        hidden, pooled = model(ids, segments, mask)
        hidden2, pooled2 = model(longer, longer_segments, longer_mask)
    assert torch.allclose(hidden[mask], hidden2[:, :6][mask], atol=1e-5)
    assert torch.allclose(pooled, pooled2, atol=1e-5)
    # and padded keys really are ignored: garbage in padded positions changes nothing real
    garbage = ids.masked_fill(~mask, 7)
    with torch.no_grad():
        assert torch.allclose(model(garbage, segments, mask)[0][mask], hidden[mask], atol=1e-5)


def test_pooled_vector_reads_only_the_first_token():
    model = Bert(SMALL).eval()
    ids, segments, _ = _inputs(SMALL, [5], 5)
    with torch.no_grad():
        hidden, pooled = model(ids, segments)
    assert torch.allclose(pooled, torch.tanh(model.pooler(hidden[:, 0])))


def test_attention_weights_are_distributions_that_skip_padding():
    model = Bert(SMALL).eval()
    ids, segments, mask = _inputs(SMALL, [8, 3], 8)
    weights = model.attention_weights(ids, segments, mask)
    assert len(weights) == SMALL.num_layers and weights[0].shape == (2, SMALL.num_heads, 8, 8)
    for w in weights:
        assert torch.allclose(w.sum(-1), torch.ones(2, SMALL.num_heads, 8), atol=1e-5)
        assert (w[1, :, :, 3:] == 0).all()


def test_decoder_is_tied_to_the_embedding_through_moves_and_loads():
    model = BertForPreTraining(SMALL).double()
    assert model.mlm.decoder.weight is model.bert.token_embedding.weight
    copy = BertForPreTraining(SMALL)
    copy.load_state_dict(model.float().state_dict())
    assert torch.equal(copy.mlm.decoder.weight, model.bert.token_embedding.weight)
    assert copy.mlm.decoder.weight is copy.bert.token_embedding.weight
    ids, segments, _ = _inputs(SMALL, [5], 5)
    copy.mlm.dense.register_forward_hook(lambda m, i, o: o.detach())  # only the decoder path left
    copy(ids, segments)[0].sum().backward()
    grad = copy.bert.token_embedding.weight.grad
    assert grad is not None and (grad != 0).all(), "every vocabulary row gets a decoder gradient"


def test_forward_never_reads_the_device_back_to_the_host():
    with torch.device("meta"):  # a host read (.item(), a nonzero) fails on the meta device
        model = BertForPreTraining(SMALL)
    ids, segments, mask = (t.to("meta") for t in _inputs(SMALL, [5, 3], 5))
    mlm_logits, nsp_logits = model(ids, segments, mask)
    assert mlm_logits.shape == (2, 5, SMALL.vocab_size) and nsp_logits.shape == (2, 2)


def test_dropout_is_active_in_training_only():
    model = Bert(BertConfig(vocab_size=30, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                            max_positions=8, dropout=0.3))
    ids = torch.randint(0, 30, (2, 8))
    assert not torch.equal(model(ids)[0], model(ids)[0])
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids)[0], model(ids)[0])


# --------------------------------------------------------------------------- size
@pytest.mark.parametrize("config", [SMALL, BertConfig(vocab_size=11, max_positions=5, type_vocab_size=1,
                                                      d_model=6, num_layers=3, num_heads=2, d_ff=5)])
def test_parameter_formula_counts_the_real_model(config):
    assert bert_num_parameters(config) == sum(p.numel() for p in Bert(config).parameters())
    assert bert_num_parameters(config, pretraining_heads=True) == sum(
        p.numel() for p in BertForPreTraining(config).parameters())


def test_base_and_large_sizes_are_the_papers():
    with torch.device("meta"):  # count without allocating 1.3 GB
        base, large = Bert(BertConfig.base()), Bert(BertConfig.large())
    n_base, n_large = (sum(p.numel() for p in m.parameters()) for m in (base, large))
    assert n_base == bert_num_parameters(BertConfig.base())
    assert n_large == bert_num_parameters(BertConfig.large())
    assert abs(n_base / 110e6 - 1) < 0.01 and abs(n_large / 340e6 - 1) < 0.02  # "110M" / "340M"


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=10, num_heads=3), "not divisible"),
    (dict(dropout=1.0), "dropout"),
    (dict(num_layers=0), "num_layers"),
    (dict(vocab_size=2.5), "vocab_size"),
])
def test_config_rejects_bad_sizes(kwargs, message):
    args = dict(vocab_size=10, d_model=12, num_heads=3) | kwargs
    with pytest.raises(ValueError, match=message):
        BertConfig(**args)


def test_forward_rejects_bad_input_with_clear_errors():
    model = Bert(SMALL)
    ids, segments, mask = _inputs(SMALL, [4, 2], 4)
    with pytest.raises(ValueError, match="integer token ids"):
        model(ids.float())
    with pytest.raises(ValueError, match="integer token ids"):
        model(ids[0])
    with pytest.raises(ValueError, match="exceeds max_positions"):
        model(torch.zeros(1, SMALL.max_positions + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="segment_ids"):
        model(ids, segments[:, :3])
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seq\)"):
        model(ids, segments, mask[:, None, None, :])
    with pytest.raises(ValueError, match="must be bool"):
        model(ids, segments, mask.long())


# --------------------------------------------------------------------------- pretraining
def _topic_documents(vocab: int, n_special: int, count: int, length: int, topic_size: int,
                     seed: int) -> torch.Tensor:
    """``(count, length)`` token ids: each document draws uniformly from one "topic" of
    ``topic_size`` tokens. Token frequencies alone give ≈ log(vocab - n_special) nats per masked
    token; the context names the topic, which leaves log(topic_size)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.arange(n_special, vocab)[torch.randperm(vocab - n_special, generator=g)]
    topics = words[: len(words) // topic_size * topic_size].view(-1, topic_size)
    which = torch.randint(0, len(topics), (count,), generator=g)
    return topics[which[:, None], torch.randint(0, topic_size, (count, length), generator=g)]


def test_short_pretraining_run_beats_the_unigram_baseline():
    torch.manual_seed(0)
    vocab, cls_id, sep_id, mask_id, topic_size = 40, 1, 2, 3, 4
    body = _topic_documents(vocab, 4, 600, 22, topic_size, seed=0)
    rows = torch.cat([torch.full((600, 1), cls_id), body, torch.full((600, 1), sep_id)], dim=1)
    train_rows, valid_rows = rows[:500], rows[500:]
    special = (rows == cls_id) | (rows == sep_id)
    config = BertConfig(vocab_size=vocab, max_positions=24, d_model=32, num_layers=2, num_heads=2,
                        d_ff=64, dropout=0.0)
    model = BertForPreTraining(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    with one_cpu_thread("cpu"):  # ~2 s
        for _ in range(100):
            pick = torch.randint(0, 500, (32,), generator=g)
            inputs, labels = mask_tokens(train_rows[pick], special[pick], vocab, mask_id, generator=g)
            hidden, _ = model.bert(inputs)
            chosen = labels != IGNORE  # the decoder scores only the chosen positions
            loss = F.cross_entropy(model.mlm(hidden[chosen]), labels[chosen])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    _, labels = mask_tokens(valid_rows, special[500:], vocab, mask_id, p=0.3,
                            generator=torch.Generator().manual_seed(1))
    inputs = valid_rows.masked_fill(labels != IGNORE, mask_id)  # every answer hidden
    with torch.no_grad():
        logits = model(inputs)[0]
    valid_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE).item()
    baseline = unigram_cross_entropy(body[:500], labels[labels != IGNORE], vocab)
    assert abs(baseline - math.log(vocab - 4)) < 0.1
    # context beats frequencies clearly, and nothing beats knowing the topic (no answer leaks)
    assert math.log(topic_size) - 0.05 < valid_loss < baseline - 0.8, (valid_loss, baseline)
