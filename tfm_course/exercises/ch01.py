"""Checkers for chapter 1, "Attention from first principles".

>>> from tfm_course.exercises import ch01
>>> ch01.check_causal_mask(my_causal_mask)        # fn(n) -> bool (n, n)
>>> ch01.check_padding_mask(my_padding_mask)      # fn(lengths, max_len) -> bool (batch, max_len)
>>> ch01.check_masked_softmax(my_masked_softmax)  # fn(scores, mask) -> weights
>>> ch01.check_scaled_dot_product_attention(my_attention)  # fn(q, k, v, mask=None) -> output

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..attention import causal_mask, masked_softmax, padding_mask, scaled_dot_product_attention
from ._checking import Failed, attempt, close, expect_tensor, run_checks, seeded

__all__ = [
    "check_causal_mask",
    "check_padding_mask",
    "check_masked_softmax",
    "check_scaled_dot_product_attention",
]

REVERSED = "mask convention reversed: True must mean may-attend (False = blocked)"
NAN_ROW = ("NaN on a fully masked row: a row of -inf scores gives softmax 0/0 — fill with "
           "torch.finfo(dtype).min and give rows with no allowed key zero weights")
UNIFORM_ROW = ("a fully masked row should give zeros, but yours spreads its weight evenly over the "
               "blocked keys (uniform 1/n_k) — zero the weights of rows that have no allowed key")
UNIFORM_OUT = ("a fully masked row should give zeros, but yours returns the average of the values "
               "(uniform weights) — zero the weights of rows that have no allowed key")
FP16_OVERFLOW = ("in float16 the fill value overflowed: -1e9 does not fit in fp16 (its largest "
                 "magnitude is 65504) — use torch.finfo(scores.dtype).min, or compute in float32")
USES_SDPA = ("your function calls PyTorch's F.scaled_dot_product_attention (or one of its fused "
             "kernels): this exercise asks you to write the maths yourself — q kᵀ / √d_k, the mask, "
             "the softmax over the keys, then the weighted sum of v")
FP16_SCORES_OVERFLOW = ("in float16, q @ kᵀ overflowed to inf before the division by √d_k (fp16's "
                        "largest value is 65504): scale q first, (q / √d_k) @ kᵀ, or compute the "
                        "scores in float32")
WRONG_AXIS = ("softmax over the wrong axis: normalise over the keys (the last dim), so that each "
              "query's weights sum to 1")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _expect_bool(got: Tensor, want: Tensor, what: str) -> None:
    if got.dtype != torch.bool:
        values = got.detach().cpu()
        same_pattern = values.shape == want.shape and bool(((values != 0) == want).all())
        hint = " (the pattern is right: add .bool() or build it with dtype=torch.bool)" if same_pattern else ""
        raise Failed(f"{what} must be a bool tensor (True = may attend), got dtype {got.dtype}{hint}")


def _rows_agree(got: Tensor, want: Tensor, rows: Tensor, atol: float) -> bool:
    """Close on the rows (..., n_q) where ``rows`` is True; other rows are ignored."""
    rows = rows.expand(got.shape[:-1])
    if not bool(rows.any()):
        return False
    return close(got[rows], want[rows], atol=atol, rtol=atol)


# --------------------------------------------------------------------------- causal mask
def check_causal_mask(fn: Callable[[int], Tensor]) -> bool:
    """``fn(n)`` must return the bool ``(n, n)`` mask with True where key j ≤ query i."""

    def case(n: int) -> Callable[[], None]:
        def check() -> None:
            want = causal_mask(n)
            got = attempt(fn, n)
            expect_tensor(got, want, f"causal mask for n={n}")
            _expect_bool(got, want, f"the causal mask for n={n}")
            got = got.cpu()
            if torch.equal(got, want):
                return
            if torch.equal(got, ~want):
                raise Failed(f"{REVERSED}; query i (row) may see keys 0..i (columns)")
            if torch.equal(got, want.T):
                raise Failed("transposed: this lets query i see the future keys i..n-1 — rows are "
                             "queries, columns are keys; keep the lower triangle (tril), not triu")
            if torch.equal(got, want & ~torch.eye(n, dtype=torch.bool)):
                raise Failed("the diagonal is missing: query i may attend to key i (itself); "
                             "with tril(-1) the first query has no key at all")
            wrong = (got != want).nonzero()[0].tolist()
            raise Failed(f"entry [query {wrong[0]}, key {wrong[1]}] is {bool(got[wrong[0], wrong[1]])}, "
                         f"expected {bool(want[wrong[0], wrong[1]])}: query i may attend keys 0..i")
        return check

    return run_checks("causal mask", [(f"n = {n}", case(n)) for n in (5, 1, 8)])


# --------------------------------------------------------------------------- padding mask
def check_padding_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """``fn(lengths, max_len)`` must return the bool ``(batch, max_len)`` mask, True on real tokens."""

    def case(lengths: list[int], max_len: int) -> Callable[[], None]:
        def check() -> None:
            lens = torch.tensor(lengths)
            want = padding_mask(lens, max_len)
            got = attempt(fn, lens.clone(), max_len)
            what = f"padding mask for lengths={lengths}, max_len={max_len}"
            if isinstance(got, Tensor) and got.shape != want.shape:
                if got.shape == want.T.shape and len(lengths) != max_len:
                    raise Failed(f"shape {tuple(got.shape)} is (max_len, batch): one row per "
                                 f"sequence, i.e. (batch, max_len) = {tuple(want.shape)}")
                if got.dim() == 2 and got.shape[0] == len(lengths) and got.shape[1] == max(lengths):
                    raise Failed(f"shape {tuple(got.shape)}: pad to max_len={max_len}, not to the "
                                 f"longest length {max(lengths)}")
                if got.numel() == want.numel():
                    raise Failed(f"shape {tuple(got.shape)}: return the plain (batch, max_len) = "
                                 f"{tuple(want.shape)} mask; broadcasting dims are added where it is used")
            expect_tensor(got, want, what)
            _expect_bool(got, want, f"the {what}")
            got = got.cpu()
            if torch.equal(got, want):
                return
            if torch.equal(got, ~want):
                raise Failed(f"{REVERSED}; real tokens are True, padding is False")
            if torch.equal(got, torch.arange(max_len) <= lens[:, None]):
                raise Failed("off by one: a sequence of length L has real tokens at positions "
                             "0..L-1 — compare with <, not <=")
            if torch.equal(got, torch.arange(max_len).flip(0) < lens[:, None]):
                raise Failed("the real tokens are at the end: this book pads on the right, so "
                             "positions 0..L-1 are real")
            row = int((got != want).any(-1).nonzero()[0])
            raise Failed(f"row {row} (length {lengths[row]}) is {got[row].int().tolist()}, "
                         f"expected {want[row].int().tolist()}")
        return check

    return run_checks("padding mask", [
        ("lengths [3, 1, 4], max_len 5", case([3, 1, 4], 5)),
        ("a full-length and an empty sequence", case([4, 0], 4)),
        ("a single sequence", case([2], 6)),
    ])


# --------------------------------------------------------------------------- masked softmax
def _masked_softmax_case(fn: Callable[[Tensor, Tensor], Tensor], scores: Tensor, mask: Tensor,
                         what: str) -> None:
    want = masked_softmax(scores, mask)
    got = attempt(_with_overflow_hint, fn, scores.clone(), mask.clone())
    expect_tensor(got, want, f"the weights ({what})")
    if got.dtype != scores.dtype:
        raise Failed(f"the weights have dtype {got.dtype}; keep the scores' dtype {scores.dtype}")
    atol = TOLERANCE[scores.dtype]
    got = got.float().cpu()
    empty = (~mask.any(-1)).expand(want.shape[:-1])  # (..., n_q): rows with no allowed key
    ok = ~empty
    if close(got, want, atol=atol, rtol=atol):
        return
    if _rows_agree(got, masked_softmax(scores, ~mask).float(), (~mask).any(-1), atol):
        raise Failed(REVERSED)
    if _rows_agree(got, torch.softmax(scores.float(), -1), ok, atol):
        raise Failed("the mask was ignored: blocked keys still get weight")
    if _rows_agree(got, torch.softmax(scores.float().masked_fill(~mask, -1e30), -2), ok, atol):
        raise Failed(WRONG_AXIS)
    if _rows_agree(got, want.float(), ok, atol):  # only the fully masked rows are wrong
        if bool(torch.isnan(got[empty]).any()):
            raise Failed(NAN_ROW)
        if close(got[empty], torch.full_like(got[empty], 1.0 / scores.shape[-1]), atol=atol):
            raise Failed(UNIFORM_ROW)
        raise Failed("rows with allowed keys are right, but a fully masked row is not all zeros")
    if bool(torch.isnan(got).any()):
        raise Failed(f"NaN in the weights of rows that have allowed keys ({what})")
    blocked = got.masked_select(~mask.expand(got.shape) & ok[..., None])
    if blocked.numel() and float(blocked.abs().max()) > atol:
        raise Failed(f"blocked keys get weight up to {float(blocked.abs().max()):.3g}: fill "
                     "masked scores with a very negative number before the softmax")
    sums = got.sum(-1)[ok]
    if not close(sums, torch.ones_like(sums), atol=atol):
        raise Failed(f"each row's weights must sum to 1 over the keys; yours sum to "
                     f"{float(sums.min()):.3g}..{float(sums.max()):.3g}")
    raise Failed(f"the weights differ from softmax over the allowed keys by up to "
                 f"{float((got - want.float()).abs().max()):.3g} ({what})")


def _with_overflow_hint(fn: Callable[..., Tensor], *args: Tensor) -> Tensor:
    try:
        return fn(*args)
    except RuntimeError as error:
        if "overflow" in str(error) and any(a.dtype == torch.float16 for a in args):
            raise RuntimeError(FP16_OVERFLOW) from None
        raise


def _unwrap_overflow(check: Callable[[], None]) -> Callable[[], None]:
    """Turn attempt()'s "your function raised RuntimeError: <fp16 hint>" into just the hint."""
    def wrapped() -> None:
        try:
            check()
        except Failed as problem:
            if FP16_OVERFLOW in str(problem):
                raise Failed(FP16_OVERFLOW) from None
            raise
    return wrapped


def check_masked_softmax(fn: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """``fn(scores, mask)``: softmax over the keys, zero weight on blocked keys, zero rows when all are blocked."""
    g = seeded(1)
    s2 = torch.randn(6, 6, generator=g) * 2
    causal = causal_mask(6)
    s4 = torch.randn(2, 3, 5, 7, generator=g) * 2
    pad = padding_mask(torch.tensor([7, 4]), 7)[:, None, None, :]  # (batch, 1, 1, n_k)
    holes = torch.rand(3, 5, generator=g) > 0.4
    holes[:, 0] = True
    holes[1] = False  # one query row with no allowed key
    s3 = torch.randn(2, 3, 5, generator=g) * 2

    def case(scores: Tensor, mask: Tensor, what: str) -> Callable[[], None]:
        return _unwrap_overflow(lambda: _masked_softmax_case(fn, scores, mask, what))

    return run_checks("masked softmax", [
        ("causal mask on (6, 6) scores", case(s2, causal, "causal mask")),
        ("key-padding mask (batch, 1, 1, n_k)", case(s4, pad, "key-padding mask")),
        ("a fully masked row", case(s3, holes, "a fully masked row")),
        ("float16 scores", case(s3.half(), holes, "float16")),
        ("bfloat16 scores", case(s4.bfloat16(), pad, "bfloat16")),
    ])


# --------------------------------------------------------------------------- attention
def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
          dim: int = -1) -> Tensor:
    """A variant of attention in fp32 (used to recognise typical mistakes)."""
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e30)
    return torch.softmax(scores, dim=dim) @ v.float()


_FUSED_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


class _SdpaCalls(TorchFunctionMode):
    """Records calls of ``F.scaled_dot_product_attention``, however it was imported."""

    def __init__(self) -> None:
        super().__init__()
        self.called = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if "scaled_dot_product_attention" in getattr(func, "__name__", ""):
            self.called = True
        return func(*args, **(kwargs or {}))


class _FusedKernels(TorchDispatchMode):
    """Records PyTorch's fused attention kernels (aten ops), also when a library calls them."""

    def __init__(self) -> None:
        super().__init__()
        self.called = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if any(name in str(func) for name in _FUSED_OPS):
            self.called = True
        return func(*args, **(kwargs or {}))


def _without_pytorch_sdpa(fn: Callable[..., Tensor], *args: Tensor) -> Tensor:
    """``fn(*args)``, failing if it used PyTorch's fused attention instead of the maths."""
    calls, kernels = _SdpaCalls(), _FusedKernels()
    with calls, kernels:
        out = attempt(_with_overflow_hint, fn, *args)
    if calls.called or kernels.called:
        raise Failed(USES_SDPA)
    return out


def _attention_case(fn: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor,
                    mask: Tensor | None, what: str) -> None:
    want = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask)
    args = (q.clone(), k.clone(), v.clone()) + ((mask.clone(),) if mask is not None else ())
    got = _without_pytorch_sdpa(fn, *args)
    if isinstance(got, tuple):
        raise Failed("return only the output tensor, not a tuple such as (output, weights)")
    if isinstance(got, Tensor) and got.shape == want.shape[:-2] + (want.shape[-2], k.shape[-2]):
        if got.shape != want.shape:
            raise Failed(f"the result has shape {tuple(got.shape)} = (..., n_q, n_k): those are the "
                         "weights — multiply them by v to get the output (..., n_q, d_v)")
    expect_tensor(got, want, f"the output ({what})")
    if got.dtype != q.dtype:
        raise Failed(f"the output has dtype {got.dtype}; keep the inputs' dtype {q.dtype}")
    atol = TOLERANCE[q.dtype]
    got = got.float().cpu()
    if close(got, want, atol=atol, rtol=atol):
        return
    d_k, d_v = q.shape[-1], v.shape[-1]
    rows = torch.ones(want.shape[:-1], dtype=torch.bool)
    if mask is not None:
        rows = mask.any(-1).expand(want.shape[:-1])  # (..., n_q): rows with an allowed key
    qf, kf, vf = q.float(), k.float(), v.float()

    def looks_like(mask_: Tensor | None, scale: float, dim: int = -1, rows_: Tensor = rows) -> bool:
        return _rows_agree(got, _sdpa(qf, kf, vf, mask_, scale, dim), rows_, atol)

    if mask is not None and looks_like(~mask, 1 / math.sqrt(d_k), rows_=(~mask).any(-1)):
        raise Failed(REVERSED)
    if looks_like(mask, 1.0):
        raise Failed(f"off by a factor √d_k = {math.sqrt(d_k):g} in the scores — did you forget "
                     "the scaling?")
    if looks_like(mask, 1.0 / d_k):
        raise Failed(f"you divided the scores by d_k = {d_k}; divide by √d_k = {math.sqrt(d_k):g}")
    if looks_like(mask, math.sqrt(d_k)):
        raise Failed("you multiplied the scores by √d_k; divide by it")
    if d_v != d_k and looks_like(mask, 1.0 / math.sqrt(d_v)):
        raise Failed(f"you scaled by √d_v = {math.sqrt(d_v):g}; the scale is 1/√d_k = "
                     f"1/{math.sqrt(d_k):g}, from the width of the queries and keys")
    if q.shape[-2] > 1 and looks_like(mask, 1 / math.sqrt(d_k), dim=-2):
        raise Failed(WRONG_AXIS)
    if mask is not None and looks_like(None, 1 / math.sqrt(d_k)):
        raise Failed("the mask was ignored: blocked keys still contribute to the output")
    if mask is not None and _rows_agree(got, want, rows, atol):  # only fully masked rows are wrong
        empty = ~rows
        if bool(torch.isnan(got[empty]).any()):
            raise Failed(NAN_ROW)
        mean_v = vf.mean(-2, keepdim=True).expand(want.shape)
        if close(got[empty], mean_v[empty], atol=atol, rtol=atol):
            raise Failed(UNIFORM_OUT)
        raise Failed("rows with allowed keys are right, but a fully masked row is not zeros")
    if bool(torch.isnan(got).any()):
        if q.dtype == torch.float16 and bool(torch.isinf(q @ k.transpose(-2, -1)).any()):
            raise Failed(FP16_SCORES_OVERFLOW)
        raise Failed(f"NaN in the output of rows that have allowed keys ({what})")
    raise Failed(f"the output differs from softmax(q kᵀ / √d_k) v by up to "
                 f"{float((got - want).abs().max()):.3g} ({what})")


def check_scaled_dot_product_attention(fn: Callable[..., Tensor]) -> bool:
    """``fn(q, k, v, mask=None)`` -> output ``(..., n_q, d_v)``; mask bool, True = may attend.

    Tested on 3-D and 4-D inputs with n_q ≠ n_k and d_v ≠ d_k, causal and key-padding masks, a
    fully masked query row (must give zeros), float16 / bfloat16 inputs (output keeps the dtype),
    and float16 inputs whose unscaled scores q·k exceed fp16's range while the scaled ones fit.
    A function that calls PyTorch's ``F.scaled_dot_product_attention`` (or its fused kernels) is
    refused: the exercise is to write the maths.
    """
    g = seeded(2)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g)

    q3, k3, v3 = randn(2, 5, 16), randn(2, 7, 16), randn(2, 7, 12)
    q4, k4, v4 = randn(2, 3, 5, 16), randn(2, 3, 7, 16), randn(2, 3, 7, 12)
    qc, kc, vc = randn(2, 2, 6, 16), randn(2, 2, 6, 16), randn(2, 2, 6, 8)
    pad = padding_mask(torch.tensor([7, 3]), 7)[:, None, None, :]
    holes = torch.rand(5, 7, generator=g) > 0.5
    holes[:, 0] = True
    holes[2] = False  # query 2 may attend nothing
    # fp16 self-attention with |q|² ≈ 16 · 80² ≈ 1e5 > 65504: q @ kᵀ overflows, (q / 4) @ kᵀ fits
    big = (randn(2, 6, 16) * 80).half()
    v_big = randn(2, 6, 8).half()

    def case(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, what: str) -> Callable[[], None]:
        return _unwrap_overflow(lambda: _attention_case(fn, q, k, v, mask, what))

    return run_checks("scaled dot-product attention", [
        ("no mask, (batch, seq, d) inputs", case(q3, k3, v3, None, "no mask, 3-D")),
        ("no mask, (batch, heads, seq, d) inputs", case(q4, k4, v4, None, "no mask, 4-D")),
        ("causal mask (n, n)", case(qc, kc, vc, causal_mask(6), "causal mask")),
        ("key-padding mask (batch, 1, 1, n_k)", case(q4, k4, v4, pad, "key-padding mask")),
        ("a fully masked query row", case(q4, k4, v4, holes, "a fully masked row")),
        ("float16 inputs", case(q4.half(), k4.half(), v4.half(), holes, "float16")),
        ("bfloat16 inputs", case(q4.bfloat16(), k4.bfloat16(), v4.bfloat16(), pad, "bfloat16")),
        ("float16 inputs with large scores", case(big, big, v_big, None, "float16, large scores")),
    ])
