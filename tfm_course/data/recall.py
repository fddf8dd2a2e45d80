"""Two-lookup associative recall: a synthetic task that needs two *different* attention lookups.

A sequence holds ``num_records`` records followed by ``num_queries`` queries. Each token carries
two fields, a key and a value, packed into one token id::

    records:  k3=v5  k0=v2  k7=v1  ...      (distinct keys, random values)
    queries:  k7=?   k3=?   ...            (keys drawn from the records, value blank)

At every query position the model must answer two questions at once:

* **previous token**: the key of the token just before it (a lookup by *position*: t - 1);
* **recall**: the value stored with the same key in the records (a lookup by *content*).

One softmax is one weighted average, so a single attention head has to split its weight between
the two places; several heads can each take one. Chapter 3 trains a tiny model on it and looks at
what each head attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

IGNORE = -100  # target value that ``F.cross_entropy`` skips


@dataclass
class RecallBatch:
    """One batch of the task; every tensor is ``(batch, seq)``.

    ``tokens``: token ids. ``prev_target``: key of the token at t - 1 (IGNORE at t = 0).
    ``recall_target``: value of the matching record at query positions (IGNORE elsewhere).
    ``source``: position of the matching record at query positions (-1 elsewhere).
    """

    tokens: Tensor
    prev_target: Tensor
    recall_target: Tensor
    source: Tensor

    def to(self, device: torch.device | str) -> "RecallBatch":
        return RecallBatch(*(t.to(device) for t in (self.tokens, self.prev_target,
                                                    self.recall_target, self.source)))


class TwoLookupRecall:
    """Generator of the task. Token id = ``key * (num_values + 1) + value``; value ``num_values`` is blank."""

    def __init__(self, num_keys: int = 16, num_values: int = 16, num_records: int = 8,
                 num_queries: int = 8) -> None:
        if not 1 <= num_records <= num_keys:
            raise ValueError(f"num_records must be in [1, num_keys={num_keys}], got {num_records}")
        if num_queries < 1 or num_values < 1:
            raise ValueError(f"need num_queries >= 1 and num_values >= 1, got {num_queries}, {num_values}")
        self.num_keys, self.num_values = num_keys, num_values
        self.num_records, self.num_queries = num_records, num_queries
        self.blank = num_values

    @property
    def vocab_size(self) -> int:
        return self.num_keys * (self.num_values + 1)

    @property
    def seq_len(self) -> int:
        return self.num_records + self.num_queries

    def encode(self, key: Tensor, value: Tensor) -> Tensor:
        """Token ids from key and value fields (same shape)."""
        return key * (self.num_values + 1) + value

    def decode(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``(keys, values)`` of token ids; a value equal to ``blank`` marks a query."""
        return tokens // (self.num_values + 1), tokens % (self.num_values + 1)

    def label(self, token: int) -> str:
        """Human-readable token, e.g. ``'k3=v5'`` or ``'k3=?'``."""
        key, value = divmod(int(token), self.num_values + 1)
        return f"k{key}=" + ("?" if value == self.blank else f"v{value}")

    def sample(self, batch: int, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> RecallBatch:
        """A fresh random batch (drawn on the CPU with ``generator``, then moved to ``device``)."""
        r, q = self.num_records, self.num_queries
        record_keys = torch.rand(batch, self.num_keys, generator=generator).argsort(dim=-1)[:, :r]
        record_values = torch.randint(self.num_values, (batch, r), generator=generator)
        source = torch.randint(r, (batch, q), generator=generator)  # which record each query asks
        query_keys = record_keys.gather(1, source)
        keys = torch.cat([record_keys, query_keys], dim=1)  # (batch, seq)
        values = torch.cat([record_values, torch.full((batch, q), self.blank)], dim=1)
        prev = torch.full_like(keys, IGNORE)
        prev[:, 1:] = keys[:, :-1]
        recall = torch.full_like(keys, IGNORE)
        recall[:, r:] = record_values.gather(1, source)
        where = torch.full_like(keys, -1)
        where[:, r:] = source
        return RecallBatch(self.encode(keys, values), prev, recall, where).to(device or "cpu")
