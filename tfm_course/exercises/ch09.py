"""Checkers for chapter 9, "T5: span corruption, relative position bias, text-to-text".

>>> from tfm_course.exercises import ch09
>>> ch09.check_noise_mask(my_mask)           # fn(length, density, mean_span, generator) -> bool (length,)
>>> ch09.check_span_corrupt(my_corrupt)      # fn(ids, noise_mask, sentinel_ids, eos_id) -> (inputs, targets)
>>> ch09.check_fill_spans(my_fill)           # fn(inputs, targets, sentinel_ids, eos_id) -> list of ids
>>> ch09.check_position_buckets(my_buckets)  # fn(n_q, n_k, bidirectional) -> long (n_q, n_k)
>>> ch09.check_prefix_lm_mask(my_mask)       # fn(seq_len, prefix_len) -> bool (seq_len, seq_len)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend (or, for a noise mask, True = dropped).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from ..data.span_corruption import fill_spans, noise_counts, span_corrupt, t5_sentinel_ids
from ..models.t5 import prefix_lm_mask
from ..positional import relative_position_bucket
from ._checking import Failed, attempt, expect_tensor, run_checks

__all__ = ["check_noise_mask", "check_span_corrupt", "check_fill_spans", "check_position_buckets",
           "check_prefix_lm_mask"]


def _runs(mask: Tensor) -> list[tuple[bool, int]]:
    """[(value, run length), ...] of a 1-D bool tensor."""
    out: list[tuple[bool, int]] = []
    for value in mask.tolist():
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


def _as_ids(x: object, what: str) -> list[int]:
    if isinstance(x, Tensor):
        if x.dim() != 1 or x.is_floating_point():
            raise Failed(f"{what} should be a 1-D tensor (or list) of integer ids, got "
                         f"{tuple(x.shape)} {x.dtype}")
        return [int(t) for t in x.tolist()]
    if isinstance(x, (list, tuple)) and all(isinstance(t, int) for t in x):
        return list(x)
    raise Failed(f"{what} should be a 1-D tensor or a list of integer ids, got {type(x).__name__}")


# --------------------------------------------------------------------------- noise mask
def check_noise_mask(fn: Callable[[int, float, float, torch.Generator], Tensor]) -> bool:
    """``fn(length, noise_density, mean_span_length, generator)``: T5's random-spans noise mask."""

    def masks(length: int, density: float, span: float, seeds: range) -> list[Tensor]:
        out = []
        for seed in seeds:
            got = attempt(fn, length, density, span, torch.Generator().manual_seed(seed))
            if not isinstance(got, Tensor):
                raise Failed(f"the mask should be a torch.Tensor, got {type(got).__name__}")
            if got.shape != (length,):
                raise Failed(f"the mask for length {length} has shape {tuple(got.shape)}, "
                             f"expected ({length},)")
            if got.dtype != torch.bool:
                raise Failed(f"the mask should be a bool tensor (True = noise), got {got.dtype}: use .bool()")
            out.append(got.cpu())
        return out

    def case(length: int, density: float, span: float) -> Callable[[], None]:
        def check() -> None:
            n_noise, n_spans = noise_counts(length, density, span)
            found = masks(length, density, span, range(12))
            counts = {int(m.sum()) for m in found}
            if len(counts) > 1:
                raise Failed(f"the number of noise tokens changes from mask to mask ({sorted(counts)}): "
                             "T5 does not flip each token independently — it takes exactly "
                             f"round(noise_density · length) = {n_noise} noise tokens")
            (count,) = counts
            if count != n_noise:
                if count == 0:
                    raise Failed(f"no noise at all for length {length}: clamp the number of noise "
                                 "tokens to at least 1 (and at most length − 1)")
                if count == int(length * density):
                    raise Failed(f"{count} noise tokens for length {length}: you truncated "
                                 f"noise_density · length = {length * density:g}; round it ({n_noise})")
                raise Failed(f"{count} noise tokens for length {length}, expected round(noise_density "
                             f"· length) = {n_noise}, clamped to [1, length − 1]")
            spans = [_runs(m) for m in found]
            noise_spans = {sum(value for value, _ in r) for r in spans}
            if noise_spans != {n_spans}:
                if n_noise in noise_spans and n_noise != n_spans:
                    raise Failed("every noise token is its own span: group them into "
                                 f"round({n_noise} / mean_span_length) = {n_spans} spans")
                raise Failed(f"the masks have {sorted(noise_spans)} noise spans, expected exactly "
                             f"max(1, round({n_noise} / {span:g})) = {n_spans}")
            if any(r[0][0] for r in spans):
                raise Failed("a mask starts with noise: T5's spans alternate kept, noise, kept, noise, "
                             "… and start with kept tokens")
            if any(not r[-1][0] for r in spans):
                raise Failed("a mask ends with kept tokens: T5 splits the kept tokens into as many "
                             f"spans as the noise ({n_spans}), kept first, so the last span is noise")
            if n_spans > 1:  # one span is always at the end: nothing random about it
                if len({tuple(m.tolist()) for m in found}) == 1:
                    raise Failed("every seed gives the same mask: place the spans at random, with the "
                                 "generator you are given")
                again = masks(length, density, span, range(3))
                if any(not torch.equal(a, b) for a, b in zip(again, found[:3])):
                    raise Failed("the same seed gives different masks: draw every random number from "
                                 "the generator you are given (generator=generator)")
            if n_spans > 1 and n_noise > n_spans:
                noise_lengths = {tuple(n for value, n in r if value) for r in spans}
                if all(len(set(lengths)) == 1 for lengths in noise_lengths):
                    raise Failed("all noise spans have the same length: split the noise tokens into "
                                 f"{n_spans} parts at random (each at least 1 token)")
            if n_spans > 1:
                kept_lengths = {tuple(n for value, n in r if not value) for r in spans}
                if len(kept_lengths) == 1:
                    raise Failed("the kept tokens between the spans are always split the same way: "
                                 "split them at random too")
        return check

    return run_checks("random-spans noise mask", [
        ("length 100, density 0.15, mean span 3", case(100, 0.15, 3.0)),
        ("length 13 (1.95 noise tokens)", case(13, 0.15, 3.0)),
        ("length 3 (needs the clamp)", case(3, 0.15, 3.0)),
        ("length 200, density 0.3, mean span 2", case(200, 0.3, 2.0)),
        ("length 568, T5's setting", case(568, 0.15, 3.0)),
    ])


# --------------------------------------------------------------------------- span corruption
def _corruption_cases() -> list[tuple[str, Tensor, Tensor]]:
    paper = torch.tensor([0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0], dtype=torch.bool)  # "Thank you <X> ... week."
    ends_noise = torch.tensor([0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    one_span = torch.tensor([0, 0, 0, 0, 1], dtype=torch.bool)
    return [("the paper's example (ends with kept tokens)", torch.arange(10, 21), paper),
            ("three spans, the last at the end", torch.arange(30, 42), ends_noise),
            ("one span at the end", torch.arange(50, 55), one_span)]


def _per_token_sentinels(ids: Tensor, mask: Tensor, s: Sequence[int], eos: int) -> tuple[list, list]:
    inputs, targets, k = [], [], 0
    for token, noise in zip(ids.tolist(), mask.tolist()):
        if noise:
            inputs.append(s[k])
            targets += [s[k], token]
            k += 1
        else:
            inputs.append(token)
    return inputs + [eos], targets + [eos]


def check_span_corrupt(fn: Callable[..., tuple]) -> bool:
    """``fn(ids, noise_mask, sentinel_ids, eos_id) -> (inputs, targets)``: T5's sentinels, in T5's order."""
    sentinels = t5_sentinel_ids(1000, 10)
    eos = 1

    def case(ids: Tensor, mask: Tensor) -> Callable[[], None]:
        def check() -> None:
            want_in, want_tgt = (t.tolist() for t in span_corrupt(ids, sentinels, eos, mask))
            got = attempt(fn, ids.clone(), mask.clone(), list(sentinels), eos)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Failed("return a pair (inputs, targets)")
            got_in, got_tgt = _as_ids(got[0], "inputs"), _as_ids(got[1], "targets")
            if (got_in, got_tgt) == (want_in, want_tgt):
                return
            if (got_tgt, got_in) == (want_in, want_tgt):
                raise Failed("inputs and targets are swapped: the input keeps the kept tokens")
            if got_in + [eos] == want_in and got_tgt + [eos] == want_tgt:
                raise Failed(f"EOS is missing: end both sequences with eos_id = {eos}")
            per_token = _per_token_sentinels(ids, mask, sentinels, eos)
            if got_in == per_token[0] or got_tgt == per_token[1]:
                raise Failed("each noise *token* got a sentinel: a whole span of consecutive noise "
                             "tokens becomes one sentinel")
            first = sentinels[0]
            if got_in == [first if t in sentinels else t for t in want_in]:
                raise Failed("every span got the same sentinel: span k gets sentinel_ids[k]")
            reverse = dict(zip(sentinels, reversed(sentinels)))
            if got_in == [reverse.get(t, t) for t in want_in]:
                raise Failed("the sentinels are in the wrong order: the first span gets "
                             "sentinel_ids[0] (<extra_id_0>, the highest id), the next sentinel_ids[1]…")
            if got_in == want_in:
                noise_only = [t for t in want_tgt if t not in sentinels]
                if got_tgt == noise_only:
                    raise Failed("the target has no sentinels: write each dropped span after the "
                                 "sentinel that replaced it in the input")
                if got_tgt == want_tgt[:-2] + [eos] and want_tgt[-2] in sentinels:
                    raise Failed("the target stops after the last dropped span, but this text ends with "
                                 "kept tokens: T5's target closes with one more sentinel (the paper's "
                                 "<X> for inviting <Y> last <Z>)")
                if want_tgt[-2] not in sentinels and got_tgt[-2:-1] and got_tgt[-2] in sentinels:
                    raise Failed("your target adds a closing sentinel after a span that ends the text: "
                                 "T5 marks the *kept* spans in the target, and there is none after it")
                raise Failed(f"the inputs are right; the targets are {got_tgt}, expected {want_tgt}")
            if len(got_in) > len(want_in) and set(ids.tolist()) <= set(got_in):
                raise Failed("the input still holds the dropped tokens: replace each noise span by "
                             "its sentinel")
            raise Failed(f"the inputs are {got_in}, expected {want_in}")
        return check

    return run_checks("span corruption", [(name, case(ids, mask)) for name, ids, mask in _corruption_cases()])


# --------------------------------------------------------------------------- filling the spans back
def check_fill_spans(fn: Callable[..., object]) -> bool:
    """``fn(inputs, targets, sentinel_ids, eos_id) -> ids``: put each span back in place of its sentinel."""
    sentinels = t5_sentinel_ids(1000, 10)
    eos = 1

    def case(ids: Tensor, mask: Tensor) -> Callable[[], None]:
        def check() -> None:
            inputs, targets = (t.tolist() for t in span_corrupt(ids, sentinels, eos, mask))
            want = fill_spans(inputs, targets, sentinels, eos)
            got = _as_ids(attempt(fn, list(inputs), list(targets), list(sentinels), eos), "the text")
            if got == want:
                return
            if got == want + [eos]:
                raise Failed("the EOS is still there: stop at eos_id, it is not part of the text")
            if got == inputs or got == inputs[:-1]:
                raise Failed("nothing was filled in: replace each sentinel of the input by the tokens "
                             "that follow the same sentinel in the target")
            if [t for t in got if t not in sentinels] == want:
                raise Failed("sentinels are left in the text: each one is *replaced* by its span")
            if any(t in sentinels for t in got):
                raise Failed("your text contains sentinel ids: a span runs from its sentinel to the "
                             "next sentinel (or EOS), without either")
            raise Failed(f"got {got}, expected {want}")
        return check

    return run_checks("filling the spans back", [(name, case(ids, mask))
                                                 for name, ids, mask in _corruption_cases()])


# --------------------------------------------------------------------------- position buckets
def _buckets(n_q: int, n_k: int, bidirectional: bool, offset: bool = True, sign: int = 1) -> Tensor:
    query = torch.arange(n_k - n_q if offset else 0, n_k if offset else n_q)
    rel = sign * (torch.arange(n_k)[None, :] - query[:, None])
    return relative_position_bucket(rel, bidirectional, 32, 128)


def check_position_buckets(fn: Callable[[int, int, bool], Tensor]) -> bool:
    """``fn(n_q, n_k, bidirectional)``: T5's bucket of (key − query) for every pair, 32 buckets up to 128.

    The queries are the *last* ``n_q`` of the ``n_k`` positions (with a KV cache the decoder feeds
    only the newest token, at position ``n_k − 1``).
    """

    def case(n_q: int, n_k: int, bidirectional: bool) -> Callable[[], None]:
        def check() -> None:
            want = _buckets(n_q, n_k, bidirectional)
            got = attempt(fn, n_q, n_k, bidirectional)
            if isinstance(got, Tensor) and got.shape == (n_k, n_q) and n_q != n_k:
                raise Failed(f"shape {tuple(got.shape)} is (n_k, n_q): one row per query, ({n_q}, {n_k})")
            expect_tensor(got, want, f"the buckets for n_q={n_q}, n_k={n_k}")
            if got.is_floating_point() or got.dtype == torch.bool:
                raise Failed("buckets index an embedding table: return integers (torch.long), "
                             f"got {got.dtype}")
            got = got.detach().cpu().long()
            if torch.equal(got, want):
                return
            if n_q < n_k and torch.equal(got, _buckets(n_q, n_k, bidirectional, offset=False)):
                raise Failed(f"the queries sit at positions 0..{n_q - 1}, but they are the *last* "
                             f"{n_q} of {n_k} positions ({n_k - n_q}..{n_k - 1}): with a KV cache the "
                             "new token comes after all the cached ones")
            if torch.equal(got, _buckets(n_q, n_k, bidirectional, sign=-1)):
                raise Failed("the sign is reversed (or rows and columns swapped): the relative "
                             "position is key − query, so keys to the left of the query are negative")
            if torch.equal(got, _buckets(n_q, n_k, not bidirectional)):
                raise Failed("bidirectional is ignored: the encoder's buckets look both ways (half "
                             "the buckets each), the decoder's are causal (all buckets for the left)")
            if int(got.max()) >= 32 or int(got.min()) < 0:
                raise Failed(f"bucket ids must lie in 0..31, got {int(got.min())}..{int(got.max())}: "
                             "distances past max_distance share the last bucket")
            bad = (got != want).nonzero()[0].tolist()
            raise Failed(f"query {bad[0]}, key {bad[1]} got bucket {int(got[bad[0], bad[1]])}, "
                         f"expected {int(want[bad[0], bad[1]])}")
        return check

    return run_checks("position buckets", [
        ("encoder, 6 x 6", case(6, 6, True)),
        ("decoder, 6 x 6", case(6, 6, False)),
        ("decoder with a cache: 1 query, 150 keys", case(1, 150, False)),
        ("encoder, 40 x 300", case(40, 300, True)),
        ("decoder, 3 new queries, 20 keys", case(3, 20, False)),
    ])


# --------------------------------------------------------------------------- prefix-LM mask
def check_prefix_lm_mask(fn: Callable[[int, int], Tensor]) -> bool:
    """``fn(seq_len, prefix_len)``: bool ``(seq_len, seq_len)``; query i may read key j iff j <= i
    or j < prefix_len."""

    def case(seq_len: int, prefix_len: int) -> Callable[[], None]:
        def check() -> None:
            want = prefix_lm_mask(seq_len, prefix_len)
            got = attempt(fn, seq_len, prefix_len)
            expect_tensor(got, want, f"the mask for seq_len={seq_len}, prefix_len={prefix_len}")
            if got.dtype != torch.bool:
                raise Failed(f"the mask should be bool (True = may attend), got {got.dtype}")
            got = got.cpu()
            if torch.equal(got, want):
                return
            causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
            i = torch.arange(seq_len)[:, None]
            j = torch.arange(seq_len)[None, :]
            variants = [
                (~want, "True and False are swapped: True means *may attend*"),
                (want.T, "the mask is transposed: row i is query i, column j is key j"),
                (causal, "that is the causal mask: the prefix is fully visible — every query may "
                         f"read the first {prefix_len} keys"),
                (torch.ones_like(want), "everything may attend everything: after the prefix, a "
                                        "position must not read the future"),
                (causal | (i < prefix_len), "the prefix queries read the whole sequence, the part "
                                            "to be generated included: only the prefix *keys* are "
                                            "visible to all"),
                (causal | (j <= prefix_len), f"off by one: the prefix is keys 0..{prefix_len - 1}"),
            ]
            for wrong, message in variants:
                if torch.equal(got, wrong):
                    raise Failed(message)
            bad = (got != want).nonzero()[0].tolist()
            raise Failed(f"query {bad[0]}, key {bad[1]} is {bool(got[bad[0], bad[1]])}, expected "
                         f"{bool(want[bad[0], bad[1]])}")
        return check

    return run_checks("prefix-LM mask", [
        ("seq_len 6, prefix 2", case(6, 2)),
        ("seq_len 7, prefix 4", case(7, 4)),
        ("prefix 0 (causal)", case(5, 0)),
        ("prefix = seq_len (fully visible)", case(4, 4)),
    ])
