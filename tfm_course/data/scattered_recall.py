"""Scattered recall: a long-input task that needs lookups across the whole sequence.

Every position carries two fields, a key and a value. A few positions, scattered at random over a
long sequence, are *records* (a key with its value); a few others are *queries* (a key whose value
is blank); all the rest is filler::

    position:  0    1    2     ...   97    ...   180   ...   255
    key:       ·    ·    k7    ...   ·     ...   k7    ...   ·
    value:     ·    ·    v3    ...   ·     ...   ?     ...   ·       → at 180 the answer is v3

The model must answer each query with the value of the record that has the same key. The record
can be anywhere — on average a third of the sequence away — so a model that only sees a local
window (sliding-window attention) is left guessing, and a model that mixes positions before it
looks (Linformer's projection, Performer's kernel estimate) has to find one sharp match among
n positions. Every query is a supervised target, so an example teaches ``num_queries`` lookups and
softmax attention learns the task in a few hundred steps. Chapter 10 uses it for its
quality-at-equal-training-time comparison; :class:`tfm_course.models.recall_classifier.RecallClassifier`
is the matching model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

IGNORE = -100  # target at non-query positions; ``F.cross_entropy(ignore_index=IGNORE)`` skips it


@dataclass
class ScatteredRecallBatch:
    """``keys``, ``values``, ``targets``: each ``(batch, length)``, int64.

    keys: record / query keys in ``[0, num_keys)``, ``num_keys`` at filler positions.
    values: record values in ``[0, num_values)``, ``num_values`` (blank) at queries,
    ``num_values + 1`` at filler. targets: the answer at query positions, :data:`IGNORE` elsewhere.
    """

    keys: Tensor
    values: Tensor
    targets: Tensor

    def to(self, device: torch.device | str) -> "ScatteredRecallBatch":
        return ScatteredRecallBatch(self.keys.to(device), self.values.to(device),
                                    self.targets.to(device))


def scattered_recall(batch: int, length: int = 256, num_records: int = 16, num_queries: int = 64,
                     num_keys: int = 64, num_values: int = 16,
                     generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> ScatteredRecallBatch:
    """A batch of the task, drawn on the CPU with ``generator`` and moved to ``device``.

    Each example has ``num_records`` records with *distinct* keys (random values) and
    ``num_queries`` queries, each asking for the key of one of the records (drawn with
    replacement), at distinct random positions. Chance accuracy is ``1 / num_values``.
    """
    for name, value in (("batch", batch), ("num_records", num_records),
                        ("num_queries", num_queries), ("num_values", num_values)):
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if num_records > num_keys:
        raise ValueError(f"num_records ({num_records}) cannot exceed num_keys ({num_keys}): "
                         "record keys are distinct")
    if num_records + num_queries > length:
        raise ValueError(f"num_records + num_queries = {num_records + num_queries} positions do "
                         f"not fit in length {length}")
    order = torch.rand(batch, length, generator=generator).argsort(dim=-1)  # random positions
    record_pos, query_pos = order[:, :num_records], order[:, num_records:num_records + num_queries]
    record_keys = torch.rand(batch, num_keys, generator=generator).argsort(dim=-1)[:, :num_records]
    record_values = torch.randint(num_values, (batch, num_records), generator=generator)
    asked = torch.randint(num_records, (batch, num_queries), generator=generator)  # which record

    keys = torch.full((batch, length), num_keys, dtype=torch.int64)
    values = torch.full((batch, length), num_values + 1, dtype=torch.int64)
    targets = torch.full((batch, length), IGNORE, dtype=torch.int64)
    keys.scatter_(1, record_pos, record_keys)
    values.scatter_(1, record_pos, record_values)
    keys.scatter_(1, query_pos, record_keys.gather(1, asked))
    values.scatter_(1, query_pos, torch.full_like(query_pos, num_values))
    targets.scatter_(1, query_pos, record_values.gather(1, asked))
    return ScatteredRecallBatch(keys, values, targets).to(device or "cpu")
