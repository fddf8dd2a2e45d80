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
