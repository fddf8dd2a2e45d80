"""Checkers for chapter 2, "Where am I? Position information".

>>> from tfm_course.exercises import ch02
>>> ch02.check_sinusoidal(my_sinusoidal)   # fn(max_len, d_model) -> (max_len, d_model)
>>> ch02.check_rope(my_rope)               # fn(x) -> x rotated; x (batch, heads, seq, d_head)
>>> ch02.check_alibi(my_alibi)             # fn(num_heads, n) -> (1, num_heads, n, n)
>>> ch02.check_relative_bucket(my_bucket)  # fn(relative_position, bidirectional, num_buckets, max_distance)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from ..positional import RotaryEmbedding, alibi_bias, alibi_slopes, relative_position_bucket, sinusoidal_encoding
from ._checking import Failed, attempt, close, expect_tensor, max_error, run_checks

__all__ = ["check_sinusoidal", "check_rope", "check_alibi", "check_relative_bucket"]

Variants = list[tuple[Tensor, str]]


def _diagnose(got: Tensor, want: Tensor, variants: Variants, what: str, atol: float = 1e-4) -> None:
    """Pass if ``got`` matches ``want``; else name the first known mistake it matches, or the error."""
    got = got.detach().cpu()
    if close(got, want, atol=atol, rtol=atol):
        return
    for wrong, message in variants:
        if wrong.shape == got.shape and close(got, wrong, atol=atol, rtol=atol):
            raise Failed(message)
    raise Failed(f"{what} is off by up to {max_error(got, want):.3g} from the expected values")


# --------------------------------------------------------------------------- sinusoidal
def _sinusoidal_variants(max_len: int, d: int) -> Variants:
    p = torch.arange(max_len, dtype=torch.float64)[:, None]
    pair = torch.arange(d // 2, dtype=torch.float64)

    def table(omega_even: Tensor, omega_odd: Tensor, even=torch.sin, odd=torch.cos) -> Tensor:
        out = torch.empty(max_len, d, dtype=torch.float64)
        out[:, 0::2], out[:, 1::2] = even(p * omega_even), odd(p * omega_odd)
        return out

    omega = 10000.0 ** (-2 * pair / d)
    concat = torch.cat((torch.sin(p * omega), torch.cos(p * omega)), dim=-1)
    return [
        (table(omega, omega, torch.cos, torch.sin),
         "sin and cos are swapped: even dims 2i hold sin(p·ω_i), odd dims 2i+1 hold cos(p·ω_i) — "
         "check: PE(0) must be [0, 1, 0, 1, ...]"),
        (table(10000.0 ** (-pair / d), 10000.0 ** (-pair / d)),
         "the frequencies fall too slowly: the exponent is 2i/d_model with i the *pair* index "
         "(i = 0..d/2-1), not i/d_model"),
        (table(omega, 10000.0 ** (-(2 * pair + 1) / d)),
         "the cos dims use their own index in the exponent: dims 2i and 2i+1 share one "
         "frequency ω_i = 10000^(-2i/d_model)"),
        (concat,
         "you put all sines first and all cosines second ([sin | cos], the tensor2tensor layout); "
         "this book (like the paper) interleaves them: sin in dim 2i, cos in dim 2i+1"),
    ]


def check_sinusoidal(fn: Callable[[int, int], Tensor]) -> bool:
    """``fn(max_len, d_model)`` must return the ``(max_len, d_model)`` sinusoidal table (interleaved sin/cos)."""

    def case(max_len: int, d: int) -> Callable[[], None]:
        def check() -> None:
            want = sinusoidal_encoding(max_len, d).double()
            got = attempt(fn, max_len, d)
            if isinstance(got, Tensor) and got.shape == (d, max_len) and max_len != d:
                raise Failed(f"shape {tuple(got.shape)} is (d_model, max_len): one row per position, "
                             f"i.e. ({max_len}, {d})")
            expect_tensor(got, want, f"the table for max_len={max_len}, d_model={d}")
            if not got.is_floating_point():
                raise Failed(f"the table must be floating point, got dtype {got.dtype}")
            _diagnose(got, want, _sinusoidal_variants(max_len, d),
                      f"the table for max_len={max_len}, d_model={d}")
        return check

    return run_checks("sinusoidal encoding", [
        ("max_len 10, d_model 8", case(10, 8)),
        ("max_len 50, d_model 16", case(50, 16)),
        ("max_len 3, d_model 2", case(3, 2)),
    ])


# --------------------------------------------------------------------------- RoPE
def _rope_adjacent(x: Tensor, sign: float = 1.0, exponent_scale: float = 2.0, start: int = 0) -> Tensor:
    """Rotate adjacent pairs (2i, 2i+1) by ``sign · (p + start) · 10000^(-scale·i/d)``."""
    d = x.shape[-1]
    theta = 10000.0 ** (-exponent_scale * torch.arange(d // 2, dtype=torch.float64) / d)
    angle = sign * (torch.arange(x.shape[-2], dtype=torch.float64)[:, None] + start) * theta
    cos, sin = angle.cos(), angle.sin()
    x = x.double()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
    return out


def _halves(x: Tensor) -> Tensor:
    """Adjacent layout -> split-halves layout (features 0,2,4,... then 1,3,5,...)."""
    d = x.shape[-1]
    return x[..., torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))]


def _from_halves(x: Tensor) -> Tensor:
    d = x.shape[-1]
    return x[..., torch.argsort(torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2))))]


def _rope_halves(x: Tensor, **kwargs: float) -> Tensor:
    """The split-halves rotation, built from the adjacent one by the fixed permutation."""
    return _halves(_rope_adjacent(_from_halves(x), **kwargs))


def check_rope(fn: Callable[[Tensor], Tensor]) -> bool:
    """``fn(x)`` rotates ``x`` ``(batch, heads, seq, d_head)`` at positions 0..seq-1, split-halves pairs."""

    def case(shape: tuple[int, int, int, int], seed: int) -> Callable[[], None]:
        def check() -> None:
            x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
            want = RotaryEmbedding(shape[-1]).rotate(x).double()
            got = attempt(fn, x.clone())
            expect_tensor(got, want, f"the rotated tensor for x of shape {shape}")
            if got.dtype != x.dtype:
                raise Failed(f"the output has dtype {got.dtype}; keep the input's dtype {x.dtype}")
            variants = [
                (_rope_adjacent(x),
                 "you rotated adjacent pairs (x0, x1), (x2, x3), ... — the RoFormer paper's layout; "
                 "this exercise (like tfm_course, GPT-NeoX and HF Llama) pairs feature i with "
                 "feature i + d_head/2 (split halves)"),
                (_rope_halves(x, sign=-1.0),
                 "you rotated the wrong way (by −θ): out = x·cos + rotate_half(x)·sin with "
                 "rotate_half([x1, x2]) = [−x2, x1]"),
                (_rope_halves(x, exponent_scale=1.0),
                 "the frequencies fall too slowly: θ_i = 10000^(-2i/d_head) with i the pair index, "
                 "not 10000^(-i/d_head)"),
                (_rope_halves(x, start=1),
                 "positions start at 1: the first token sits at position 0 and is not rotated"),
                (_rope_halves(x.flip(-2)).flip(-2),
                 "positions run backwards: token t must be rotated by the angle t·θ"),
            ]
            if not close(got[..., 0, :].detach().cpu(), x[..., 0, :], atol=1e-5):
                for wrong, message in variants:
                    if close(got.detach().cpu(), wrong, atol=1e-4):
                        raise Failed(message)
                raise Failed("the token at position 0 changed: its angle is 0, so it must come "
                             "out unrotated")
            _diagnose(got, want, variants, f"the rotated tensor for shape {shape}")
        return check

    return run_checks("rotary embedding", [
        ("batch 2, heads 3, seq 5, d_head 8", case((2, 3, 5, 8), 0)),
        ("a long sequence, d_head 16", case((1, 2, 40, 16), 1)),
        ("d_head 2", case((1, 1, 6, 2), 2)),
    ])


# --------------------------------------------------------------------------- ALiBi
def _naive_slopes(h: int) -> Tensor:
    return torch.tensor([2.0 ** (-8.0 / h * i) for i in range(1, h + 1)])


def _bias_from(slopes: Tensor, n: int) -> Tensor:
    pos = torch.arange(n)
    return -(slopes[:, None, None].double() * (pos[:, None] - pos[None, :]).abs())[None]


def _causal_forms(got: Tensor, want: Tensor) -> None:
    """Recognise the paper's causal forms of ALiBi, which are right under a causal mask only.

    ``got`` and ``want`` are ``(1, heads, n, n)`` on the CPU; ``want`` is ``-slope · |i - j|``.
    """
    n = want.shape[-1]
    past = torch.ones(n, n, dtype=torch.bool).tril()  # keys j <= i, what a causal mask keeps
    got = got.double()
    if n < 2 or not torch.isfinite(got[..., past]).all():
        return
    symmetric = ("this exercise asks for the symmetric bias −slope·|i − j| at every (i, j), what "
                 "alibi_bias returns and what a model without a causal mask (an encoder) needs")
    if close(got[..., past], want[..., past], atol=1e-4, rtol=1e-4):
        future = got[..., ~past]
        if torch.isneginf(future).all():
            above = "−inf (the causal mask itself)"
        elif (future == 0).all():
            above = "zeros"
        else:
            above = "other values"
        raise Failed("on and below the diagonal (keys j ≤ i) your bias is the paper's causal form "
                     f"−slope·(i − j), and above it you put {above}. That is right inside a causal "
                     f"model, where future keys are masked anyway; but {symmetric}: fill the upper "
                     "triangle with −slope·(j − i) too, and leave the masking to the mask")
    gap = (got - want)[0]  # (heads, n, n)
    rows = [gap[:, i, : i + 1] - gap[:, i, :1] for i in range(n)]  # each row's gap minus its first
    if all(close(row, torch.zeros_like(row), atol=1e-4) for row in rows):
        raise Failed("on and below the diagonal your bias is −slope·(i − j) plus a constant in each "
                     "row — for instance slope·j, the key position alone, as in the ALiBi authors' "
                     "code. Under a causal mask the softmax ignores a per-row constant, so that "
                     f"model attends exactly like ALiBi; but {symmetric}")


def check_alibi(fn: Callable[[int, int], Tensor]) -> bool:
    """``fn(num_heads, n)`` must return ``-slope_h · |i - j|`` as ``(1, num_heads, n, n)``.

    The paper's causal forms (−slope·(i − j) with zeros or −inf above the diagonal, or the
    reference code's slope·j) are recognised and explained: right under a causal mask, but not
    the symmetric bias this exercise asks for.
    """

    def case(h: int, n: int) -> Callable[[], None]:
        def check() -> None:
            want = alibi_bias(h, n).double()
            got = attempt(fn, h, n)
            if isinstance(got, Tensor) and got.shape == want.shape[1:]:
                raise Failed(f"shape {tuple(got.shape)}: add a leading batch dim of 1, "
                             f"(1, heads, n, n) = {tuple(want.shape)}, so it broadcasts over the batch")
            if isinstance(got, Tensor) and got.shape == (1, h, 1, n) and got.is_floating_point():
                _causal_forms(got.detach().cpu().expand(1, h, n, n), want)  # slope·j, one row for all queries
            expect_tensor(got, want, f"the bias for {h} heads, n={n}")
            if not got.is_floating_point():
                raise Failed(f"the bias must be floating point, got dtype {got.dtype}")
            slopes = alibi_slopes(h)
            pos = torch.arange(n)
            signed = -(slopes[:, None, None].double() * (pos[:, None] - pos[None, :]))[None]
            variants = [
                (-want, "the sign is flipped: the bias must be ≤ 0 and fall with distance, "
                        "−slope·|i − j|, so that far keys are penalised, not favoured"),
                (_bias_from(slopes.flip(0), n),
                 "the slopes are in reverse order: head 1 has the steepest slope 2^(-8/h), "
                 "the last head the gentlest"),
                (_bias_from(torch.tensor([2.0 ** (-8.0 / h * i) for i in range(h)]), n),
                 "the slopes start one step too early: for h heads they are 2^(-8/h·i) for "
                 "i = 1..h, so the first is 2^(-8/h), not 1"),
                (signed, "above the diagonal your bias is positive: use the distance |i − j| "
                         "(future keys are penalised too, or masked in a causal model)"),
            ]
            if h & (h - 1):
                variants.append((
                    _bias_from(_naive_slopes(h), n),
                    f"{h} is not a power of 2: the paper takes the {2 ** int(math.log2(h))} slopes "
                    f"of {2 ** int(math.log2(h))} heads, then every other slope of "
                    f"{2 ** (int(math.log2(h)) + 1)} heads for the rest — not 2^(-8/{h}·i)"))
            if not close(got.detach().cpu(), want, atol=1e-4, rtol=1e-4):
                for wrong, message in variants:
                    if close(got.detach().cpu(), wrong, atol=1e-4, rtol=1e-4):
                        raise Failed(message)
                _causal_forms(got.detach().cpu(), want)
            _diagnose(got, want, variants, f"the bias for {h} heads, n={n}")
        return check

    return run_checks("ALiBi bias", [
        ("8 heads, n 5", case(8, 5)),
        ("4 heads, n 7", case(4, 7)),
        ("6 heads (not a power of 2), n 4", case(6, 4)),
        ("12 heads, n 3", case(12, 3)),
    ])


# --------------------------------------------------------------------------- T5 buckets
def check_relative_bucket(fn: Callable[[Tensor, bool, int, int], Tensor]) -> bool:
    """``fn(relative_position, bidirectional, num_buckets, max_distance)``: T5's bucket of key − query."""
    rel = torch.arange(-300, 301)

    def case(bidirectional: bool, num_buckets: int, max_distance: int) -> Callable[[], None]:
        def check() -> None:
            want = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
            got = attempt(fn, rel.clone(), bidirectional, num_buckets, max_distance)
            what = f"buckets (bidirectional={bidirectional}, num_buckets={num_buckets}, max_distance={max_distance})"
            expect_tensor(got, want, what)
            if got.is_floating_point():
                raise Failed(f"buckets index an embedding table: return integers (torch.long), got {got.dtype}")
            got = got.detach().cpu().long()
            if torch.equal(got, want):
                return
            half = num_buckets // 2 if bidirectional else num_buckets
            exact = half // 2
            if torch.equal(got, relative_position_bucket(-rel, bidirectional, num_buckets, max_distance)):
                raise Failed("the sign convention is reversed: relative_position = key position − "
                             "query position, so keys to the right are positive")
            if bidirectional and torch.equal(
                    got, relative_position_bucket(rel, True, 2 * num_buckets, max_distance)):
                raise Failed("bidirectional buckets are split in two halves: halve num_buckets first, "
                             "then keys to the right get the offset num_buckets/2")
            zero = rel == 0
            if bidirectional and torch.equal(got[~zero], want[~zero]) and int(got[zero]) == num_buckets // 2:
                raise Failed("the query's own position (relative position 0) went to the right-hand half: "
                             "only keys strictly to the right (relative position > 0) get the offset "
                             "num_buckets/2, so relative position 0 is bucket 0")
            if not bidirectional and torch.equal(got[rel <= 0], want[rel <= 0]) and bool((got[rel > 0] > 0).any()):
                raise Failed("causal buckets: keys to the right (relative position > 0) are future keys and "
                             "all share bucket 0 — the distance is max(−relative_position, 0), not its "
                             "absolute value")
            if int(got.max()) >= num_buckets:
                raise Failed(f"bucket {int(got.max())} does not exist (0..{num_buckets - 1}): clamp "
                             "the log-spaced buckets at the last one")
            far = rel.abs() >= exact
            if torch.equal(got[~far], want[~far]) and (got[far] - want[far]).abs().max() == 1:
                raise Failed("off by one in the log-spaced buckets: truncate (floor) the scaled log, "
                             "do not round it")
            if torch.equal(got[~far], want[~far]):
                raise Failed(f"distances below max_exact = {exact} are right, but larger ones should "
                             f"share buckets whose width grows logarithmically up to max_distance")
            first = int((got != want).nonzero()[0])
            raise Failed(f"relative position {int(rel[first])} got bucket {int(got[first])}, "
                         f"expected {int(want[first])}")
        return check

    return run_checks("relative position bucket", [
        ("bidirectional, 32 buckets, max_distance 128", case(True, 32, 128)),
        ("unidirectional, 32 buckets, max_distance 128", case(False, 32, 128)),
        ("bidirectional, 16 buckets, max_distance 40", case(True, 16, 40)),
    ])
