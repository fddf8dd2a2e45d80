"""Synthetic translation tasks for encoder-decoder models, generated on the fly (nothing downloaded).

* :func:`numbers_task` — digits to English words: ``"4021" -> "four thousand twenty one"``.
  Characters in, words out (a word-level target is short, which makes the task quick to learn).
* :func:`dates_task` — date normalisation: ``"7 march 2024"``, ``"march 7, 2024"``,
  ``"07/03/2024"`` … ``-> "2024-03-07"``, characters in and out.

Splits are deterministic and **disjoint by construction**: the set of inputs (numbers, dates) is
shuffled once with a seeded generator and cut into test / valid / train, so no held-out item can
appear in training. :meth:`TranslationTask.batch` turns pairs into tensors for teacher forcing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from .vocab import Vocab

Pair = tuple[str, str]

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = ((10**6, "million"), (1000, "thousand"), (100, "hundred"))
NUMBER_WORDS = tuple(ONES) + tuple(TENS[2:]) + ("hundred", "thousand", "million")


def number_to_words(n: int) -> str:
    """English words for ``0 <= n < 10**9`` without "and" or hyphens: 4021 -> 'four thousand twenty one'."""
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 10**9:
        raise ValueError(f"n must be an int in [0, 10**9), got {n!r}")
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    for size, name in SCALES:
        if n >= size:
            head, rest = divmod(n, size)
            return f"{number_to_words(head)} {name}" + ("" if rest == 0 else " " + number_to_words(rest))
    raise AssertionError("unreachable")


def shift_targets(target: Tensor) -> tuple[Tensor, Tensor]:
    """Teacher forcing: ``<bos> y1 … yn <eos>`` (batch, T+1) -> decoder input and labels (batch, T).

    The decoder reads ``<bos> y1 … yn`` and must predict ``y1 … yn <eos>``: position t's label is
    the input at position t + 1.
    """
    if target.dim() != 2 or target.shape[1] < 2:
        raise ValueError(f"target must be (batch, T+1) with T+1 >= 2, got {tuple(target.shape)}")
    return target[:, :-1], target[:, 1:]


@dataclass
class Batch:
    """One batch for teacher forcing. ``src`` (B, S), ``tgt_in`` (B, T), ``tgt_out`` (B, T)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device))


@dataclass
class TranslationTask:
    """A source→target task with its vocabularies, tokenisers and train / valid / test splits."""

    name: str
    src_vocab: Vocab
    tgt_vocab: Vocab
    src_tokenize: Callable[[str], list[str]]
    tgt_tokenize: Callable[[str], list[str]]
    tgt_join: str
    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]

    def encode_sources(self, sources: Sequence[str]) -> Tensor:
        """``(batch, S)`` ids: each source's tokens and ``<eos>``, right-padded with ``<pad>``."""
        return self.src_vocab.pad([self.src_vocab.encode(self.src_tokenize(s), eos=True)
                                   for s in sources])

    def encode_targets(self, targets: Sequence[str]) -> Tensor:
        """``(batch, T+1)`` ids: ``<bos>`` tokens ``<eos>``, right-padded with ``<pad>``."""
        return self.tgt_vocab.pad([self.tgt_vocab.encode(self.tgt_tokenize(t), bos=True, eos=True)
                                   for t in targets])

    def decode_targets(self, ids: Tensor) -> list[str]:
        """Target strings from generated ids ``(batch, L)`` (read up to the first ``<eos>``)."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, L), got {tuple(ids.shape)}")
        return [self.tgt_join.join(self.tgt_vocab.decode(row)) for row in ids.cpu()]

    def batch(self, pairs: Sequence[Pair], device: torch.device | str = "cpu") -> Batch:
        """Tensors for teacher forcing from (source, target) pairs."""
        if not pairs:
            raise ValueError("pairs is empty")
        src = self.encode_sources([s for s, _ in pairs])
        tgt_in, tgt_out = shift_targets(self.encode_targets([t for _, t in pairs]))
        return Batch(src, tgt_in, tgt_out).to(device)

    def sampler(self, batch_size: int, device: torch.device | str = "cpu", seed: int = 0,
                split: str = "train") -> Callable[[int], Batch]:
        """``make_batch(step)`` for :func:`tfm_course.train.train`: random pairs of a split.

        The whole split is encoded once and moved to ``device``; each call draws ``batch_size``
        rows (with replacement) with a generator on that device, so a GPU gets its batches without
        a host-to-device copy per step. The draws are reproducible per device type (a CUDA
        generator gives other rows than the CPU one for the same seed).
        """
        whole = self.batch(getattr(self, split), device)
        device = whole.src.device
        generator = torch.Generator(device=device).manual_seed(seed)
        n = whole.src.shape[0]

        def make_batch(step: int) -> Batch:
            rows = torch.randint(n, (batch_size,), generator=generator, device=device)
            return Batch(whole.src[rows], whole.tgt_in[rows], whole.tgt_out[rows])

        return make_batch


def _split(items: list, n_valid: int, n_test: int, seed: int) -> tuple[list, list, list]:
    if n_valid < 0 or n_test < 0 or n_valid + n_test >= len(items):
        raise ValueError(f"n_valid={n_valid} + n_test={n_test} must leave training items "
                         f"out of {len(items)}")
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [items[i] for i in order]
    return shuffled[n_test + n_valid:], shuffled[n_test:n_test + n_valid], shuffled[:n_test]


def numbers_task(max_value: int = 10_000, n_valid: int = 500, n_test: int = 1000,
                 seed: int = 0) -> TranslationTask:
    """Digits → words for every integer in ``[0, max_value)``, split disjointly by number."""
    if not 10 <= max_value <= 10**9:
        raise ValueError(f"max_value must be in [10, 10**9], got {max_value}")
    pairs = [(str(n), number_to_words(n)) for n in range(max_value)]
    train, valid, test = _split(pairs, n_valid, n_test, seed)
    return TranslationTask("numbers", Vocab(list("0123456789")), Vocab(NUMBER_WORDS),
                           list, str.split, " ", train, valid, test)


def number_pairs(low: int, high: int, count: int, seed: int = 0) -> list[Pair]:
    """``count`` distinct (digits, words) pairs with ``low <= n < high`` — e.g. longer test inputs."""
    if not 0 <= low < high <= 10**9 or count > high - low:
        raise ValueError(f"need 0 <= low < high <= 10**9 and count <= high - low, got "
                         f"low={low}, high={high}, count={count}")
    generator = torch.Generator().manual_seed(seed)
    if high - low <= 10**7:
        numbers = (low + torch.randperm(high - low, generator=generator)[:count]).tolist()
    else:  # too many to permute: draw and deduplicate
        numbers, seen = [], set()
        while len(numbers) < count:
            n = int(torch.randint(low, high, (1,), generator=generator))
            if n not in seen:
                seen.add(n)
                numbers.append(n)
    return [(str(n), number_to_words(n)) for n in numbers]


MONTHS = ("january february march april may june july august september october november "
          "december").split()
DATE_FORMATS: tuple[Callable[[dt.date], str], ...] = (
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day} {d.year % 100:02d}",
)


def dates_task(first_year: int = 1950, last_year: int = 2049, n_valid: int = 500,
               n_test: int = 1000, seed: int = 0) -> TranslationTask:
    """Date normalisation, characters in and out: many spellings -> ISO ``YYYY-MM-DD``.

    Every date in ``[first_year, last_year]`` appears once, in a format chosen at random; the
    split is by date, so no held-out date is ever seen in training, in any format. Two-digit
    years are only unambiguous inside a 100-year range, hence the default years.
    """
    if not 1 <= first_year <= last_year <= 9999 or last_year - first_year >= 100:
        raise ValueError(f"need 1 <= first_year <= last_year <= 9999 within 100 years, got "
                         f"{first_year}..{last_year}")
    start, end = dt.date(first_year, 1, 1), dt.date(last_year, 12, 31)
    days = [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]
    generator = torch.Generator().manual_seed(seed + 1)
    formats = torch.randint(len(DATE_FORMATS), (len(days),), generator=generator).tolist()
    pairs = [(DATE_FORMATS[f](d), d.isoformat()) for d, f in zip(days, formats)]
    train, valid, test = _split(pairs, n_valid, n_test, seed)
    src_chars = sorted(set("".join(s for s, _ in pairs)))
    return TranslationTask("dates", Vocab(src_chars), Vocab(list("0123456789-")),
                           list, list, "", train, valid, test)
