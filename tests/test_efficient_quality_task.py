"""The quality-at-equal-time pieces: the scattered-recall task, the attention layers, the classifier."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.data.scattered_recall import IGNORE, scattered_recall
from tfm_course.device import one_cpu_thread
from tfm_course.efficient.attention_layers import (ATTENTION_KINDS, MaskedSelfAttention,
                                                   SlidingWindowSelfAttention, make_attention)
from tfm_course.efficient.sparse import sliding_window_mask
from tfm_course.models.recall_classifier import RecallClassifier
from tfm_course.train import train


# --------------------------------------------------------------------------- the task
def test_every_query_has_exactly_one_matching_record_and_its_value_as_target():
    K, V = 12, 5
    b = scattered_recall(6, length=40, num_records=7, num_queries=9, num_keys=K, num_values=V,
                         generator=torch.Generator().manual_seed(0))
    assert b.keys.shape == b.values.shape == b.targets.shape == (6, 40)
    for keys, values, targets in zip(b.keys, b.values, b.targets):
        records = values < V
        queries = values == V
        assert int(records.sum()) == 7 and int(queries.sum()) == 9
        assert bool((keys[~records & ~queries] == K).all())  # filler key
        assert bool((values[~records & ~queries] == V + 1).all())  # filler value
        assert len(set(keys[records].tolist())) == 7  # record keys are distinct
        assert bool((targets[~queries] == IGNORE).all())
        for position in queries.nonzero().flatten().tolist():
            match = (keys == keys[position]) & records
            assert int(match.sum()) == 1
            assert int(targets[position]) == int(values[match][0])


def test_positions_are_scattered_and_the_generator_reproduces_a_batch():
    make = lambda: scattered_recall(64, length=128, generator=torch.Generator().manual_seed(5))  # noqa: E731
    a, b = make(), make()
    assert torch.equal(a.keys, b.keys) and torch.equal(a.targets, b.targets)
    query_positions = (a.targets != IGNORE).nonzero()[:, 1].float()
    assert 50 < float(query_positions.mean()) < 78  # uniform over 0..127, not bunched at one end


@pytest.mark.parametrize("kwargs, match", [
    ({"num_records": 9, "num_keys": 8}, "cannot exceed num_keys"),
    ({"length": 10, "num_records": 6, "num_queries": 6}, "do not fit"),
    ({"num_queries": 0}, "num_queries must be a positive"),
])
def test_task_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scattered_recall(2, **kwargs)


# --------------------------------------------------------------------------- the attention layers
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_every_attention_maps_batch_n_d_to_the_same_shape_up_to_seq_len(kind):
    torch.manual_seed(0)
    layer = make_attention(kind, 16, 2, seq_len=24, window=3, k=8, num_features=8)
    for n in (24, 17):
        assert layer(torch.randn(3, n, 16)).shape == (3, n, 16)


def test_naive_and_fused_softmax_are_the_same_function():
    torch.manual_seed(0)
    fused, naive = make_attention("softmax", 16, 2, 20), make_attention("softmax-naive", 16, 2, 20)
    naive.load_state_dict(fused.state_dict())
    x = torch.randn(2, 20, 16)
    torch.testing.assert_close(naive(x), fused(x), atol=1e-5, rtol=1e-5)


def test_a_window_wider_than_the_input_is_softmax_and_a_narrow_one_is_local():
    torch.manual_seed(0)
    full, wide = make_attention("softmax", 16, 2, 20), make_attention("window", 16, 2, 20, window=25)
    assert isinstance(wide, SlidingWindowSelfAttention)
    wide.load_state_dict(full.state_dict())  # the same projection names as MultiHeadAttention
    x = torch.randn(2, 20, 16)
    torch.testing.assert_close(wide(x), full(x), atol=1e-5, rtol=1e-5)
    narrow = make_attention("window", 16, 2, 20, window=2)
    y = x.clone()
    y[:, 15:] = torch.randn(2, 5, 16)  # change positions 15..19
    torch.testing.assert_close(narrow(y)[:, :13], narrow(x)[:, :13])  # 12 + 2 < 15: unaffected
    assert not torch.allclose(narrow(y)[:, 13], narrow(x)[:, 13])


def test_blocked_window_layer_equals_a_dense_window_mask_and_takes_any_length():
    torch.manual_seed(0)
    blocked = make_attention("window", 16, 4, seq_len=30, window=3)
    dense = MaskedSelfAttention(16, 4, sliding_window_mask(40, 3))
    dense.attn.load_state_dict(blocked.state_dict())
    x = torch.randn(2, 40, 16)  # longer than seq_len: a window is not tied to a length
    torch.testing.assert_close(blocked(x), dense(x), atol=1e-5, rtol=1e-5)


def test_attention_layers_share_the_projections_so_only_the_mixing_differs():
    counts = {kind: sum(p.numel() for p in make_attention(kind, 32, 4, 64, k=8).parameters())
              for kind in ATTENTION_KINDS}
    assert len({counts[k] for k in ("softmax", "softmax-naive", "window", "performer")}) == 1
    assert counts["linformer"] == counts["softmax"] + 2 * 8 * 64  # E and F


def test_attention_layer_bad_inputs_raise():
    with pytest.raises(ValueError, match="kind must be one of"):
        make_attention("reformer", 16, 2, 20)
    with pytest.raises(ValueError, match="exceeds the mask's 20"):
        MaskedSelfAttention(16, 2, sliding_window_mask(20, 2))(torch.randn(1, 21, 16))
    with pytest.raises(ValueError, match="d_model=16"):
        make_attention("window", 16, 2, 20)(torch.randn(1, 21, 8))
    with pytest.raises(ValueError, match="seq_len, seq_len"):
        MaskedSelfAttention(16, 2, torch.ones(3, 4, dtype=torch.bool))


# --------------------------------------------------------------------------- the model
def test_classifier_gives_one_distribution_per_position_and_rejects_bad_inputs():
    model = RecallClassifier(num_keys=12, num_values=5, seq_len=30, attention="performer", d_model=16,
                             num_heads=2, num_layers=2, num_features=8)
    b = scattered_recall(3, length=30, num_records=4, num_queries=4, num_keys=12, num_values=5)
    assert model(b.keys, b.values).shape == (3, 30, 5)
    with pytest.raises(ValueError, match="both be"):
        model(b.keys, b.values[:, :-1])
    with pytest.raises(ValueError, match="exceeds seq_len"):
        model(torch.zeros(1, 31, dtype=torch.long), torch.zeros(1, 31, dtype=torch.long))


def test_attention_weights_are_the_softmax_rows_the_forward_pass_uses():
    torch.manual_seed(0)
    model = RecallClassifier(12, 5, 30, "softmax", d_model=16, num_heads=2, num_layers=2).train()
    b = scattered_recall(3, length=30, num_records=4, num_queries=4, num_keys=12, num_values=5)
    w = model.attention_weights(b.keys, b.values)
    assert w.shape == (3, 2, 2, 30, 30) and model.training  # the training flag comes back
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 2, 30))
    # the first layer's weights, recomputed from its projections
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.key_embedding(b.keys) + model.value_embedding(b.values))
    q = attn.q_proj(x).view(3, 30, 2, 8).transpose(1, 2)
    k = attn.k_proj(x).view(3, 30, 2, 8).transpose(1, 2)
    torch.testing.assert_close(w[:, 0], torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, -1),
                               atol=1e-6, rtol=1e-5)
    # the second layer's input is the first block's output
    with torch.no_grad():
        x1 = model.blocks[0](model.key_embedding(b.keys) + model.value_embedding(b.values))
        x1 = model.blocks[1].norm1(x1)
        _, w1 = model.blocks[1].attn(x1, need_weights=True)
    torch.testing.assert_close(w[:, 1], w1)
    with pytest.raises(ValueError, match="never form the n × n weights"):
        RecallClassifier(12, 5, 30, "performer", d_model=16, num_heads=2).attention_weights(
            b.keys, b.values)
    # the inputs of each layer's attention give back its weights, and its output before out_proj
    for layer in (0, 1):
        q, k, v = model.attention_inputs(b.keys, b.values, layer)
        assert q.shape == k.shape == v.shape == (3, 2, 30, 8) and model.training
        torch.testing.assert_close(torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, -1), w[:, layer],
                                   atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 2\)"):
        model.attention_inputs(b.keys, b.values, 2)
    with pytest.raises(ValueError, match="needs softmax attention"):
        RecallClassifier(12, 5, 30, "performer", d_model=16, num_heads=2).attention_inputs(b.keys, b.values)


def _train_and_score(attention: str, steps: int, **options) -> float:
    torch.manual_seed(0)
    task = dict(length=48, num_records=4, num_queries=16, num_keys=16, num_values=8)
    model = RecallClassifier(16, 8, 48, attention, d_model=32, num_heads=2, **options)
    g = torch.Generator().manual_seed(0)

    def loss(m, b):
        return F.cross_entropy(m(b.keys, b.values).flatten(0, 1), b.targets.flatten(),
                               ignore_index=IGNORE)

    train(model, lambda step: scattered_recall(16, **task, generator=g), loss, steps=steps,
          lr=3e-3, progress=False)
    test = scattered_recall(64, **task, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        pred = model(test.keys, test.values).argmax(-1)
    asked = test.targets != IGNORE
    return float((pred[asked] == test.targets[asked]).float().mean())


def test_softmax_learns_the_task_and_a_narrow_window_cannot():
    with one_cpu_thread():  # small steps: two threads on a busy machine run up to 50x slower
        assert _train_and_score("softmax", 150) > 0.9
        assert _train_and_score("window", 150, window=2) < 0.4  # chance 1/8, plus nearby records
