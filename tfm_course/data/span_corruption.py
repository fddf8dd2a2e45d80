"""T5's span corruption (Raffel et al., 2020): drop random spans, ask the decoder to write them back.

    mask = random_spans_noise_mask(len(ids))               # (L,) bool, True = dropped ("noise")
    inputs, targets = span_corrupt(ids, sentinels, eos_id=eos, noise_mask=mask)

With the paper's example, *Thank you for inviting me to your party last week.*, and the spans
"for inviting" and "last" dropped::

    inputs  = Thank you <X> me to your party <Y> week. </s>
    targets = <X> for inviting <Y> last <Z> </s>

Each noise span becomes one sentinel in the input; the target gives, after each sentinel, the
tokens it hides. Exactly as in T5's code, the target is built by the same rule with the roles
swapped: every *kept* span of the text becomes a sentinel. So the target's sentinels are
``<X> <Y> ...`` in the same order, and a text that ends with kept tokens ("week.") closes its
target with one more sentinel (``<Z>``). T5's random masks, however, always *end* with a noise
span (they alternate kept / noise, starting with kept), so in pre-training the input ends with
a sentinel and the target with the last dropped span, then ``</s>``.

Sentinels are ids counted down from the top of the *tokenizer*, as T5's tokenizer has them:
``<extra_id_0>`` is ``len(tokenizer) - 1``, ``<extra_id_1>`` is ``len(tokenizer) - 2``, …
(:func:`t5_sentinel_ids`). The model's embedding can have more rows than the tokenizer has
tokens (Google's t5-small: 32,100 tokens, 32,128 rows, padded to a multiple of 128), so the
count starts from the tokenizer's length, not from the embedding's.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["noise_counts", "random_spans_noise_mask", "t5_sentinel_ids", "span_corrupt",
           "span_corrupt_batch", "fill_spans", "t5_lengths", "t5_raw_length"]


# --------------------------------------------------------------------------- counts
def _check_settings(noise_density: float, mean_span_length: float) -> None:
    if not 0.0 <= noise_density < 1.0:
        raise ValueError(f"noise_density must be in [0, 1), got {noise_density!r}")
    if not mean_span_length >= 1.0:
        raise ValueError(f"mean_span_length must be >= 1, got {mean_span_length!r}")


def _round_f32(x: float) -> int:
    """Round a float32 number half-to-even, as ``tf.round`` does in T5's code."""
    return int(torch.round(torch.tensor(x, dtype=torch.float32)))


def noise_counts(length: int, noise_density: float = 0.15,
                 mean_span_length: float = 3.0) -> tuple[int, int]:
    """``(noise tokens, noise spans)`` of a mask of ``length`` tokens, as T5 computes them::

        n_noise = round(noise_density · L), clamped to [1, L − 1]
        n_spans = max(1, round(n_noise / mean_span_length))

    In float32 with round-half-to-even, like T5's TensorFlow code: 190 · 0.15 is 28.500002 in
    float32, so 190 tokens get 29 noise tokens (float64 gives exactly 28.5, rounded to 28).
    T5 lifts ``L = 1`` to 2 and keeps the first token of that mask, so a single token is never
    noise: ``(0, 0)``. ``noise_density = 0`` gives no noise at all.
    """
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    _check_settings(noise_density, mean_span_length)
    if noise_density == 0.0 or length == 1:
        return 0, 0
    density = torch.tensor(noise_density, dtype=torch.float32)
    n_noise = _round_f32(float(torch.tensor(float(length), dtype=torch.float32) * density))
    n_noise = min(max(n_noise, 1), length - 1)
    n_spans = _round_f32(float(torch.tensor(float(n_noise), dtype=torch.float32)
                               / torch.tensor(mean_span_length, dtype=torch.float32)))
    return n_noise, max(n_spans, 1)


# --------------------------------------------------------------------------- the mask
def _random_segmentation(batch: int, num_items: int, num_segments: int,
                         generator: torch.Generator | None, device: torch.device | None) -> Tensor:
    """Split ``num_items`` into ``num_segments`` non-empty parts, every split equally likely.

    Returns the part lengths ``(batch, num_segments)``, one split per row: choose which
    ``num_segments - 1`` of the ``num_items - 1`` gaps between items start a new part (T5
    shuffles a vector of that many ones; sorting random keys is the same uniform choice).
    """
    first = torch.zeros(batch, num_items, dtype=torch.long, device=device)
    if num_segments > 1:
        keys = torch.rand(batch, num_items - 1, generator=generator, device=device)
        first.scatter_(1, keys.argsort(dim=1)[:, : num_segments - 1] + 1, 1)
    part = first.cumsum(1)  # (batch, num_items): which part each item falls in
    lengths = torch.zeros(batch, num_segments, dtype=torch.long, device=device)
    return lengths.scatter_add_(1, part, torch.ones_like(part))


def _noise_masks(batch: int, length: int, noise_density: float, mean_span_length: float,
                 generator: torch.Generator | None, device: torch.device | None = None) -> Tensor:
    """``batch`` independent T5 masks ``(batch, length)``; see :func:`random_spans_noise_mask`."""
    n_noise, n_spans = noise_counts(length, noise_density, mean_span_length)
    if generator is not None:
        device = generator.device
    if n_spans == 0:
        return torch.zeros(batch, length, dtype=torch.bool, device=device)
    noise_lengths = _random_segmentation(batch, n_noise, n_spans, generator, device)
    kept_lengths = _random_segmentation(batch, length - n_noise, n_spans, generator, device)
    span_lengths = torch.stack([kept_lengths, noise_lengths], dim=2).view(batch, -1)  # kept, noise, ...
    span_start = torch.zeros(batch, length, dtype=torch.long, device=device)
    span_start.scatter_(1, span_lengths.cumsum(1)[:, :-1], 1)
    return span_start.cumsum(1) % 2 == 1  # odd-numbered spans are noise


def random_spans_noise_mask(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
                            generator: torch.Generator | None = None) -> Tensor:
    """T5's noise mask ``(length,)``, bool, True on the tokens to drop.

    :func:`noise_counts` fixes how many tokens and spans are noise; the noise tokens are split into
    that many spans uniformly at random (each ≥ 1 token), the kept tokens into as many spans, and
    the spans alternate kept, noise, kept, noise, … — so the mask starts with kept tokens and
    ends with a noise span. All masks with these counts are equally likely. On the device of
    ``generator`` (the CPU by default).
    """
    return _noise_masks(1, length, noise_density, mean_span_length, generator)[0]


# --------------------------------------------------------------------------- corrupting
def t5_sentinel_ids(tokenizer_length: int, count: int = 100) -> list[int]:
    """``[<extra_id_0>, <extra_id_1>, ...]`` = ``[tokenizer_length − 1, tokenizer_length − 2, ...]``.

    ``tokenizer_length`` is ``len(tokenizer)``: how many ids the tokenizer defines, its sentinels
    included, which T5's tokenizer puts last, ``<extra_id_0>`` on top. It is *not* the number of
    rows of the model's embedding, which Google's checkpoints pad (t5-small: ``len(tokenizer)`` is
    32,100, so ``<extra_id_0>`` is 32,099, while the embedding has 32,128 rows; counting from
    32,128 gives ids no token has). For a tokenizer built here with the sentinels appended last,
    ``len(tokenizer)`` is its vocabulary size with the sentinels.
    """
    try:
        tokenizer_length, count = operator.index(tokenizer_length), operator.index(count)
    except TypeError:
        raise ValueError(f"tokenizer_length and count must be integers (tokenizer_length = "
                         f"len(tokenizer)), got {type(tokenizer_length).__name__} and "
                         f"{type(count).__name__}") from None
    if count < 1 or tokenizer_length < count:
        raise ValueError(f"need 1 <= count <= tokenizer_length, got count={count}, "
                         f"tokenizer_length={tokenizer_length}")
    return list(range(tokenizer_length - 1, tokenizer_length - 1 - count, -1))


def _span_starts(mask: Tensor) -> Tensor:
    """True on the first token of each run of True along the last dim of a bool ``mask``."""
    return mask & ~torch.cat([torch.zeros_like(mask[..., :1]), mask[..., :-1]], dim=-1)


def _spans_to_sentinels(ids: Tensor, mask: Tensor, sentinels: Tensor, length: int) -> Tensor:
    """``(B, L) -> (B, length)``: replace each run of True in ``mask`` by the next sentinel, keep
    the other tokens. Every row must keep ``length`` tokens (true of T5's masks, whose counts are
    known in advance), so no data-dependent shape, and no host sync on a GPU, is needed.
    """
    first = _span_starts(mask)
    span = first.long().cumsum(-1) - 1  # which span a token belongs to (-1 before the first)
    out = torch.where(first, sentinels[span.clamp(min=0)], ids)
    dropped = (mask & ~first).to(torch.uint8)  # the rest of each span
    order = torch.argsort(dropped, dim=-1, stable=True)[..., :length]  # kept positions, in order
    return out.gather(-1, order)


def _append(x: Tensor, eos_id: int | None) -> Tensor:
    if eos_id is None:
        return x
    return torch.cat([x, torch.full_like(x[..., :1], eos_id)], dim=-1)


def span_corrupt(ids: Tensor | Sequence[int], sentinel_ids: Sequence[int], eos_id: int | None = None,
                 noise_mask: Tensor | None = None, noise_density: float = 0.15,
                 mean_span_length: float = 3.0,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``ids (L,) -> (inputs, targets)``, both 1-D long tensors on ``ids``' device.

    * ``inputs``: ``ids`` with each noise span replaced by one sentinel;
    * ``targets``: ``ids`` with each *kept* span replaced by one sentinel (so each dropped span
      follows the sentinel that marks it in the input).

    ``sentinel_ids[k]`` is the k-th sentinel (T5: :func:`t5_sentinel_ids`). ``eos_id``, if given,
    ends both sequences. ``noise_mask`` ``(L,)`` bool defaults to :func:`random_spans_noise_mask`;
    it must start with a kept token (T5's always do).
    Lengths: inputs = kept tokens + noise spans (+ 1), targets = noise tokens + kept spans (+ 1),
    which for T5's masks is :func:`t5_lengths`.
    """
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.is_floating_point() or ids.numel() == 0:
        raise ValueError(f"ids must be a non-empty 1-D tensor of token ids, got shape "
                         f"{tuple(ids.shape)} and dtype {ids.dtype}")
    ids = ids.long()
    if noise_mask is None:
        noise_mask = random_spans_noise_mask(ids.numel(), noise_density, mean_span_length, generator)
    noise_mask = torch.as_tensor(noise_mask).to(ids.device)
    if noise_mask.dtype != torch.bool or noise_mask.shape != ids.shape:
        raise ValueError(f"noise_mask must be a bool tensor of shape {tuple(ids.shape)}, got "
                         f"{tuple(noise_mask.shape)} {noise_mask.dtype}")
    if bool(noise_mask[0]):
        raise ValueError("noise_mask must start with a kept token (False), as T5's masks do: the "
                         "target's sentinels mark the kept spans, so they pair up with the input's "
                         "only when the text starts with kept tokens")
    sentinels = torch.as_tensor(list(sentinel_ids), dtype=torch.long, device=ids.device)
    needed = max(int(_span_starts(noise_mask).sum()), int(_span_starts(~noise_mask).sum()))
    if sentinels.dim() != 1 or sentinels.numel() < needed:
        raise ValueError(f"this mask has {needed} spans to mark but only {sentinels.numel()} "
                         "sentinel ids were given")
    noise_starts, kept_starts = _span_starts(noise_mask), _span_starts(~noise_mask)
    n_in = ids.numel() - int(noise_mask.sum()) + int(noise_starts.sum())
    n_tgt = int(noise_mask.sum()) + int(kept_starts.sum())
    inputs = _spans_to_sentinels(ids[None], noise_mask[None], sentinels, n_in)[0]
    targets = _spans_to_sentinels(ids[None], ~noise_mask[None], sentinels, n_tgt)[0]
    return _append(inputs, eos_id), _append(targets, eos_id)


def span_corrupt_batch(ids: Tensor, sentinel_ids: Sequence[int], eos_id: int | None = None,
                       noise_density: float = 0.15, mean_span_length: float = 3.0,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """A fresh mask per row of ``ids (B, L)`` -> ``inputs (B, L_in)``, ``targets (B, L_tgt)``.

    Every T5 mask of length L has the same counts, so every row has the lengths of
    :func:`t5_lengths` and the batch needs no padding. Vectorised (no Python loop over rows) and
    without a host sync: on a GPU, pass a generator on that device.
    """
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] == 0 or ids.is_floating_point():
        raise ValueError(f"ids must be integer token ids (batch, length) with batch >= 1, got "
                         f"{getattr(ids, 'shape', type(ids))}")
    batch, length = ids.shape
    n_spans = noise_counts(length, noise_density, mean_span_length)[1]
    if len(sentinel_ids) < max(n_spans, 1):
        raise ValueError(f"{length} tokens make {n_spans} spans but only {len(sentinel_ids)} "
                         "sentinel ids were given")
    masks = _noise_masks(batch, length, noise_density, mean_span_length, generator, ids.device)
    masks = masks.to(ids.device)
    sentinels = torch.as_tensor(list(sentinel_ids), dtype=torch.long, device=ids.device)
    n_in, n_tgt = t5_lengths(length, noise_density, mean_span_length, eos=False)
    inputs = _spans_to_sentinels(ids.long(), masks, sentinels, n_in)
    targets = _spans_to_sentinels(ids.long(), ~masks, sentinels, n_tgt)
    return _append(inputs, eos_id), _append(targets, eos_id)


def fill_spans(inputs: Tensor | Sequence[int], targets: Tensor | Sequence[int],
               sentinel_ids: Sequence[int], eos_id: int | None = None) -> list[int]:
    """Undo :func:`span_corrupt`: put back, in place of each sentinel of ``inputs``, what follows
    that sentinel in ``targets`` (up to the next sentinel or EOS). Returns the ids as a list.

    This is also how a T5 prediction is read: the model writes the target, and the text is the
    input with its sentinels filled in. A sentinel the target never mentions is left in place.
    """
    inputs, targets = [int(t) for t in torch.as_tensor(inputs).tolist()], \
        [int(t) for t in torch.as_tensor(targets).tolist()]
    sentinels = set(int(s) for s in sentinel_ids)
    spans: dict[int, list[int]] = {}
    current: int | None = None
    for token in targets:
        if token == eos_id:
            break
        if token in sentinels:
            current = token
            spans.setdefault(current, [])
        elif current is not None:
            spans[current].append(token)
    out: list[int] = []
    for token in inputs:
        if token == eos_id:
            break
        out.extend(spans.get(token, [token]) if token in sentinels else [token])
    return out


# --------------------------------------------------------------------------- lengths
def t5_lengths(raw_length: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
               eos: bool = True) -> tuple[int, int]:
    """``(input length, target length)`` after corrupting ``raw_length`` tokens with a T5 mask.

    inputs = kept tokens + noise spans + 1 (EOS); targets = noise tokens + kept spans + 1 (EOS).
    T5's masks have as many kept spans as noise spans, so 568 tokens (85 noise tokens in 28
    spans) give 483 + 28 + 1 = 512 and 85 + 28 + 1 = 114. Counted like the mask itself
    (:func:`noise_counts`: float32, clamped), so it always equals what :func:`span_corrupt` returns;
    T5's ``random_spans_helper`` rounds in float64 without the clamps, so it disagrees below 10
    tokens (where it allows 0 spans) and at float32 ties (190 is the first: 28 noise tokens
    there, 29 in the mask).
    """
    n_noise, n_spans = noise_counts(raw_length, noise_density, mean_span_length)
    kept_spans = n_spans if n_noise else 1  # no noise: the whole text is one kept span
    extra = 1 if eos else 0
    return raw_length - n_noise + n_spans + extra, n_noise + kept_spans + extra


def t5_raw_length(inputs_length: int, noise_density: float = 0.15,
                  mean_span_length: float = 3.0) -> int:
    """The longest raw length whose corrupted input fits ``inputs_length`` (with EOS): 512 -> 568."""
    if not isinstance(inputs_length, int) or inputs_length < 2:
        raise ValueError(f"inputs_length must be an int >= 2 (a token and EOS), got {inputs_length!r}")
    raw = 1
    while t5_lengths(raw + 1, noise_density, mean_span_length)[0] <= inputs_length:
        raw += 1
    return raw
