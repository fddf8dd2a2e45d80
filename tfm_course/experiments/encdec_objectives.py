"""Pretraining objectives compared as the T5 paper compared them: one encoder-decoder, the
objective varied (Raffel et al. 2020, §3.3, Table 4), on the same raw windows of text.

    batch = objective_batch("prefix LM", raw, specials, g)      # raw (B, L) -> (inputs, targets)
    loss = objective_loss(model, batch, specials)               # mean nats over the target tokens
    gap = blank_gap(model, batch, specials)                     # loss with the encoder fed nothing, minus it
    logits = ask_next_token("prefix LM", model, context, specials)       # (B, vocab)
    logits = ask_infill("span corruption", model, left, right, specials)  # (B, vocab)
    model, history = pretrain_objective("prefix LM", specials, train_stream, steps=2000, lr=4e-3)

Every objective turns a raw window ``(B, L)`` into an encoder input (ending in EOS, as every T5
input does) and a decoder target; the model is always :class:`~tfm_course.models.t5.T5`:

* ``"span corruption"`` (T5's choice): spans replaced by sentinels in the input; the target lists
  the dropped spans, each after its sentinel (:func:`~tfm_course.data.span_corruption.span_corrupt_batch`;
  ``noise_density``, ``mean_span_length``).
* ``"BERT-style"``: 15 % of the tokens chosen, 80/10/10 as in BERT
  (:func:`~tfm_course.data.mlm.mask_tokens`); the target is the whole original window (T5's
  "BERT-style" objective, its Table 4).
* ``"prefix LM"``: the window cut at a random point (one per batch, uniform in ``[1, L - 1]``): the
  encoder reads the prefix, the decoder writes the rest.
* ``"causal LM"``: the encoder is fed nothing (EOS alone); the decoder writes the whole window,
  so it is a decoder-only language model inside the encoder-decoder.

Each model is asked the same questions its own way: the next token after a context, and a
missing token between a left and a right context. The count-based references for them are
:class:`tfm_course.ngram.KneserNey`'s bigram (next token) and its two-sided bigram (infilling).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.mlm import mask_tokens
from ..data.span_corruption import span_corrupt_batch
from ..device import one_cpu_thread
from ..models.t5 import T5, shift_right
from ..train import History, train, warmup_cosine
from .objectives import Specials, random_windows

__all__ = ["ENCDEC_OBJECTIVES", "objective_batch", "objective_loss", "blank_inputs", "blank_gap",
           "ask_next_token", "ask_infill", "encoder_reads", "ENCDEC_SIZES", "encdec_model", "pretrain_objective",
           "cross_attention_weights", "sentinel_attention"]

ENCDEC_OBJECTIVES = ("span corruption", "BERT-style", "prefix LM", "causal LM")


def _check(objective: str) -> None:
    if objective not in ENCDEC_OBJECTIVES:
        raise ValueError(f"objective must be one of {ENCDEC_OBJECTIVES}, got {objective!r}")


def _eos_column(like: Tensor, specials: Specials) -> Tensor:
    return torch.full_like(like[:, :1], specials.eos)


def objective_batch(objective: str, raw: Tensor, specials: Specials, generator: torch.Generator | None,
                    noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[Tensor, Tensor]:
    """``(inputs (B, S), targets (B, T))`` from raw windows ``(B, L)``; every input ends in EOS.

    prefix LM: S = k + 1, T = L - k for a cut k drawn from ``generator`` in [1, L - 1];
    causal LM: S = 1 (EOS), T = L; BERT-style: S = L + 1, T = L; span corruption: T5's lengths.
    """
    _check(objective)
    if raw.dim() != 2 or raw.shape[1] < 2:
        raise ValueError(f"raw must be (batch, length >= 2) ids, got {tuple(raw.shape)}")
    eos = _eos_column(raw, specials)
    if objective == "span corruption":
        return span_corrupt_batch(raw, specials.sentinels, specials.eos, noise_density, mean_span_length,
                                  generator)
    if objective == "causal LM":
        return eos, raw
    if objective == "prefix LM":
        device = generator.device if generator is not None else raw.device
        cut = int(torch.randint(1, raw.shape[1], (1,), generator=generator, device=device))
        return torch.cat([raw[:, :cut], eos], 1), raw[:, cut:]
    never = [specials.pad, specials.mask, specials.eos] + specials.sentinels
    corrupted, _ = mask_tokens(raw, torch.zeros_like(raw, dtype=torch.bool), specials.vocab_size,
                               specials.mask, noise_density, generator, special_ids=never)
    return torch.cat([corrupted, eos], 1), raw


def objective_loss(model: T5, batch: tuple[Tensor, Tensor], specials: Specials) -> Tensor:
    """Teacher-forced mean cross-entropy (nats) over every target token."""
    inputs, targets = batch
    logits = model(inputs, shift_right(targets, specials.pad))
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def blank_inputs(inputs: Tensor, specials: Specials) -> Tensor:
    """The encoder fed nothing: EOS alone ``(B, 1)``, what the causal LM always sees."""
    return _eos_column(inputs, specials)


@torch.no_grad()
def blank_gap(model: T5, batch: tuple[Tensor, Tensor], specials: Specials) -> dict[str, float]:
    """How much a model uses its input: its loss on ``batch`` with the real input, with the input
    blanked (:func:`blank_inputs`), and their difference (nats; 0 for a model that ignores it)."""
    inputs, targets = batch
    real = objective_loss(model, batch, specials).item()
    blank = objective_loss(model, (blank_inputs(inputs, specials), targets), specials).item()
    return {"loss": real, "blank loss": blank, "gap": blank - real}


def _last_logits(model: T5, inputs: Tensor, decoder_inputs: Tensor) -> Tensor:
    return model(inputs, decoder_inputs)[:, -1]


def _column(like: Tensor, value: int) -> Tensor:
    return torch.full_like(like[:, :1], value)


def ask_next_token(objective: str, model: T5, context: Tensor, specials: Specials,
                   cut: int | None = None) -> Tensor:
    """Logits ``(B, vocab)`` for the token after ``context (B, n)``, asked as training asked:

    span corruption: input ``context <extra_id_0> EOS``, decoder ``<start> <extra_id_0>``;
    BERT-style: input ``context [MASK] EOS``, decoder ``<start> context``;
    prefix LM: input ``context EOS``, decoder ``<start>`` (with ``cut`` k: input
    ``context[:k] EOS``, decoder ``<start> context[k:]``, another cut its training also drew);
    causal LM: input ``EOS``, decoder ``<start> context``.
    """
    _check(objective)
    if cut is not None:
        if objective != "prefix LM" or not 1 <= cut < context.shape[1]:
            raise ValueError(f"cut is for the prefix LM, 1 <= cut < {context.shape[1]}; got {cut!r} for {objective!r}")
        start, eos = _column(context, specials.pad), _column(context, specials.eos)
        return _last_logits(model, torch.cat([context[:, :cut], eos], 1), torch.cat([start, context[:, cut:]], 1))
    start, eos = _column(context, specials.pad), _column(context, specials.eos)
    if objective == "span corruption":
        s0 = _column(context, specials.sentinels[0])
        return _last_logits(model, torch.cat([context, s0, eos], 1), torch.cat([start, s0], 1))
    if objective == "BERT-style":
        mask = _column(context, specials.mask)
        return _last_logits(model, torch.cat([context, mask, eos], 1), torch.cat([start, context], 1))
    if objective == "prefix LM":
        return _last_logits(model, torch.cat([context, eos], 1), start)
    return _last_logits(model, eos, torch.cat([start, context], 1))


def ask_infill(objective: str, model: T5, left: Tensor, right: Tensor, specials: Specials) -> Tensor:
    """Logits ``(B, vocab)`` for the one token between ``left (B, n)`` and ``right (B, m)``.

    span corruption: input ``left <extra_id_0> right EOS``, decoder ``<start> <extra_id_0>``;
    BERT-style: input ``left [MASK] right EOS``, decoder ``<start> left``. The language models
    cannot read ``right``: they are asked for the next token after ``left``
    (:func:`ask_next_token`), so their answers show what the right context is worth.
    """
    _check(objective)
    if left.shape[0] != right.shape[0]:
        raise ValueError(f"left and right must have the same batch size, got {left.shape[0]} and {right.shape[0]}")
    if objective in ("prefix LM", "causal LM"):
        return ask_next_token(objective, model, left, specials)
    start, eos = _column(left, specials.pad), _column(left, specials.eos)
    if objective == "span corruption":
        s0 = _column(left, specials.sentinels[0])
        return _last_logits(model, torch.cat([left, s0, right, eos], 1), torch.cat([start, s0], 1))
    mask = _column(left, specials.mask)
    return _last_logits(model, torch.cat([left, mask, right, eos], 1), torch.cat([start, left], 1))


def encoder_reads(objective: str) -> bool:
    """Whether the objective ever gives the encoder text (the causal LM's encoder sees only EOS)."""
    _check(objective)
    return objective != "causal LM"


# the encoder-decoder every objective trains (2 + 2 blocks, T5's ReLU FFN), and its batches
ENCDEC_SIZES: dict[str, Any] = dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, batch=32, length=64)


def encdec_model(specials: Specials, sizes: dict[str, Any] | None = None) -> T5:
    """A fresh :class:`T5` of ``sizes`` (default :data:`ENCDEC_SIZES`; ``num_layers`` per side),
    heads of width ``d_model / num_heads``, no dropout: the model every objective trains."""
    sizes = dict(ENCDEC_SIZES, **(sizes or {}))
    return T5(specials.config(**{k: sizes[k] for k in ("d_model", "num_heads", "num_layers", "d_ff")},
                              d_kv=sizes["d_model"] // sizes["num_heads"], dropout=0.0))


def pretrain_objective(objective: str, specials: Specials, train_stream: Tensor, steps: int, lr: float,
                       seed: int = 0, sizes: dict[str, Any] | None = None, noise_density: float = 0.15,
                       mean_span_length: float = 3.0, eval_fn: Callable[[T5], dict[str, float]] | None = None,
                       eval_every: int | None = None, progress: bool = True, desc: str | None = None,
                       total_steps: int | None = None) -> tuple[T5, History]:
    """Train a fresh :class:`T5` of ``sizes`` (default :data:`ENCDEC_SIZES`; ``num_layers`` per
    side) with ``objective`` on random windows of ``train_stream``: AdamW at peak ``lr``, warm-up
    over the first tenth, cosine decay. ``seed`` sets the initial weights and the windows (and the
    masks). ``total_steps`` (default ``steps``) sets the schedule's length: a run stopped at ``steps``
    of a longer one replays that run's start. On the CPU one thread; ``history.seconds`` is process
    CPU time."""
    _check(objective)
    sizes = dict(ENCDEC_SIZES, **(sizes or {}))
    total = total_steps or steps
    if total < steps:
        raise ValueError(f"total_steps must be >= steps = {steps}, got {total_steps}")
    device = train_stream.device
    torch.manual_seed(seed)
    model = encdec_model(specials, sizes).to(device)
    g = torch.Generator(device=device).manual_seed(seed)

    def make_batch(step: int) -> tuple[Tensor, Tensor]:
        raw = random_windows(train_stream, sizes["batch"], sizes["length"], g)
        return objective_batch(objective, raw, specials, g, noise_density, mean_span_length)

    cpu = time.process_time()
    with one_cpu_thread(device):
        history = train(model, make_batch, lambda m, b: objective_loss(m, b, specials), steps=steps, lr=lr,
                        schedule=warmup_cosine(max(1, total // 10), total), eval_fn=eval_fn,
                        eval_every=eval_every if eval_fn else None, progress=progress, desc=desc or objective)
    if device.type == "cpu":
        history.seconds = time.process_time() - cpu
    return model, history


@torch.no_grad()
def cross_attention_weights(model: T5, inputs: Tensor, decoder_inputs: Tensor) -> Tensor:
    """Every decoder block's cross-attention weights ``(layers, B, heads, T, S)`` for one teacher-forced
    pass (no padding: every input position is a real token). Recomputed from the block's own query
    and key projections, captured with forward hooks; T5 adds no position bias to cross-attention."""
    captured: list[Tensor] = []

    def hook(module, args, _output):
        x, k = args[0], args[1]
        q = module.q(x).unflatten(-1, (module.num_heads, module.d_kv)).transpose(1, 2)  # (B, h, T, d_kv)
        captured.append(torch.softmax((q @ k.transpose(-2, -1)).float(), dim=-1))

    handles = [block.cross_attn.register_forward_hook(hook) for block in model.decoder.blocks]
    try:
        model.eval()
        model(inputs, decoder_inputs)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(captured)


@torch.no_grad()
def sentinel_attention(model: T5, batch: tuple[Tensor, Tensor], specials: Specials,
                       heads: Sequence[int] | None = None) -> dict[str, float]:
    """Where a span-corruption decoder looks when it has just read sentinel ``<extra_id_k>`` (the
    decoder position that predicts the first dropped token). Per decoder block, for the head that
    looks most at it: the mean cross-attention weight on the encoder token just **left of the same
    sentinel** (the token before the dropped span), on the same sentinel, and on the token left of
    **another** sentinel of the input (a lookup by position alone would not tell them apart); and
    the uniform weight ``1 / S``. Keys: ``"uniform"``, ``"layer i: head"``, ``"layer i: left of the
    same sentinel"``, ``"layer i: the same sentinel"``, ``"layer i: left of another sentinel"``.

    ``heads`` (one per decoder block) fixes the heads to report instead, e.g. those this function
    chose on another batch, so that the choice does not flatter the numbers it reports."""
    inputs, targets = batch
    decoder_inputs = shift_right(targets, specials.pad)
    weights = cross_attention_weights(model, inputs, decoder_inputs)  # (layers, B, heads, T, S)
    n_layers, n_heads = weights.shape[0], weights.shape[2]
    sums = torch.zeros(3, n_layers, n_heads, dtype=torch.float64)  # left of same, same, left of other
    count = 0
    sentinels = set(specials.sentinels)
    for b in range(inputs.shape[0]):
        in_pos = {int(t): i for i, t in enumerate(inputs[b].tolist()) if t in sentinels and i > 0}
        for t, tok in enumerate(decoder_inputs[b].tolist()):
            if tok not in in_pos or len(in_pos) < 2:
                continue
            i, others = in_pos[tok], [j - 1 for s, j in in_pos.items() if s != tok]
            w = weights[:, b, :, t].double()  # (layers, heads, S)
            sums[0] += w[..., i - 1]
            sums[1] += w[..., i]
            sums[2] += w[..., others].mean(-1)
            count += 1
    out: dict[str, float] = {"uniform": 1.0 / inputs.shape[1]}
    means = sums / max(count, 1) if count else torch.full_like(sums, math.nan)
    if heads is not None and len(heads) != n_layers:
        raise ValueError(f"heads: expected one per decoder block ({n_layers}), got {len(heads)}")
    for layer in range(n_layers):
        head = int(means[0, layer].argmax()) if heads is None else int(heads[layer])
        out[f"layer {layer}: head"] = head
        for k, name in enumerate(("left of the same sentinel", "the same sentinel", "left of another sentinel")):
            out[f"layer {layer}: {name}"] = float(means[k, layer, head])
    return out
