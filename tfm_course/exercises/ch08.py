"""Checkers for chapter 8, "GPT".

>>> from tfm_course.exercises import ch08
>>> ch08.check_shifted_loss(my_loss)        # fn(logits (B, T, V), ids (B, T)) -> scalar loss
>>> ch08.check_temperature(my_probs)        # fn(logits (N, V), temperature) -> probabilities (N, V)
>>> ch08.check_top_p(my_top_p)              # fn(logits (N, V), p) -> logits, -inf outside the nucleus
>>> ch08.check_kv_cache_step(my_step)       # fn(attn, x (B, 1, d), cache) -> (out (B, 1, d), cache)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import MultiHeadAttention, merge_heads, split_heads
from ..decoding import top_p_filter
from ..models.transformer import attend_with_cache
from ._checking import Failed, attempt, close, expect_tensor, max_error, run_checks

__all__ = ["check_shifted_loss", "check_temperature", "check_top_p", "check_kv_cache_step"]


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _compare(got: Any, want: Tensor, mistakes: list[tuple[Callable[[], Tensor], str]], what: str,
             atol: float = 1e-5) -> None:
    """Pass if ``got`` ≈ ``want`` (``-inf`` where ``want`` has it); else name the mistake it repeats."""
    expect_tensor(got, want, what)
    got = got.detach().float().cpu()

    def same(a: Tensor, b: Tensor) -> bool:
        if a.shape != b.shape or not torch.equal(torch.isinf(a), torch.isinf(b)):
            return False
        finite = torch.isfinite(b)
        return bool(torch.equal(a[~finite], b[~finite])) and close(a[finite], b[finite], atol, atol)

    if same(got, want):
        return
    for make_wrong, message in mistakes:
        try:
            wrong = make_wrong()
        except RuntimeError:  # a mistake that does not apply to this case
            continue
        if same(got, wrong.float()):
            raise Failed(message)
    if torch.isnan(got).any():
        raise Failed(f"{what} contains NaN")
    raise Failed(f"{what} differs from the expected values by up to {max_error(got, want):.3g}")


# --------------------------------------------------------------------------- the shifted loss
def _ce(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def check_shifted_loss(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """``fn(logits, ids)``: the mean cross-entropy of predicting ``ids[:, t + 1]`` from
    ``logits[:, t]``, over every position that has a next token."""

    def case(B: int, T: int, V: int) -> Callable[[], None]:
        def check() -> None:
            g = _generator(B * T * V)
            logits, ids = 2 * torch.randn(B, T, V, generator=g), torch.randint(0, V, (B, T), generator=g)
            want = _ce(logits[:, :-1], ids[:, 1:])
            got = attempt(fn, logits.clone(), ids.clone())
            if isinstance(got, Tensor) and got.dim() > 0 and got.numel() > 1:
                raise Failed(f"return one number (the mean over positions), got shape {tuple(got.shape)}")
            got = got.reshape(()) if isinstance(got, Tensor) else got
            mistakes = [
                (lambda: _ce(logits, ids), "no shift: position t is scored on token t, which it can "
                 "see; its target is the *next* token — logits[:, :-1] against ids[:, 1:]"),
                (lambda: _ce(logits[:, 1:], ids[:, :-1]), "shifted the wrong way: the logits of "
                 "position t predict token t + 1 — logits[:, :-1] against ids[:, 1:]"),
                (lambda: _ce(logits, ids.roll(-1, dims=1)), "torch.roll wraps around: the last "
                 "position is scored on the *first* token; drop the last position instead"),
                (lambda: _ce(logits[:, :-1], ids[:, 1:]) * B * (T - 1),
                 "summed over positions: take the mean (F.cross_entropy's default)"),
                (lambda: -logits[:, :-1].gather(-1, ids[:, 1:, None]).mean(), "no log-softmax: "
                 "the loss is −log softmax(logits)[target], not −logits[target]"),
                (lambda: -logits[:, :-1].softmax(-1).gather(-1, ids[:, 1:, None]).mean(),
                 "you averaged −probabilities: the loss is −*log* softmax(logits)[target]"),
            ]
            _compare(got, want, mistakes, "the loss")
        return check

    return run_checks("shifted loss", [(f"B={B}, T={T}, V={V}", case(B, T, V))
                                       for B, T, V in ((2, 6, 7), (3, 9, 11), (1, 2, 5))])


# --------------------------------------------------------------------------- temperature
def check_temperature(fn: Callable[[Tensor, float], Tensor]) -> bool:
    """``fn(logits, temperature)``: softmax(logits / temperature) over the vocabulary; a
    temperature of 0 is the limit, all probability on the most likely token (greedy)."""

    def case(temperature: float) -> Callable[[], None]:
        def check() -> None:
            logits = 3 * torch.randn(4, 9, generator=_generator(int(10 * temperature)))
            if temperature == 0:
                want = F.one_hot(logits.argmax(-1), 9).float()
            else:
                want = (logits / temperature).softmax(-1)
            got = attempt(fn, logits.clone(), temperature)
            if temperature == 0 and isinstance(got, Tensor) and torch.isnan(got.float()).any():
                raise Failed("temperature 0 gives NaN (0/0): treat it as the limit T -> 0, all "
                             "probability on the argmax — check for 0 before dividing")
            t = temperature or 1.0
            mistakes = [
                (lambda: (logits * t).softmax(-1), "you multiplied the logits by the temperature: "
                 "divide — a high temperature must flatten the distribution"),
                (lambda: logits.softmax(-1) / t, "the temperature is applied after the softmax: "
                 "divide the *logits*, then take the softmax"),
                (lambda: logits.softmax(-1), "the temperature has no effect: softmax(logits / T)"),
                (lambda: (logits / t).softmax(0), "softmax over the wrong axis: normalise over the "
                 "vocabulary, the last axis (dim=-1)"),
                (lambda: logits / t, "these are logits: return probabilities, softmax(logits / T)"),
                (lambda: (logits / t).exp(), "not normalised: exp(logits / T) must be divided by "
                 "its sum over the vocabulary (softmax)"),
            ]
            _compare(got, want, mistakes, "the probabilities")
        return check

    return run_checks("temperature", [(f"temperature {t}", case(t)) for t in (1.0, 0.5, 2.0, 0.0)])


# --------------------------------------------------------------------------- top-p
def _top_p_cases() -> list[tuple[str, Tensor, float]]:
    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15], [0.05, 0.05, 0.6, 0.3]])
    g = _generator(3)
    return [("p = 0.3, below the top probability", probs.log(), 0.3),
            ("a small hand-made case, p = 0.7", probs.log(), 0.7),
            ("random logits (8, 20), p = 0.9", 2 * torch.randn(8, 20, generator=g), 0.9),
            ("random logits (5, 13), p = 0.5", 3 * torch.randn(5, 13, generator=g), 0.5)]


def _top_p_variant(logits: Tensor, p: float, *, inclusive: bool = True, sort: bool = True,
                   fill: float = float("-inf"), scatter: bool = True, of: str = "probs") -> Tensor:
    order = logits.argsort(-1, descending=True) if sort else torch.arange(logits.shape[-1]).expand_as(logits)
    ranked = logits.gather(-1, order)
    weights = ranked.softmax(-1) if of == "probs" else ranked
    cum = weights.cumsum(-1)
    drop = (cum - weights >= p) if inclusive else (cum > p)
    if not scatter:
        return ranked.masked_fill(drop, fill)
    return logits.masked_fill(drop.scatter(-1, order, drop), fill)


def check_top_p(fn: Callable[[Tensor, float], Tensor]) -> bool:
    """``fn(logits, p)``: keep the smallest set of most likely tokens whose probability reaches p
    (never empty), and set the other logits to ``-inf``."""

    def case(logits: Tensor, p: float) -> Callable[[], None]:
        def check() -> None:
            want = top_p_filter(logits, p)
            got = attempt(fn, logits.clone(), p)
            if isinstance(got, Tensor) and got.shape == logits.shape and torch.isinf(got).all(-1).any():
                raise Failed("a row has no token left: the most likely token must always stay "
                             "(it alone may already reach p)")
            mistakes = [
                (lambda: _top_p_variant(logits, p, inclusive=False), "the token that crosses p is "
                 "missing: keep tokens while the probability *before* them is below p, so the set "
                 "reaches p"),
                (lambda: _top_p_variant(logits, p, sort=False), "not sorted: accumulate the "
                 "probabilities from the most likely token down (sort in descending order first)"),
                (lambda: _top_p_variant(logits, p, of="logits"), "you accumulated logits: "
                 "accumulate probabilities, softmax(logits)"),
                (lambda: _top_p_variant(logits, p, scatter=False), "the output is in sorted order: "
                 "put each logit back at its token's position (scatter with the sort indices)"),
                (lambda: _top_p_variant(logits, p, fill=0.0), "removed tokens got 0, which is a "
                 "logit with real probability: set them to -inf"),
            ]
            _compare(got, want, mistakes, "the filtered logits")
        return check

    return run_checks("top-p", [(name, case(logits, p)) for name, logits, p in _top_p_cases()])


# --------------------------------------------------------------------------- a KV-cache step
def _attention_layer(seed: int, d: int, heads: int) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(d, heads).eval()


def _step_variant(attn: MultiHeadAttention, x: Tensor, cache, *, append: bool = True,
                  mask_first: bool = False, out_proj: bool = True, scale: bool = True):
    q, k, v = (split_heads(p(x), attn.num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    keys = k if cache is None else torch.cat([cache[0], k], dim=2)
    values = v if cache is None else torch.cat([cache[1], v], dim=2)
    read_k, read_v = (keys, values) if append or cache is None else cache
    scores = q @ read_k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    if mask_first:  # tril of a (1, t) mask keeps only the first key
        scores = scores.masked_fill(~torch.ones(1, read_k.shape[2], dtype=torch.bool).tril(), float("-inf"))
    out = merge_heads(scores.softmax(-1) @ read_v)
    return (attn.out_proj(out) if out_proj else out), (keys, values)


PACKAGE_STEPS = ("attend_with_cache", "step")  # the package's own cached steps


def _uses_package_step(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` is the package's ``attend_with_cache`` or names it (or a ``.step`` method)."""
    if fn is attend_with_cache:
        return True
    code = getattr(fn, "__code__", None)
    return code is not None and any(name in code.co_names for name in PACKAGE_STEPS)


def check_kv_cache_step(fn: Callable[..., tuple[Tensor, tuple[Tensor, Tensor]]]) -> bool:
    """``fn(attn, x, cache)``: one decoding step of causal self-attention with a KV cache.

    Write the step from ``attn``'s projections: an answer that calls the package's own
    ``attend_with_cache`` (or a ``.step`` method) is refused.

    ``attn`` is a :class:`~tfm_course.attention.MultiHeadAttention`, ``x`` ``(B, 1, d_model)``
    the newest token, ``cache`` ``None`` or ``(keys, values)`` of the earlier positions, each
    ``(B, heads, t, d_head)``. Return the attention output ``(B, 1, d_model)`` and the cache with
    the new key and value appended ``(B, heads, t + 1, d_head)``.
    """

    def case(seed: int, B: int, d: int, heads: int, steps: int,
             prefilled: int = 0) -> Callable[[], None]:
        def check() -> None:
            attn = _attention_layer(seed, d, heads)
            xs = torch.randn(B, prefilled + steps, d, generator=_generator(seed))
            with torch.no_grad():
                cache = attend_with_cache(attn, xs[:, :prefilled], None)[1] if prefilled else None
                for t in range(prefilled, prefilled + steps):
                    x = xs[:, t:t + 1]
                    want_out, want_cache = attend_with_cache(attn, x, cache)
                    got = attempt(fn, attn, x.clone(), cache)
                    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], tuple)):
                        raise Failed("return a pair: (output (B, 1, d_model), (keys, values))")
                    out, new_cache = got
                    mistakes = [
                        (lambda: _step_variant(attn, x, cache, append=False)[0], "the new token "
                         "does not attend to itself: append its key and value to the cache first, "
                         "then attend"),
                        (lambda: _step_variant(attn, x, cache, mask_first=True)[0], "a causal mask "
                         "hid cached keys: the newest query may read every earlier position, so a "
                         "single new token needs no mask"),
                        (lambda: _step_variant(attn, x, cache, out_proj=False)[0],
                         "the output projection is missing: finish with attn.out_proj"),
                        (lambda: _step_variant(attn, x, cache, scale=False)[0],
                         "the scores are not scaled by 1/√d_head"),
                    ]
                    _compare(out, want_out, mistakes, f"the output at position {t}", atol=1e-4)
                    if not (len(new_cache) == 2 and all(isinstance(c, Tensor) for c in new_cache)):
                        raise Failed("the cache must be a pair of tensors (keys, values)")
                    for got_c, want_c, name in zip(new_cache, want_cache, ("keys", "values")):
                        if cache is not None and got_c.shape == cache[0].shape:
                            raise Failed(f"the cached {name} did not grow at position {t}: return "
                                         "the cache with the new token's key and value appended")
                        if got_c.shape != want_c.shape:
                            raise Failed(f"after position {t} the cached {name} have shape "
                                         f"{tuple(got_c.shape)}, expected {tuple(want_c.shape)} "
                                         "= (B, heads, positions, d_head): keep them split into heads and append "
                                         "along the positions axis, dim 2")
                        if not close(got_c, want_c, 1e-5, 1e-5):
                            raise Failed(f"the cached {name} are wrong after position {t}: keep "
                                         "the earlier ones and append the new token's")
                    cache = new_cache
        return check

    def written_by_hand() -> None:
        if _uses_package_step(fn):
            raise Failed("your function calls the package's attend_with_cache (or a .step method), "
                         "which is the answer itself: project x with attn.q_proj, k_proj and v_proj, "
                         "append to the cache, attend, and apply attn.out_proj yourself")

    return run_checks("KV-cache step", [
        ("written by hand", written_by_hand),
        ("3 sequences, 4 heads, 3 cached positions, 3 steps", case(1, 3, 16, 4, 3, prefilled=3)),
        ("1 sequence, 2 heads, an empty cache, 4 steps", case(0, 1, 8, 2, 4)),
    ])
