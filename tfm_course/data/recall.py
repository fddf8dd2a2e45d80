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

:func:`multi_query_recall` is the multi-query associative recall (MQAR) of the Zoology work
(Arora et al., 2023): key-value pairs first, then the keys again, each asking for its value. It
measures how much a model can *remember*: attention keeps every pair, a recurrent model only what
fits in its fixed-size state. Chapter 11 uses it to compare the two.
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


# --------------------------------------------------------------------------- MQAR (chapter 11)
FILLER = 0  # token id of the positions between queries; never a key nor a value


def _draw_without_replacement(rows: int, population: int, k: int,
                              generator: torch.Generator | None) -> Tensor:
    """``(rows, k)`` distinct integers in ``[0, population)`` per row, uniformly (argsort of noise)."""
    device = generator.device if generator is not None else torch.device("cpu")
    noise = torch.rand(rows, population, generator=generator, device=device)
    return noise.argsort(dim=-1)[:, :k]


def multi_query_recall(n_examples: int, vocab_size: int, seq_len: int, n_pairs: int,
                       generator: torch.Generator | None = None,
                       device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Multi-query associative recall: ``(inputs, labels)``, both ``(n_examples, seq_len)`` int64.

    Each row starts with ``n_pairs`` key-value pairs ``k₁ v₁ k₂ v₂ …`` and then asks for every
    key once, at random positions of the rest of the row (the positions between queries hold
    :data:`FILLER`)::

        inputs:  k₁  v₁  k₂  v₂  0   k₂  0   0   k₁  0
        labels:  −   −   −   −   −   v₂  −   −   v₁  −        (− is IGNORE = −100)

    Labels are next-token style: at the position of a queried key the label is that key's value
    (the token the model should emit next), everywhere else ``IGNORE``. Keys are drawn from
    ``[1, vocab_size // 2)`` and values from ``[vocab_size // 2, vocab_size)``; keys are distinct
    within a row, and so are values. Token 0 is the filler. Unlike the Zoology code, queries are
    spread uniformly (not by a power law) and fillers are not replaced by random tokens.

    Drawn with ``generator`` (on its device, the CPU by default), then moved to ``device``.
    """
    for name, value in (("n_examples", n_examples), ("n_pairs", n_pairs)):
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    n_keys, n_values = vocab_size // 2 - 1, vocab_size - vocab_size // 2
    if n_pairs > min(n_keys, n_values):
        raise ValueError(f"vocab_size {vocab_size} has {n_keys} keys and {n_values} values, too few "
                         f"for n_pairs = {n_pairs} distinct pairs; need vocab_size >= "
                         f"{2 * n_pairs + 2}")
    if seq_len < 3 * n_pairs:
        raise ValueError(f"seq_len must hold {n_pairs} pairs and {n_pairs} queries, i.e. be at least "
                         f"{3 * n_pairs}; got {seq_len}")
    context = 2 * n_pairs
    keys = 1 + _draw_without_replacement(n_examples, n_keys, n_pairs, generator)  # (n, pairs)
    values = vocab_size // 2 + _draw_without_replacement(n_examples, n_values, n_pairs, generator)
    # which query slot (after the context) asks for which pair
    slots = context + _draw_without_replacement(n_examples, seq_len - context, n_pairs, generator)
    inputs = torch.full((n_examples, seq_len), FILLER, dtype=torch.int64, device=keys.device)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    inputs.scatter_(1, slots, keys)
    labels = torch.full_like(inputs, IGNORE).scatter_(1, slots, values)
    return inputs.to(device), labels.to(device)
