"""BERT's, GPT's and T5's pretraining objectives on the same blocks, text and compute (chapter 9).

    specials = Specials.after(tokenizer.vocab_size, eos=tokenizer.special_ids["<|endoftext|>"])
    stream = token_stream(tokenizer, texts, specials.eos)             # (N,) one long id stream
    model = build_model("span corruption", specials, d_model=64, num_layers=4, d_ff=256)
    batch = pretraining_batch("span corruption", random_windows(stream, 32, 64, g), specials, g)
    loss = pretraining_loss("span corruption", model, batch, specials)

Every model is made of T5's blocks (:mod:`tfm_course.models.t5_blocks`), so only the objective
and the attention pattern differ:

* ``"masked LM"`` (BERT): one bidirectional stack; 15 % of the tokens chosen, 80/10/10 as in
  :func:`tfm_course.data.mlm.mask_tokens`; the output layer runs on the chosen positions only.
* ``"causal LM"`` (GPT): one causal stack; every position predicts the next token.
* ``"span corruption"`` (T5): an encoder-decoder with half the blocks on each side
  (:func:`tfm_course.data.span_corruption.span_corrupt_batch`).

The single stacks get the encoder-decoder's number of non-embedding parameters by a wider
feed-forward block (:func:`matched_d_ff`). Text-to-text helpers turn (input, target) strings into
padded id tensors, train on them and score exact matches; :func:`docstring_kind_pairs` is chapter 7's
corpus-derived classification task (class or function docstring?) as text pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.docstring_tasks import CLASS_OR_FUNCTION_LABELS, class_or_function
from ..data.mlm import IGNORE, mask_tokens
from ..data.span_corruption import span_corrupt_batch
from ..decoding import ban_tokens, greedy_search
from ..models.t5 import T5, T5Config, shift_right
from ..models.t5_lm import T5StackLM
from .measure import count_flops

__all__ = ["OBJECTIVES", "Specials", "token_stream", "random_windows", "matched_d_ff", "build_model",
           "non_embedding_parameters", "pretraining_batch", "pretraining_loss", "masked_per_row", "step_flops",
           "next_token_logits", "mean_features", "docstring_kind_pairs", "encode_pairs",
           "ban", "text_to_text_loss", "greedy", "exact_match"]

OBJECTIVES = ("masked LM", "causal LM", "span corruption")


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


@dataclass(frozen=True)
class Specials:
    """Ids of the extra tokens, placed after a tokenizer's ``n_tokens`` ids: ``pad`` (also the
    decoder's start token, as in T5), ``mask`` (BERT's ``[MASK]``), then the sentinels, counted
    down from the top as T5 does (``sentinels[0]`` = ``<extra_id_0>`` = ``vocab_size - 1``)."""

    n_tokens: int
    eos: int
    n_sentinels: int = 16
    pad: int = field(init=False)
    mask: int = field(init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.eos < self.n_tokens or self.n_sentinels < 1:
            raise ValueError(f"need 0 <= eos < n_tokens and n_sentinels >= 1, got eos={self.eos}, "
                             f"n_tokens={self.n_tokens}, n_sentinels={self.n_sentinels}")
        object.__setattr__(self, "pad", self.n_tokens)
        object.__setattr__(self, "mask", self.n_tokens + 1)

    @classmethod
    def after(cls, n_tokens: int, eos: int, n_sentinels: int = 16) -> "Specials":
        return cls(n_tokens, eos, n_sentinels)

    @property
    def vocab_size(self) -> int:
        return self.n_tokens + 2 + self.n_sentinels

    @property
    def sentinels(self) -> list[int]:
        return list(range(self.vocab_size - 1, self.vocab_size - 1 - self.n_sentinels, -1))

    def config(self, **sizes) -> T5Config:
        """A :class:`T5Config` with these ids (pad = decoder start) and the given sizes."""
        return T5Config(vocab_size=self.vocab_size, pad_id=self.pad, eos_id=self.eos,
                        decoder_start_id=self.pad, **sizes)


# --------------------------------------------------------------------------- text
def encode_text(tokenizer, text: str) -> list[int]:
    """``text`` we did not write, as ids: a special token's spelling in it stays plain characters
    (``encode_ordinary`` where the tokenizer has special tokens; a character tokenizer has none)."""
    encode = getattr(tokenizer, "encode_ordinary", tokenizer.encode)
    return encode(text)


def token_stream(tokenizer, texts: Sequence[str], eos: int) -> Tensor:
    """Every text encoded (:func:`encode_text`) and followed by ``eos``, joined into one ``(N,)`` long tensor."""
    ids: list[int] = []
    for text in texts:
        ids.extend(encode_text(tokenizer, text))
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: Tensor, batch: int, length: int, generator: torch.Generator) -> Tensor:
    """``(batch, length)`` windows of ``stream`` at random offsets (on the generator's device)."""
    if stream.dim() != 1 or stream.numel() <= length:
        raise ValueError(f"stream must be 1-D and longer than length={length}, got {tuple(stream.shape)}")
    start = torch.randint(stream.numel() - length, (batch, 1), generator=generator,
                          device=generator.device).to(stream.device)
    return stream[start + torch.arange(length, device=stream.device)]


# --------------------------------------------------------------------------- models
def matched_d_ff(d_model: int, num_heads: int, d_kv: int, num_layers: int, d_ff: int,
                 num_buckets: int = 32) -> int:
    """The feed-forward width that gives one stack of ``num_layers`` blocks as many non-embedding
    parameters as an encoder-decoder with ``num_layers / 2`` blocks on each side (ReLU blocks).

    An encoder block holds attention (4·d·h·d_kv) + FFN (2·d·d_ff) + 2 norms; a decoder block
    one more attention and norm; each stack a final norm and one position-bias table.
    """
    if num_layers < 2 or num_layers % 2:
        raise ValueError(f"num_layers must be even (half per side), got {num_layers}")
    attn, half = 4 * d_model * num_heads * d_kv, num_layers // 2
    ffn = 2 * d_model * d_ff
    encoder_decoder = (half * (attn + ffn + 2 * d_model) + half * (2 * attn + ffn + 3 * d_model)
                       + 2 * d_model + 2 * num_buckets * num_heads)
    single_fixed = num_layers * (attn + 2 * d_model) + d_model + num_buckets * num_heads
    return round((encoder_decoder - single_fixed) / (2 * d_model * num_layers))


def build_model(objective: str, specials: Specials, d_model: int = 64, num_heads: int = 4,
                d_kv: int | None = None, num_layers: int = 4, d_ff: int = 256,
                dropout: float = 0.0) -> nn.Module:
    """The model of ``objective``: a :class:`T5` with ``num_layers / 2`` blocks per side for span
    corruption, else one :class:`T5StackLM` of ``num_layers`` blocks with :func:`matched_d_ff`."""
    _check_objective(objective)
    d_kv = d_kv or d_model // num_heads
    sizes = dict(d_model=d_model, d_kv=d_kv, num_heads=num_heads, dropout=dropout)
    if objective == "span corruption":
        if num_layers % 2:
            raise ValueError(f"num_layers must be even (half per side), got {num_layers}")
        return T5(specials.config(d_ff=d_ff, num_layers=num_layers // 2, **sizes))
    wide = matched_d_ff(d_model, num_heads, d_kv, num_layers, d_ff)
    return T5StackLM(specials.config(d_ff=wide, num_layers=num_layers, **sizes),
                     causal=objective == "causal LM")


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside the (shared, tied) token embedding."""
    shared = model.shared.weight
    return sum(p.numel() for p in model.parameters() if p is not shared)


# --------------------------------------------------------------------------- pretraining
def pretraining_batch(objective: str, raw: Tensor, specials: Specials, generator: torch.Generator | None,
                      noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[Tensor, Tensor]:
    """``(inputs, labels)`` from raw windows ``(B, L)``.

    masked LM: inputs ``(B, L)`` with 15 % of the tokens chosen (80/10/10), labels ``IGNORE``
    elsewhere; causal LM: ``raw[:, :-1]`` and ``raw[:, 1:]``; span corruption: T5's inputs and
    targets (``noise_density``, ``mean_span_length``).
    """
    _check_objective(objective)
    if objective == "causal LM":
        return raw[:, :-1], raw[:, 1:]
    if objective == "masked LM":
        never = [specials.pad, specials.mask] + specials.sentinels
        return mask_tokens(raw, torch.zeros_like(raw, dtype=torch.bool), specials.vocab_size,
                           specials.mask, noise_density, generator, special_ids=never)
    return span_corrupt_batch(raw, specials.sentinels, specials.eos, noise_density, mean_span_length,
                              generator)


def pretraining_loss(objective: str, model: nn.Module, batch: tuple[Tensor, Tensor],
                     specials: Specials, noise_density: float = 0.15) -> Tensor:
    """Mean cross-entropy (nats) over the positions the objective predicts (``noise_density``:
    the masked LM's rate, as given to :func:`pretraining_batch`)."""
    _check_objective(objective)
    inputs, labels = batch
    if objective == "span corruption":
        logits = model(inputs, shift_right(labels, specials.pad))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    if objective == "causal LM":
        return F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
    # masked LM: every row has the same number of chosen positions, known from the shape, so
    # they are gathered without a host sync (boolean indexing would wait for the GPU); the
    # output layer then runs on them only, as in BERT's code
    k = masked_per_row(labels.shape[1], noise_density)
    index = torch.argsort((labels == IGNORE).to(torch.uint8), dim=1, stable=True)[:, :k]  # (B, k)
    hidden = model.hidden(inputs).gather(1, index[..., None].expand(-1, -1, model.config.d_model))
    if model.config.rescale_output:
        hidden = hidden * model.config.d_model ** -0.5
    return F.cross_entropy(model.lm_head(hidden).flatten(0, 1), labels.gather(1, index).flatten())


def masked_per_row(length: int, p: float = 0.15) -> int:
    """How many of ``length`` ordinary tokens :func:`~tfm_course.data.mlm.mask_tokens` chooses:
    ``max(1, round(p · length))``, rounded in float32 as it does."""
    return int(torch.round(p * torch.tensor([length])).clamp(min=1, max=length))


def step_flops(objective: str, model: nn.Module, batch: tuple[Tensor, Tensor], specials: Specials,
               noise_density: float = 0.15) -> int:
    """Matmul FLOPs of one training step's forward and backward pass
    (:func:`tfm_course.experiments.measure.count_flops`); the gradients it leaves are zeroed."""
    flops = count_flops(lambda: pretraining_loss(objective, model, batch, specials,
                                                 noise_density).backward())
    model.zero_grad(set_to_none=True)
    return flops


# --------------------------------------------------------------------------- evaluation
def next_token_logits(objective: str, model: nn.Module, context: Tensor, specials: Specials) -> Tensor:
    """Each model's guess ``(B, vocab)`` of the token after ``context`` ``(B, n)``, asked its own way.

    causal LM: the last position's prediction; masked LM: a ``[MASK]`` appended to the context;
    span corruption: the context, ``<extra_id_0>`` and EOS as the input (T5's random masks end
    with a dropped span, so this is what pretraining showed it), the decoder fed ``<start>
    <extra_id_0>``: its next output is the first dropped token.
    """
    _check_objective(objective)
    column = context[:, :1]
    if objective == "causal LM":
        return model(context)[:, -1]
    if objective == "masked LM":
        return model(torch.cat([context, torch.full_like(column, specials.mask)], dim=1))[:, -1]
    sentinel = torch.full_like(column, specials.sentinels[0])
    inputs = torch.cat([context, sentinel, torch.full_like(column, specials.eos)], dim=1)
    decoder_inputs = torch.cat([torch.full_like(column, specials.pad), sentinel], dim=1)
    return model(inputs, decoder_inputs)[:, -1]


def mean_features(model: nn.Module, ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over the real tokens of the last hidden states ``(B, d_model)``: the encoder's for a
    :class:`T5`, the stack's for a :class:`T5StackLM`."""
    if attention_mask.dtype != torch.bool or attention_mask.shape != ids.shape:
        raise ValueError(f"attention_mask must be bool {tuple(ids.shape)}, got "
                         f"{tuple(attention_mask.shape)} {attention_mask.dtype}")
    if isinstance(model, T5):
        hidden = model.encode(ids, attention_mask)
    else:
        hidden = model.hidden(ids, attention_mask)
    weights = attention_mask[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)


# --------------------------------------------------------------------------- text to text
def docstring_kind_pairs(split: str, max_words: int = 24, balanced: bool = True,
                         seed: int = 0) -> list[tuple[str, str]]:
    """Chapter 7's corpus task, "is this the docstring of a class or of a function?", as
    ``(text, label)`` string pairs for text-to-text training.

    The examples and labels are :func:`tfm_course.data.docstring_tasks.class_or_function`'s:
    labels read from the syntax tree (``class`` or ``def``), the split the corpus's, by module;
    ``balanced`` keeps as many functions as there are classes (drawn with ``seed``), so always
    answering one label scores 0.5. Texts are cut to their first ``max_words`` words.
    """
    texts, labels = class_or_function(split, balance=balanced, seed=seed)
    return [(" ".join(text.split()[:max_words]), CLASS_OR_FUNCTION_LABELS[label])
            for text, label in zip(texts, labels)]


def encode_pairs(tokenizer, pairs: Sequence[tuple[str, str]], specials: Specials,
                 max_input_tokens: int = 48, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """``(inputs (B, S), targets (B, T))``: each text's tokens (cut to ``max_input_tokens - 1``) and
    EOS, each target's tokens and EOS, right-padded with ``specials.pad``."""
    if not pairs:
        raise ValueError("pairs is empty")
    inputs = [encode_text(tokenizer, x)[:max_input_tokens - 1] + [specials.eos] for x, _ in pairs]
    targets = [encode_text(tokenizer, y) + [specials.eos] for _, y in pairs]

    def pad(rows: list[list[int]]) -> Tensor:
        out = torch.full((len(rows), max(map(len, rows))), specials.pad, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, :len(row)] = torch.tensor(row)
        return out.to(device)

    return pad(inputs), pad(targets)


def ban(logits: Tensor, banned: Sequence[int]) -> Tensor:
    """``logits (..., vocab)`` with the ``banned`` ids set to ``-inf`` (none: unchanged)."""
    if not len(banned):
        return logits
    return logits.index_fill(-1, torch.tensor(list(banned), device=logits.device), float("-inf"))


def text_to_text_loss(model: T5, inputs: Tensor, targets: Tensor, specials: Specials,
                      banned: Sequence[int] = ()) -> Tensor:
    """Teacher-forced cross-entropy over the real target tokens (padding left out); the
    ``banned`` ids' logits are ``-inf`` first, so no probability is spent on them."""
    logits = ban(model(inputs, shift_right(targets, specials.pad), inputs != specials.pad), banned)
    labels = targets.masked_fill(targets == specials.pad, IGNORE)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def greedy(model: T5, inputs: Tensor, specials: Specials, max_new_tokens: int,
           banned: Sequence[int] = ()) -> Tensor:
    """Greedy outputs ``(n, L <= max_new_tokens)`` (EOS kept, pad after it) that never hold a
    ``banned`` id; with none banned, the same tokens as ``model.generate``."""
    if not len(banned):
        return model.generate(inputs, inputs != specials.pad, max_new_tokens=max_new_tokens)
    was_training = model.training
    model.eval()
    try:
        stepper = ban_tokens(model.stepper(inputs, True, inputs != specials.pad), banned)
        return greedy_search(stepper, inputs.shape[0], model.config.decoder_start_id, model.config.eos_id,
                             max_new_tokens, model.pad_id, inputs.device)
    finally:
        model.train(was_training)


@torch.no_grad()
def exact_match(model: T5, inputs: Tensor, targets: Tensor, specials: Specials,
                batch_size: int = 512, banned: Sequence[int] = ()) -> float:
    """Share of rows whose greedy output (never a ``banned`` id) equals the target up to and
    including its EOS."""
    hits = 0
    for start in range(0, inputs.shape[0], batch_size):
        x, y = inputs[start:start + batch_size], targets[start:start + batch_size]
        out = greedy(model, x, specials, y.shape[1], banned)  # pad after EOS
        padded = torch.full_like(y, specials.pad)
        padded[:, :out.shape[1]] = out
        hits += int((padded == y).all(1).sum())
    return hits / inputs.shape[0]
