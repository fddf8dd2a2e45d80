"""Chapter 8's sampling study: what a decoding rule draws from, how real text scores under it, and
how repetitive the text it writes is.

    rule = dict(temperature=1.0, top_p=0.9)       # the keywords of decoding.sample
    tokens, (entropy, log2p) = generate_measured(model, prompts, 40, rule)   # (N, 40), (N, 40) x 2
    bpb, drawable = validation_under(logits, targets, token_bytes, lambda z: rule_logits(z, **rule))
    tau = calibrated_temperature(logits, targets)  # the temperature that explains real text best
    beam = beam_continuations(model, prompts, 40)  # the other maximiser, next to greedy
    text_stats(tokens)                              # distinct-2, rep-4, loops, repeated suffix

``model`` is a decoder-only LM like :class:`tfm_course.models.gpt.GPT`: ``model(ids (N, t))``
returns ``(logits (N, t, V), loss)``, ``model.stepper(use_cache=True)`` is its decoding interface
(:mod:`tfm_course.decoding`) and ``model.config.max_len`` its number of positions. Entropies and
log-probabilities are in bits.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Sequence

import torch
from torch import Tensor

from ..decoding import (_check_sampling, beam_search, min_p_filter, sample, top_k_filter,
                        top_p_filter)

__all__ = ["rule_logits", "entropy_bits", "generate_measured", "continuation_log2probs",
           "beam_continuations", "validation_under", "calibrated_temperature", "distinct_n",
           "rep_n", "ends_in_loop", "longest_repeated_suffix", "text_stats"]

LN2 = math.log(2)
RULE_KEYS = ("temperature", "top_k", "top_p", "min_p")


# --------------------------------------------------------------------------- rules
def rule_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, min_p: float | None = None) -> Tensor:
    """The logits a rule draws from, ``(..., V) -> (..., V)`` in fp32, built as
    :func:`tfm_course.decoding.sample` builds them: divide by the temperature, then top-k, top-p,
    min-p. Greedy (``temperature=0``) keeps only the argmax (and its ties)."""
    _check_sampling(temperature, top_k, top_p, min_p)
    if logits.dim() < 1:
        raise ValueError("logits must be (..., V), got a scalar")
    logits = logits.float()
    if temperature == 0:
        return logits.masked_fill(logits < logits.amax(-1, keepdim=True), float("-inf"))
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits if min_p is None else min_p_filter(logits, min_p)


def entropy_bits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` in bits, ``(..., V) -> (...)``; ``-inf`` logits count 0."""
    logp = logits.float().log_softmax(-1)
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1) / LN2


def _rule(rule: dict) -> dict:
    """All four keywords, checked: ``temperature`` defaults to 1, the filters to off."""
    if not isinstance(rule, dict) or set(rule) - set(RULE_KEYS):
        raise ValueError(f"a rule is a dict with keys among {RULE_KEYS}, got {rule!r}")
    rule = {"temperature": 1.0, "top_k": None, "top_p": None, "min_p": None, **rule}
    _check_sampling(**rule)
    return rule


def _check_prompts(model, prompts: Tensor, new_tokens: int) -> None:
    if prompts.dim() != 2 or prompts.shape[1] == 0 or prompts.is_floating_point():
        raise ValueError(f"prompts must be integer ids (N, t0) with t0 >= 1, got "
                         f"{tuple(prompts.shape)} {prompts.dtype}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens must be an integer >= 1, got {new_tokens!r}")
    if prompts.shape[1] + new_tokens > model.config.max_len:
        raise ValueError(f"the prompts ({prompts.shape[1]} tokens) plus new_tokens ({new_tokens}) "
                         f"exceed max_len {model.config.max_len}")


@contextmanager
def _evaluating(model):
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------- generation
def generate_measured(model, prompts: Tensor, new_tokens: int, rule: dict,
                      seed: int = 0) -> tuple[Tensor, Tensor]:
    """``GPT.generate``'s loop (the KV-cache stepper, then ``decoding.sample``), keeping what each
    step drew from. ``prompts`` ``(N, t0)``; ``rule`` a dict of :data:`RULE_KEYS`.

    Returns the continuations ``(N, new_tokens)`` (the same tokens as ``model.generate(prompts,
    new_tokens, generator=torch.Generator(device).manual_seed(seed), **rule)``) and ``(2, N,
    new_tokens)``: per step, the entropy of the rule's distribution and the model's log2-prob of
    the drawn token.
    """
    rule = _rule(rule)
    _check_prompts(model, prompts, new_tokens)
    generator = torch.Generator(prompts.device).manual_seed(seed)
    with _evaluating(model):
        stepper, seq, stats = model.stepper(use_cache=True), prompts, []
        for _ in range(new_tokens):
            logits = stepper(seq).float()  # (N, V)
            drawn_from = rule_logits(logits, **rule)
            # sample(logits, **rule) would build drawn_from again: draw from it directly (same draw)
            token = (drawn_from.argmax(-1) if rule["temperature"] == 0
                     else sample(drawn_from, generator=generator))
            log2p = logits.log_softmax(-1).gather(-1, token[:, None])[:, 0] / LN2
            stats.append(torch.stack([entropy_bits(drawn_from), log2p]))
            seq = torch.cat([seq, token[:, None]], dim=1)
    return seq[:, prompts.shape[1]:], torch.stack(stats, -1)


def continuation_log2probs(model, prompts: Tensor, tokens: Tensor) -> Tensor:
    """The model's log2-prob of each continuation token, ``(N, t0), (N, n) -> (N, n)``, in one
    pass over the whole rows (real text, or what any rule wrote)."""
    if (tokens.dim() != 2 or tokens.shape[0] != prompts.shape[0] or tokens.shape[1] == 0
            or tokens.is_floating_point()):
        raise ValueError(f"tokens must be integer ids (N={prompts.shape[0]}, n >= 1), got "
                         f"{tuple(tokens.shape)} {tokens.dtype}")
    _check_prompts(model, prompts, tokens.shape[1])
    t0 = prompts.shape[1]
    with _evaluating(model):
        logits = model(torch.cat([prompts, tokens], dim=1)[:, :-1])[0][:, t0 - 1:]  # (N, n, V)
    return logits.float().log_softmax(-1).gather(-1, tokens[..., None])[..., 0] / LN2


def beam_continuations(model, prompts: Tensor, new_tokens: int, beam_size: int = 4) -> Tensor:
    """Beam search from each prompt, the other maximiser next to greedy: ``(N, new_tokens)``.

    :func:`tfm_course.decoding.beam_search` from the prompts, with no ``<eos>`` (id -1, which no
    token has) and no length penalty (``alpha=0``): every hypothesis has ``new_tokens`` tokens and
    the highest summed log-probability among the ``beam_size`` kept at each step wins.
    """
    _check_prompts(model, prompts, new_tokens)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    with _evaluating(model):
        tokens, _ = beam_search(model.stepper(use_cache=True), prompts.shape[0], beam_size,
                                bos_id=-1, eos_id=-1, max_len=new_tokens, alpha=0.0,
                                prompt=prompts)
    return tokens


# --------------------------------------------------------------------------- real text
def _check_scored(logits: Tensor, targets: Tensor) -> None:
    if logits.dim() < 2 or targets.shape != logits.shape[:-1] or targets.is_floating_point():
        raise ValueError(f"logits (..., V) and integer targets (...) must match, got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)} {targets.dtype}")


def validation_under(logits: Tensor, targets: Tensor, token_bytes: Tensor,
                     transform: Callable[[Tensor], Tensor], chunk: int = 16) -> tuple[float, float]:
    """How well a rule's distribution explains real text: ``(bits per byte, drawable share)``.

    ``logits`` ``(n, T, V)``, the model's on real text, computed once; ``targets`` ``(n, T)`` its
    next tokens; ``token_bytes`` ``(V,)`` the bytes of each token; ``transform`` maps logits to
    the rule's, e.g. ``lambda z: rule_logits(z, top_p=0.9)``. Bits per byte are the targets'
    -log2 probability under ``softmax(transform(logits))`` over their bytes (``inf`` once a target
    is undrawable); the share counts targets of non-zero probability. ``chunk`` rows at a time.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (n, T, V), got {tuple(logits.shape)}")
    _check_scored(logits, targets)
    if token_bytes.shape != (logits.shape[-1],):
        raise ValueError(f"token_bytes must be (V={logits.shape[-1]},), got "
                         f"{tuple(token_bytes.shape)}")
    bits, drawable = 0.0, 0
    for z, y in zip(logits.split(chunk), targets.split(chunk)):
        ruled = transform(z)
        if ruled.shape != z.shape:
            raise ValueError(f"transform must keep the shape {tuple(z.shape)}, got "
                             f"{tuple(ruled.shape)}")
        logp = ruled.float().log_softmax(-1).gather(-1, y[..., None])
        bits -= logp.sum().item() / LN2
        drawable += torch.isfinite(logp).sum().item()
    n_bytes = token_bytes.to(targets.device)[targets].sum().item()
    return bits / n_bytes, drawable / targets.numel()


def calibrated_temperature(logits: Tensor, targets: Tensor, lo: float = 0.25, hi: float = 4.0,
                           tol: float = 1e-3) -> float:
    """The temperature τ in ``[lo, hi]`` that minimises the mean NLL of ``targets`` ``(...)``
    under ``softmax(logits / τ)``, ``logits`` ``(..., V)`` finite; found to within ``tol``.

    With β = 1/τ the NLL is ``mean(logsumexp(β z) - β z_y)``, convex in β: its slope is
    ``mean(E_softmax(βz)[z] - z_y)`` and its second derivative the mean variance of z under the
    softmax. Newton's method on β (fp64), kept inside a shrinking bracket where the slope changes
    sign (a bisection step whenever Newton would leave it), finds the one minimum in a few passes.
    τ = 1 means the model is calibrated on this text; a result at ``lo`` or ``hi`` means the
    minimum lies there or beyond.
    """
    _check_scored(logits, targets)
    if not 0 < lo < hi or not tol > 0:
        raise ValueError(f"need 0 < lo < hi and tol > 0, got lo={lo}, hi={hi}, tol={tol}")
    if not torch.isfinite(logits).all():
        raise ValueError("logits must be finite: calibrate the model, not a truncated rule")
    z, y = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, 2 ** 22 // z.shape[1])  # 32 MB of fp64 at a time

    def slope_and_curvature(beta: float) -> tuple[float, float]:
        slope = curvature = 0.0
        for zc, yc in zip(z.split(rows), y.split(rows)):
            zc = zc.double()
            p = (beta * zc).softmax(-1)
            mean = (p * zc).sum(-1)
            slope += (mean - zc.gather(-1, yc[:, None])[:, 0]).sum().item()
            curvature += ((p * zc * zc).sum(-1) - mean * mean).sum().item()
        return slope / y.numel(), curvature / y.numel()

    b_lo, b_hi = 1 / hi, 1 / lo
    for edge, sign in ((b_lo, 1), (b_hi, -1)):  # the minimum at or beyond an end of the range
        if sign * slope_and_curvature(edge)[0] >= 0:
            return 1 / edge
    beta = min(max(1.0, b_lo), b_hi)
    while True:
        slope, curvature = slope_and_curvature(beta)
        b_lo, b_hi = (b_lo, beta) if slope > 0 else (beta, b_hi)
        step = beta - slope / curvature if curvature > 0 else (b_lo + b_hi) / 2
        new = step if b_lo < step < b_hi else (b_lo + b_hi) / 2
        if abs(1 / new - 1 / beta) < tol / 10 or 1 / b_lo - 1 / b_hi < tol:
            return 1 / new
        beta = new


# --------------------------------------------------------------------------- text metrics
Rows = Sequence[Sequence[int]] | Tensor


def _rows(rows: Rows) -> list[list[int]]:
    if isinstance(rows, Tensor):
        if rows.dim() != 2:
            raise ValueError(f"rows must be (N, L) token ids, got {tuple(rows.shape)}")
        rows = rows.tolist()
    rows = [list(row) for row in rows]
    if not rows:
        raise ValueError("rows is empty")
    return rows


def _ngrams(row: Sequence[int], n: int) -> list[tuple[int, ...]]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return list(zip(*(row[i:] for i in range(n))))


def distinct_n(rows: Rows, n: int = 2) -> float:
    """Distinct n-grams over all n-grams of all rows (Li et al., 2016)."""
    grams = [g for row in _rows(rows) for g in _ngrams(row, n)]
    if not grams:
        raise ValueError(f"distinct_n needs a row of >= {n} tokens")
    return len(set(grams)) / len(grams)


def rep_n(rows: Rows, n: int = 4) -> float:
    """Welleck et al.'s seq-rep-n: per row, the share of its n-grams that repeat an earlier one,
    ``1 - #distinct / #all``; the mean over rows."""
    shares = []
    for row in _rows(rows):
        grams = _ngrams(row, n)
        if not grams:
            raise ValueError(f"rep_n needs rows of >= {n} tokens, got one of {len(row)}")
        shares.append(1 - len(set(grams)) / len(grams))
    return sum(shares) / len(shares)


def ends_in_loop(row: Sequence[int] | Tensor, window: int = 24, max_period: int = 12) -> bool:
    """Do the last ``window`` tokens repeat with a period ``p <= max_period`` (each equals the
    token p before it)? Blind to longer periods: see :func:`longest_repeated_suffix`."""
    row = row.tolist() if isinstance(row, Tensor) else list(row)
    return any(len(row) >= window + p and all(row[-i] == row[-i - p] for i in range(1, window + 1))
               for p in range(1, max_period + 1))


def longest_repeated_suffix(row: Sequence[int] | Tensor) -> int:
    """The length of the longest suffix of ``row`` that also occurs earlier in it (overlap
    allowed). A row that ends in k rounds of any loop, phrase loops included, scores at least
    (k - 1) times its period. Z-algorithm on the reversed row: O(len)."""
    r = (row.tolist() if isinstance(row, Tensor) else list(row))[::-1]
    z, left, right, best = [0] * len(r), 0, 0, 0
    for k in range(1, len(r)):  # z[k]: common prefix of r and r[k:] = a suffix, k tokens earlier
        if k < right:
            z[k] = min(right - k, z[k - left])
        while k + z[k] < len(r) and r[z[k]] == r[k + z[k]]:
            z[k] += 1
        if k + z[k] > right:
            left, right = k, k + z[k]
        best = max(best, z[k])
    return best


def text_stats(rows: Rows) -> dict:
    """``distinct2``, ``rep4``, ``loops`` (how many rows :func:`ends_in_loop`) and
    ``repeated_suffix`` (the mean over rows of :func:`longest_repeated_suffix` / row length)."""
    rows = _rows(rows)
    return dict(distinct2=distinct_n(rows, 2), rep4=rep_n(rows, 4),
                loops=sum(ends_in_loop(row) for row in rows),
                repeated_suffix=sum(longest_repeated_suffix(r) / len(r) for r in rows) / len(rows))
