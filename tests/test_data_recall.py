"""tfm_course.data.recall: the two-lookup associative-recall task of chapter 3."""

from __future__ import annotations

import pytest
import torch

from tfm_course.data.recall import IGNORE, RecallBatch, TwoLookupRecall


def test_shapes_vocab_and_layout():
    task = TwoLookupRecall(num_keys=10, num_values=5, num_records=6, num_queries=4)
    batch = task.sample(3, torch.Generator().manual_seed(0))
    assert isinstance(batch, RecallBatch)
    assert task.seq_len == 10 and task.vocab_size == 10 * 6
    for t in (batch.tokens, batch.prev_target, batch.recall_target, batch.source):
        assert t.shape == (3, 10) and t.dtype == torch.int64
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < task.vocab_size
    keys, values = task.decode(batch.tokens)
    assert (values[:, :6] < 5).all() and (values[:, 6:] == task.blank).all()   # records, then queries
    for row in keys[:, :6]:
        assert len(set(row.tolist())) == 6                                      # distinct record keys


def test_targets_are_the_two_lookups():
    task = TwoLookupRecall()
    batch = task.sample(8, torch.Generator().manual_seed(1))
    keys, values = task.decode(batch.tokens)
    r = task.num_records
    assert (batch.prev_target[:, 0] == IGNORE).all()
    assert torch.equal(batch.prev_target[:, 1:], keys[:, :-1])                  # key of token t - 1
    assert (batch.recall_target[:, :r] == IGNORE).all() and (batch.source[:, :r] == -1).all()
    src = batch.source[:, r:]
    assert ((src >= 0) & (src < r)).all()
    assert torch.equal(keys.gather(1, src), keys[:, r:])                        # the record has my key
    assert torch.equal(values.gather(1, src), batch.recall_target[:, r:])       # and holds the answer


def test_encode_decode_label_roundtrip():
    task = TwoLookupRecall(num_keys=4, num_values=3, num_records=2)
    k, v = torch.tensor([0, 3, 2]), torch.tensor([1, 3, 0])
    kk, vv = task.decode(task.encode(k, v))
    assert torch.equal(kk, k) and torch.equal(vv, v)
    assert task.label(int(task.encode(torch.tensor(2), torch.tensor(1)))) == "k2=v1"
    assert task.label(int(task.encode(torch.tensor(3), torch.tensor(task.blank)))) == "k3=?"


def test_sampling_is_reproducible_and_moves_to_device():
    task = TwoLookupRecall()
    a = task.sample(4, torch.Generator().manual_seed(7))
    b = task.sample(4, torch.Generator().manual_seed(7), device="cpu")
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.recall_target, b.recall_target)
    assert b.to("cpu").tokens.device.type == "cpu"


def test_bad_sizes():
    with pytest.raises(ValueError, match="num_records"):
        TwoLookupRecall(num_keys=4, num_records=5)
    with pytest.raises(ValueError, match="num_queries"):
        TwoLookupRecall(num_queries=0)


# --------------------------------------------------------------------------- multi-query recall
from tfm_course.data.recall import FILLER, multi_query_recall  # noqa: E402


@pytest.mark.parametrize("vocab, length, pairs", [(256, 64, 4), (64, 128, 8), (40, 48, 16), (8, 9, 3)])
def test_mqar_layout_and_labels(vocab, length, pairs):
    inputs, labels = multi_query_recall(50, vocab, length, pairs, torch.Generator().manual_seed(0))
    assert inputs.shape == labels.shape == (50, length)
    assert inputs.dtype == labels.dtype == torch.int64
    context = 2 * pairs
    keys, values = inputs[:, 0:context:2], inputs[:, 1:context:2]
    assert ((keys >= 1) & (keys < vocab // 2)).all()                      # keys: lower half, not 0
    assert ((values >= vocab // 2) & (values < vocab)).all()              # values: upper half
    assert (labels[:, :context] == IGNORE).all()                          # no answer inside the context
    for row in range(50):
        k, v = keys[row].tolist(), values[row].tolist()
        assert len(set(k)) == pairs and len(set(v)) == pairs              # distinct keys and values
        value_of = dict(zip(k, v))
        rest, answers = inputs[row, context:], labels[row, context:]
        asked = rest != FILLER
        assert sorted(rest[asked].tolist()) == sorted(k)                  # every key asked exactly once
        assert torch.equal(asked, answers != IGNORE)                      # labels only where a key is asked
        assert [value_of[q] for q in rest[asked].tolist()] == answers[asked].tolist()


def test_mqar_queries_move_around_and_keys_vary():
    inputs, _ = multi_query_recall(400, 256, 64, 4, torch.Generator().manual_seed(1))
    asked_at = (inputs[:, 8:] != FILLER).float().mean(0)
    assert (asked_at > 0).all()                                           # every query slot gets used
    assert len(set(inputs[:, 0].tolist())) > 60                           # first key spans the key half


def test_mqar_is_deterministic_and_moves_to_device():
    a = multi_query_recall(8, 64, 32, 4, torch.Generator().manual_seed(3))
    b = multi_query_recall(8, 64, 32, 4, torch.Generator().manual_seed(3), device="cpu")
    c = multi_query_recall(8, 64, 32, 4, torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    meta = multi_query_recall(2, 64, 32, 4, device="meta")
    assert meta[0].device.type == "meta" and meta[1].device.type == "meta"


def test_mqar_bad_sizes():
    with pytest.raises(ValueError, match="need vocab_size >= 10"):
        multi_query_recall(4, 8, 64, 4)                                   # only 3 keys in [1, 4)
    with pytest.raises(ValueError, match="at least 12; got 11"):
        multi_query_recall(4, 256, 11, 4)
    with pytest.raises(ValueError, match="n_pairs"):
        multi_query_recall(4, 256, 64, 0)
    with pytest.raises(ValueError, match="n_examples"):
        multi_query_recall(0, 256, 64, 4)
