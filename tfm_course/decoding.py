"""Turning a trained model into output sequences: greedy search, sampling and beam search.

Every search in this module talks to a model through one small object, a **stepper**; this module
imports no particular model. The interface (see :class:`Stepper`)::

    logits = stepper(prefix)   # prefix (N, t) long ids -> logits (N, V): the next token after each row
    stepper.reorder(index)     # index (N',) long: row i of the state becomes old row index[i]

A stepper promises nothing more, and may rely on three rules that every search here keeps:

1. **Calls come in order.** The first call sees the whole start of each row (``<bos>`` for an
   encoder-decoder, the prompt for a GPT); every later call sees the previous prefix with one or
   more tokens appended. So a cached stepper runs only ``prefix[:, seen:]`` through the model and
   keeps the keys and values of the rest; a stateless one may simply run the whole prefix.
2. **``reorder`` comes between calls** and applies to the *next* call's rows: beam search calls it
   after every step with the beams it keeps (``N' = N``); a caller may also use it to expand a
   batch (``N' > N``). A stateless stepper's ``reorder`` does nothing.
3. **The stepper guards its model's limits:** a prefix longer than the model's positions
   (``max_len``) raises ``ValueError``, never a silent wrap-around.

A stepper never picks tokens and never switches ``train()``/``eval()``: that is the searches' job.
Any plain function ``prefix -> logits`` works wherever no ``reorder`` is needed (greedy, sampling).

Models build their own steppers, in their own modules (``tfm_course.models.*``):

* an encoder-decoder (``models.transformer.Transformer``, ``models.t5``) offers
  ``model.stepper(src, use_cache=True)`` and ``model.pad_id``; :func:`greedy_decode` and
  :func:`beam_decode` use only these two, so every encoder-decoder decodes through them;
* a decoder-only model (``models.gpt.GPT``) offers ``model.stepper(use_cache=True)``;
  its ``generate`` calls :func:`generate` here.

``use_cache=False`` gives the *recompute* stepper (the whole prefix through the model at every
step), ``use_cache=True`` the **KV cache** (each layer keeps its keys and values, and only the new
tokens go through). The two must give identical tokens; the tests assert it with ``torch.equal``.

The searches: :func:`generate` (greedy with ``temperature=0``, else sampling with temperature,
top-k, top-p and min-p), :func:`greedy_search` (from ``<bos>``, for encoder-decoders) and
:func:`beam_search` (K live hypotheses plus a list of finished ones, as fairseq and Hugging Face do).
:func:`sample`, :func:`top_k_filter`, :func:`top_p_filter` and :func:`min_p_filter` turn logits
into a token.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

__all__ = ["Stepper", "top_k_filter", "top_p_filter", "min_p_filter", "sample", "generate",
           "greedy_search", "length_penalty", "beam_search", "ban_tokens", "greedy_decode",
           "beam_decode"]


class Stepper(Protocol):
    """``stepper(prefix (N, t)) -> logits (N, V)``; ``reorder(index (N',))``: the module docstring."""

    def __call__(self, prefix: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


def _checks_every(device: torch.device) -> int:
    """Steps between two looks at "has every row finished?".

    Reading a flag computed on a GPU makes the CPU wait for all queued work (a host sync), which
    stalls a decoding loop if done at every step; on the CPU it costs nothing. A late look only
    wastes a few steps on finished rows, which get padding and are trimmed away.
    """
    return 1 if device.type == "cpu" else 8


def _check_logits(logits: Tensor, rows: int, what: str = "batch") -> None:
    if logits.dim() != 2 or logits.shape[0] != rows:
        raise ValueError(f"the stepper must return ({what}={rows}, V) logits, got {tuple(logits.shape)}")


def _trim_after_eos(tokens: Tensor, eos_id: int) -> Tensor:
    """Drop the trailing columns after the last row's first ``<eos>`` (one host sync, at the end)."""
    if tokens.shape[1] == 0:
        return tokens
    is_eos = tokens == eos_id
    end = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, tokens.shape[1])  # (B,)
    return tokens[:, :int(end.max())]


# --------------------------------------------------------------------------- logits -> a token
def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row and set the others to ``-inf``: ``(..., V)``.

    ``k >= V`` keeps everything. Ties at the k-th value are broken by ``topk``, so exactly ``k``
    stay.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {k!r}")
    if k >= logits.shape[-1]:
        return logits
    values, index = logits.topk(k, dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, index, values)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most likely tokens whose
    probability reaches ``p``, set the others to ``-inf``: ``(..., V) -> (..., V)``.

    A token stays when the tokens ranked above it hold less than ``p`` of the probability, so the
    most likely token always stays and ``p = 1`` keeps every token of non-zero probability.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs  # (..., V): probability of the better-ranked tokens
    drop_sorted = mass_above >= p
    drop_sorted[..., 0] = False  # rounding must never empty a row
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: Tensor, p: float) -> Tensor:
    """Min-p filtering (Nguyen et al., 2024): keep the tokens whose probability is at least ``p``
    times the most likely token's, set the others to ``-inf``: ``(..., V) -> (..., V)``.

    The cut scales with the model's confidence: a peaked distribution keeps few tokens, a flat one
    many. The most likely token always stays; ``p = 1`` keeps only it (and its ties). Same rule as
    Hugging Face's ``MinPLogitsWarper`` (probabilities from a softmax of the logits as given, so
    apply the temperature first); on paper, ``logit >= max logit + log p``.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"min_p must be a number in (0, 1], got {p!r}")
    probs = logits.float().softmax(dim=-1)
    drop = probs < p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(drop, float("-inf"))


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None,
                    min_p: float | None = None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        top_k_filter(torch.zeros(1, 1), top_k)  # raises with the message
    if top_p is not None:
        top_p_filter(torch.zeros(1, 1), top_p)
    if min_p is not None:
        min_p_filter(torch.zeros(1, 1), min_p)


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None,
           min_p: float | None = None) -> Tensor:
    """One token per row of ``logits (N, V)``: returns ``(N,)`` long.

    Divides the logits by ``temperature``, keeps the ``top_k`` best, then the top-p nucleus, then
    the min-p set, and draws from the softmax of what is left (the order Hugging Face uses; top-k
    does not depend on the temperature, top-p and min-p do). ``temperature=0`` is the limit of
    that: the argmax, i.e. greedy. ``generator`` (on the logits' device) makes the draw
    reproducible.
    """
    _check_sampling(temperature, top_k, top_p, min_p)
    if logits.dim() != 2:
        raise ValueError(f"logits must be (N, V), got {tuple(logits.shape)}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


# --------------------------------------------------------------------------- searches
def generate(stepper: Callable[[Tensor], Tensor], prompt: Tensor, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_id: int | None = None,
             pad_id: int = 0, min_p: float | None = None) -> Tensor:
    """Extend ``prompt (B, t0)`` by up to ``max_new_tokens``: returns ``(B, t0 + n)``, n <= max_new_tokens.

    Each step asks the stepper for the next-token logits of every row and picks a token with
    :func:`sample` (``temperature=0``: greedy). With ``eos_id`` a row that has produced ``<eos>``
    is finished: it gets ``pad_id`` afterwards, and generation stops once every row has finished.
    """
    if prompt.dim() != 2 or prompt.shape[1] == 0 or prompt.is_floating_point():
        raise ValueError(f"prompt must be integer ids (batch, t0) with t0 >= 1, got "
                         f"{tuple(prompt.shape)} {prompt.dtype}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    _check_sampling(temperature, top_k, top_p, min_p)
    batch, every = prompt.shape[0], _checks_every(prompt.device)
    seq = prompt
    done = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
    for step in range(max_new_tokens):
        logits = stepper(seq)
        _check_logits(logits, batch)
        token = sample(logits, temperature, top_k, top_p, generator, min_p)
        if eos_id is not None:
            token = token.masked_fill(done, pad_id)
            done = done | (token == eos_id)
        seq = torch.cat([seq, token[:, None]], dim=1)
        if eos_id is not None and (step + 1) % every == 0 and bool(done.all()):
            break
    if eos_id is None:
        return seq
    return torch.cat([prompt, _trim_after_eos(seq[:, prompt.shape[1]:], eos_id)], dim=1)


def greedy_search(next_logits: Callable[[Tensor], Tensor], batch_size: int, bos_id: int,
                  eos_id: int, max_len: int, pad_id: int = 0,
                  device: torch.device | str | None = None) -> Tensor:
    """Pick the most likely token at every step, starting from ``<bos>``: returns ``(batch, L)``.

    ``next_logits(prefix (batch, t)) -> (batch, V)`` is a stepper (or any such function). The
    output holds the generated tokens (no ``<bos>``), ``<eos>`` included and ``pad_id`` after it,
    with ``L <= max_len``; it stops once every sequence has produced ``<eos>``.
    """
    if batch_size <= 0 or max_len <= 0:
        raise ValueError(f"batch_size and max_len must be positive, got {batch_size}, {max_len}")
    start = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)
    return generate(next_logits, start, max_len, temperature=0.0, eos_id=eos_id, pad_id=pad_id)[:, 1:]


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^α. Beam search ranks by log p(Y) / lp(Y)."""
    length = length.float() if isinstance(length, Tensor) else float(length)
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(stepper: Stepper, batch_size: int, beam_size: int, bos_id: int, eos_id: int,
                max_len: int, alpha: float = 0.6, pad_id: int = 0,
                device: torch.device | str | None = None,
                prompt: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Beam search: ``beam_size`` (K) live hypotheses per example plus a list of finished ones.

    The stepper is built for the ``batch_size`` (B) examples; beam search expands each into K rows
    with ``stepper.reorder`` (example-major: rows ``b*K … b*K+K-1`` are the beams of example ``b``)
    and reorders again after every step. Each step:

    1. extends every live hypothesis by every token (K·V candidates per example, scored by their
       summed log-probability) and takes the best 2K;
    2. a candidate among the best K that ends in ``<eos>`` joins the example's finished list,
       ranked by its length-normalised score log p / lp(|Y|) (:func:`length_penalty`; ``alpha=0``
       is the plain sum); the list keeps the K best;
    3. the K best candidates that do *not* end in ``<eos>`` become the live hypotheses, so the
       beam never narrows (at most K of the best 2K end in ``<eos>``, one per live hypothesis).

    An example is closed once its list holds K hypotheses and no live one can still beat the worst
    of them: a summed log-probability only falls as a hypothesis grows, so its best possible score
    is its sum now over the most favourable lp up to ``max_len`` (Hugging Face's default compares
    at the current length instead, a heuristic when α > 0). Hypotheses still live at ``max_len``
    compete as they are. fairseq's ``SequenceGenerator`` and Hugging Face's beam search keep live
    and finished hypotheses apart in the same way.

    ``prompt`` ``(B, t0)`` replaces the single ``<bos>`` start. Returns the best hypothesis of each
    example ``(B, L)``, ``L <= max_len`` (the generated tokens: no start, ``<eos>`` included,
    ``pad_id`` after it), and its normalised log-probability ``(B,)``.
    """
    if beam_size <= 0 or batch_size <= 0 or max_len <= 0:
        raise ValueError(f"batch_size, beam_size and max_len must be positive, got "
                         f"{batch_size}, {beam_size}, {max_len}")
    if not callable(getattr(stepper, "reorder", None)):
        raise ValueError("beam search needs a stepper with a reorder(index) method")
    B, K = batch_size, beam_size
    if prompt is None:
        prompt = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    if prompt.dim() != 2 or prompt.shape[0] != B:
        raise ValueError(f"prompt must be (batch={B}, t0), got {tuple(prompt.shape)}")
    device, t0 = prompt.device, prompt.shape[1]
    offsets = torch.arange(B, device=device)[:, None] * K  # (B, 1): first row of each example
    expand = torch.arange(B, device=device).repeat_interleave(K)
    stepper.reorder(expand)
    prefix = prompt[expand]  # (B*K, t0)
    live_sum = torch.zeros(B, K, device=device)
    live_sum[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    fin_tokens = torch.full((B, K, max_len), pad_id, dtype=torch.long, device=device)
    fin_score = torch.full((B, K), float("-inf"), device=device)
    closed = torch.zeros(B, dtype=torch.bool, device=device)
    every = _checks_every(device)
    for step in range(max_len):
        length = step + 1  # tokens generated, counting this one
        logits = stepper(prefix)
        _check_logits(logits, B * K, "batch*beam")
        V = logits.shape[-1]
        logp = torch.log_softmax(logits.float(), dim=-1).view(B, K, V)
        cand_sum, cand = (live_sum[..., None] + logp).view(B, K * V).topk(min(2 * K, K * V), dim=1)
        rows, token = cand // V + offsets, cand % V  # (B, 2K), best first
        ends = token == eos_id
        # 2. finished hypotheses: <eos> among the best K candidates, of examples still open
        rank = torch.arange(cand.shape[1], device=device)
        joins = ends & (rank < K) & ~closed[:, None] & (cand_sum > float("-inf"))
        score = (cand_sum / length_penalty(length, alpha)).masked_fill(~joins, float("-inf"))
        tokens = torch.cat([prefix[:, t0:][rows], token[..., None]], dim=-1)  # (B, 2K, length)
        tokens = torch.nn.functional.pad(tokens, (0, max_len - length), value=pad_id)
        fin_score, keep = torch.cat([fin_score, score], dim=1).topk(K, dim=1)
        fin_tokens = torch.cat([fin_tokens, tokens], dim=1).gather(
            1, keep[..., None].expand(B, K, max_len))
        # 3. live hypotheses: the K best candidates that go on
        live_sum, pick = cand_sum.masked_fill(ends, float("-inf")).topk(K, dim=1)
        rows = rows.gather(1, pick).view(-1)
        stepper.reorder(rows)
        prefix = torch.cat([prefix[rows], token.gather(1, pick).view(-1, 1)], dim=1)
        best_lp = max(length_penalty(length, alpha), length_penalty(max_len, alpha))
        closed = closed | (live_sum[:, 0] / best_lp <= fin_score[:, -1])
        if (step + 1) % every == 0 and bool(closed.all()):
            break
    # hypotheses of open examples still live at max_len compete as they are
    steps = prefix.shape[1] - t0
    live_score = (live_sum / length_penalty(steps, alpha)).masked_fill(closed[:, None], float("-inf"))
    live_tokens = torch.nn.functional.pad(prefix[:, t0:], (0, max_len - steps), value=pad_id)
    pool_score = torch.cat([fin_score, live_score], dim=1)  # (B, 2K)
    pool_tokens = torch.cat([fin_tokens, live_tokens.view(B, K, max_len)], dim=1)
    best_score, best = pool_score.max(dim=1)
    best_tokens = pool_tokens[torch.arange(B, device=device), best]  # (B, max_len)
    return _trim_after_eos(best_tokens, eos_id), best_score


# --------------------------------------------------------------------------- for a model
class _Banned:
    """A stepper whose logits for some tokens are always ``-inf``."""

    def __init__(self, stepper: Stepper, token_ids: Sequence[int]) -> None:
        self.stepper, self.token_ids = stepper, torch.tensor(sorted(set(token_ids)), dtype=torch.long)

    def __call__(self, prefix: Tensor) -> Tensor:
        logits = self.stepper(prefix)
        return logits.index_fill(-1, self.token_ids.to(logits.device), float("-inf"))

    def reorder(self, index: Tensor) -> None:
        self.stepper.reorder(index)


def ban_tokens(stepper: Stepper, token_ids: Sequence[int]) -> Stepper:
    """Wrap a stepper so that it never proposes ``token_ids`` (e.g. ``<pad>``, ``<bos>``)."""
    return _Banned(stepper, token_ids)


@torch.no_grad()
def greedy_decode(model, src: Tensor, bos_id: int, eos_id: int, max_len: int,
                  use_cache: bool = True) -> Tensor:
    """Greedy outputs ``(B, L)`` of an encoder-decoder for ``src`` ``(B, S)``.

    ``model`` is any encoder-decoder with ``model.stepper(src, use_cache)`` and ``model.pad_id``
    (the module docstring); ``<pad>`` and ``<bos>`` are never proposed. The model runs in
    ``eval()`` mode and gets its training flag back afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        stepper = ban_tokens(model.stepper(src, use_cache=use_cache), (model.pad_id, bos_id))
        return greedy_search(stepper, src.shape[0], bos_id, eos_id, max_len, model.pad_id, src.device)
    finally:
        model.train(was_training)


@torch.no_grad()
def beam_decode(model, src: Tensor, bos_id: int, eos_id: int, max_len: int, beam_size: int = 4,
                alpha: float = 0.6, use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """Beam-search outputs ``(B, L)`` of an encoder-decoder for ``src`` and their normalised
    log-probabilities ``(B,)``; same model interface as :func:`greedy_decode`."""
    was_training = model.training
    model.eval()
    try:
        stepper = ban_tokens(model.stepper(src, use_cache=use_cache), (model.pad_id, bos_id))
        return beam_search(stepper, src.shape[0], beam_size, bos_id, eos_id, max_len, alpha,
                           model.pad_id, src.device)
    finally:
        model.train(was_training)
