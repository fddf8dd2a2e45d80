"""Checkers for chapter 3, "Multi-head attention".

>>> from tfm_course.exercises import ch03
>>> ch03.check_split_heads(my_split_heads)        # fn(x, num_heads): (b, n, d) -> (b, h, n, d_head)
>>> ch03.check_merge_heads(my_merge_heads)        # fn(x): (b, h, n, d_head) -> (b, n, d)
>>> ch03.check_mha_forward(my_forward)            # fn(mha, query, key, value, mask) -> (b, n_q, d)
>>> ch03.check_load_torch_weights(my_from_torch)  # fn(nn.MultiheadAttention) -> MultiHeadAttention
>>> ch03.check_kv_cache_bytes(my_kv_bytes)        # fn(layers, heads, kv_heads, d_head, bytes) -> int

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, causal_mask, kv_cache_bytes, merge_heads, padding_mask, split_heads
from ._checking import Failed, attempt, close, expect_tensor, max_error, run_checks, seeded

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_mha_forward",
    "check_load_torch_weights",
    "check_kv_cache_bytes",
]

VIEW_BUG = ("positions are mixed across heads: you viewed (batch, seq, d_model) straight to "
            "(batch, heads, seq, d_head). It runs, but each 'head' then holds a block of consecutive "
            "positions, not a slice of channels — view to (batch, seq, heads, d_head) first, then "
            "transpose(1, 2)")
MERGE_BUG = ("you reshaped (batch, heads, seq, d_head) straight to (batch, seq, d_model) — that "
             "interleaves positions; transpose(1, 2) back to (batch, seq, heads, d_head) first")
INTERLEAVED = ("each head got every num_heads-th channel (interleaved); head i must own the "
               "contiguous channels i*d_head .. (i+1)*d_head - 1, i.e. view(batch, seq, heads, d_head)")
NOT_CONTIGUOUS = ("`.view` failed because the tensor is not contiguous after `transpose` — use "
                  "`.reshape(...)` (or `.contiguous().view(...)`)")
EMPTY_ROW_NAN = ("NaN for a query that may attend no key at all (causal mask + left padding): "
                 "filling masked scores with -inf makes such a row's softmax 0/0, and the NaN "
                 "reaches every gradient even if the loss ignores that position. Fill with "
                 "torch.finfo(scores.dtype).min and zero the masked weights after the softmax "
                 "(weights.masked_fill(~mask, 0.0)), so that row's weights are all zero")
EMPTY_ROW_UNIFORM = ("a query that may attend no key at all (causal mask + left padding) spreads "
                     "its weight uniformly over keys it must not see: filled with the same minimum, "
                     "its scores are all equal, so the softmax gives 1/n_k each. Zero the masked "
                     "weights after the softmax (weights.masked_fill(~mask, 0.0)): such a row must "
                     "get all-zero weights, as in tfm_course")
EMPTY_ROW_OTHER = ("a query that may attend no key at all (causal mask + left padding) must get "
                   "all-zero weights, so its output is mha.out_proj applied to zeros")
REVERSED = ("mask reversed: in this book True = may attend (PyTorch's nn.MultiheadAttention uses "
            "the opposite, True = blocked)")


def _hint_noncontiguous(check: Callable[[], None]) -> Callable[[], None]:
    """Replace the cryptic "view size is not compatible" error with a hint in words."""
    def wrapped() -> None:
        try:
            check()
        except Failed as problem:
            if "view size is not compatible" in str(problem):
                raise Failed(NOT_CONTIGUOUS) from None
            raise
    return wrapped


# --------------------------------------------------------------------------- split / merge
def check_split_heads(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """``fn(x, num_heads)``: ``(batch, seq, heads * d_head)`` -> ``(batch, heads, seq, d_head)``."""

    def case(batch: int, seq: int, heads: int, d_head: int) -> Callable[[], None]:
        def check() -> None:
            x = torch.randn(batch, seq, heads * d_head, generator=seeded(seq))
            want = split_heads(x, heads)
            got = attempt(fn, x.clone(), heads)
            if isinstance(got, Tensor) and got.shape == (batch, seq, heads, d_head) != want.shape:
                raise Failed(f"shape {tuple(got.shape)} is (batch, seq, heads, d_head): you split the "
                             "channels but forgot transpose(1, 2) to put heads before seq")
            expect_tensor(got, want, f"split of {tuple(x.shape)} into {heads} heads")
            if close(got, want, atol=0, rtol=0):
                return
            if close(got, x.reshape(batch, heads, seq, d_head), atol=0, rtol=0):
                raise Failed(VIEW_BUG)
            if close(got, x.view(batch, seq, d_head, heads).permute(0, 3, 1, 2), atol=0, rtol=0):
                raise Failed(INTERLEAVED)
            h, t = ((got - want).abs().amax(dim=(0, 3)) > 0).nonzero()[0].tolist()
            raise Failed(f"head {h} at position {t} should hold x[:, {t}, {h * d_head}:{(h + 1) * d_head}] "
                         "(its own slice of channels at that position); yours holds something else")
        return _hint_noncontiguous(check)

    return run_checks("split heads", [
        ("batch 2, seq 5, 3 heads of 4", case(2, 5, 3, 4)),
        ("batch 1, seq 8, 2 heads of 8", case(1, 8, 2, 8)),
        ("batch 3, seq 4, 4 heads of 2", case(3, 4, 4, 2)),
    ])


def check_merge_heads(fn: Callable[[Tensor], Tensor]) -> bool:
    """``fn(x)``: ``(batch, heads, seq, d_head)`` -> ``(batch, seq, heads * d_head)``."""

    def case(batch: int, heads: int, seq: int, d_head: int) -> Callable[[], None]:
        def check() -> None:
            x = torch.randn(batch, heads, seq, d_head, generator=seeded(seq + 10))
            want = merge_heads(x)
            got = attempt(fn, x.clone())
            if isinstance(got, Tensor) and got.shape == (batch, seq, heads, d_head):
                raise Failed(f"shape {tuple(got.shape)}: the heads are back in place but not "
                             f"concatenated — flatten the last two dims to d_model = {heads * d_head}")
            expect_tensor(got, want, f"merge of {tuple(x.shape)}")
            if close(got, want, atol=0, rtol=0):
                return
            if close(got, x.reshape(batch, seq, heads * d_head), atol=0, rtol=0):
                raise Failed(MERGE_BUG)
            if close(got, x.permute(0, 2, 3, 1).reshape(batch, seq, heads * d_head), atol=0, rtol=0):
                raise Failed("the channels of the heads are interleaved: concatenate them, head 0's "
                             "d_head channels first — transpose(1, 2), not a permute that puts heads last")
            raise Failed("position t should be the concatenation of every head's output at t "
                         f"(head 0 first); yours differs by up to {max_error(got, want):.3g}")
        return _hint_noncontiguous(check)

    return run_checks("merge heads", [
        ("batch 2, 3 heads, seq 5, d_head 4", case(2, 3, 5, 4)),
        ("batch 1, 2 heads, seq 6, d_head 8", case(1, 2, 6, 8)),
        ("batch 2, 4 heads, seq 3, d_head 2", case(2, 4, 3, 2)),
    ])


# --------------------------------------------------------------------------- forward pass
def _variant(mha: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor,
             mask: Tensor | None, *, out_proj: bool = True, scale: str = "head",
             mask_mode: str = "ok", split: str = "ok", softmax_dim: int = -1) -> Tensor:
    """Multi-head attention with one deliberate mistake (or none), to recognise wrong answers.

    ``mask_mode``: ``"ok"``, ``"ignored"``, ``"reversed"``, or ``"not_zeroed"`` (masked scores
    filled with fp32's minimum but the weights not zeroed after the softmax: a query row with no
    allowed key then spreads uniform weights over keys it may not see).
    """
    b, n_q, d = query.shape
    h = mha.num_heads

    def heads(x: Tensor) -> Tensor:
        return x.reshape(b, h, x.shape[1], d // h) if split == "view" else split_heads(x, h)

    q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
    divisor = {"head": math.sqrt(d // h), "model": math.sqrt(d), "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) / divisor
    if mask is not None and mask_mode != "ignored":
        allowed = ~mask if mask_mode == "reversed" else mask
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_mode not in ("ignored", "not_zeroed"):
        weights = weights.masked_fill(~allowed, 0.0)
    out = weights @ v
    out = out.reshape(b, n_q, d) if split == "view" else merge_heads(out)
    return mha.out_proj(out) if out_proj else out


def _rows_match(got: Tensor, want: Tensor, rows: Tensor) -> bool:
    """Close on the query positions (batch, n_q) where ``rows`` is True (NaN rows elsewhere ignored)."""
    rows = rows.expand(got.shape[:-1])
    return bool(rows.any()) and close(got[rows], want[rows], atol=1e-5, rtol=1e-4)


def _check_empty_rows(got: Tensor, want: Tensor, not_zeroed: Tensor, empty: Tensor) -> None:
    """Name the mistake when only the query rows with no allowed key are wrong.

    ``got``, ``want``, ``not_zeroed``: ``(batch, n_q, d_model)``; ``empty``: bool ``(batch, n_q)``.
    """
    full = ~empty
    if not _rows_match(got, want, full):
        return  # wrong elsewhere too: the general diagnosis applies
    if bool(torch.isnan(got[empty]).any()):
        raise Failed(EMPTY_ROW_NAN)
    if _rows_match(got, not_zeroed, empty):
        raise Failed(EMPTY_ROW_UNIFORM)
    error = max_error(got[empty], want[empty])
    raise Failed(EMPTY_ROW_OTHER + f" (yours differs there by up to {error:.3g})")


def check_mha_forward(fn: Callable[..., Tensor]) -> bool:
    """``fn(mha, query, key, value, mask)`` must return ``mha(query, key, value, mask=mask)``.

    Use ``mha.q_proj``, ``mha.k_proj``, ``mha.v_proj``, ``mha.out_proj`` and ``mha.num_heads``;
    ``mask`` is None or bool broadcastable to ``(batch, heads, n_q, n_k)``, True = may attend.
    A query row whose keys are all masked gets zero attention weights (so its output is
    ``mha.out_proj`` of zeros), as in the package, never NaN.
    """

    def case(d_model: int, heads: int, n_q: int, n_k: int, mask_kind: str) -> Callable[[], None]:
        def check() -> None:
            torch.manual_seed(d_model + n_q)
            mha = MultiHeadAttention(d_model, heads).eval()
            g = seeded(n_k)
            query = torch.randn(2, n_q, d_model, generator=g)
            key = query if n_q == n_k else torch.randn(2, n_k, d_model, generator=g)
            mask = None
            if mask_kind == "causal":
                mask = causal_mask(n_q)
            elif mask_kind == "padding":
                mask = padding_mask(torch.tensor([n_k, n_k // 2]), n_k)[:, None, None, :]
            elif mask_kind == "left padding":  # causal, second row left-padded: its pad queries see no key
                real = torch.arange(n_k) >= torch.tensor([[0], [n_k // 2]])  # (batch, n_k)
                mask = causal_mask(n_q) & real[:, None, None, :]
            with torch.no_grad():
                want = mha(query, key, key, mask=mask)
                got = attempt(fn, mha, query.clone(), key.clone(), key.clone(), mask)
            expect_tensor(got, want, "the output")
            if close(got, want):
                return

            def like(**mistake: object) -> bool:
                with torch.no_grad():
                    return close(got, _variant(mha, query, key, key, mask, **mistake))

            if mask is not None:
                empty = ~mask.expand(2, heads, n_q, n_k).any(-1).any(1)  # (batch, n_q): no key at all
                if bool(empty.any()):
                    with torch.no_grad():
                        not_zeroed = _variant(mha, query, key, key, mask, mask_mode="not_zeroed")
                    _check_empty_rows(got, want, not_zeroed, empty)
            if like(out_proj=False):
                raise Failed("your output is the concatenated heads: the final projection "
                             "mha.out_proj is missing")
            if like(scale="none"):
                raise Failed("off by a factor √d_head inside the softmax — did you forget to divide "
                             "the scores by √d_head?")
            if like(scale="model"):
                raise Failed("you divided the scores by √d_model; each head's dot product has d_head "
                             "terms, so divide by √d_head")
            if like(split="view"):
                raise Failed(VIEW_BUG)
            if like(softmax_dim=-2):
                raise Failed("softmax over the wrong axis: normalise over the keys (the last dim)")
            if mask is not None:
                if like(mask_mode="ignored"):
                    raise Failed("the mask was ignored: blocked keys still get weight")
                reversed_rows = (~mask).expand(2, heads, n_q, n_k).any(-1).all(1)  # (batch, n_q)
                with torch.no_grad():
                    wrong = _variant(mha, query, key, key, mask, mask_mode="reversed")
                if _rows_match(got, wrong, reversed_rows):
                    raise Failed(REVERSED)
            if bool(torch.isnan(got).any()):
                raise Failed("NaN in the output: is a row of scores all -inf?")
            raise Failed(f"the output differs from multi-head attention by up to "
                         f"{max_error(got, want):.3g} ({mask_kind} mask)")
        return check

    return run_checks("multi-head attention forward", [
        ("self-attention, 3 heads, no mask", case(12, 3, 5, 5, "none")),
        ("self-attention, 4 heads, causal mask", case(16, 4, 6, 6, "causal")),
        ("cross-attention, 2 heads, key padding", case(8, 2, 4, 7, "padding")),
        ("self-attention, 2 heads, causal + left padding (query rows with no key)",
         case(8, 2, 6, 6, "left padding")),
    ])


# --------------------------------------------------------------------------- loading PyTorch's weights
def _same(a: Tensor | None, b: Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and close(a, b, atol=0, rtol=0)


def check_load_torch_weights(fn: Callable[[nn.MultiheadAttention], nn.Module]) -> bool:
    """``fn(m)`` must return a ``MultiHeadAttention`` computing what ``m`` computes (its weights copied)."""

    def case(d_model: int, heads: int, bias: bool) -> Callable[[], None]:
        def check() -> None:
            torch.manual_seed(d_model)
            m = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).eval()
            if bias:  # PyTorch initialises its biases to zero; random ones reveal mix-ups
                with torch.no_grad():
                    m.in_proj_bias.normal_()
                    m.out_proj.bias.normal_()
            ours = attempt(fn, m)
            if not all(hasattr(ours, p) for p in ("q_proj", "k_proj", "v_proj", "out_proj")):
                raise Failed(f"return a tfm_course MultiHeadAttention (got {type(ours).__name__})")
            if getattr(ours, "num_heads", None) != heads:
                raise Failed(f"your module has num_heads={getattr(ours, 'num_heads', None)}, "
                             f"PyTorch's has {heads}")
            chunks = dict(zip("qkv", m.in_proj_weight.detach().chunk(3)))
            for name in "qkv":
                w = getattr(ours, f"{name}_proj").weight.detach()
                if _same(w, chunks[name]):
                    continue
                for other in "qkv":
                    if other != name and _same(w, chunks[other]):
                        raise Failed(f"{name}_proj holds the rows of in_proj_weight meant for "
                                     f"{other}_proj: in_proj_weight stacks [W_q; W_k; W_v] in that order")
                if _same(w, chunks[name].T):
                    raise Failed(f"{name}_proj.weight is transposed: nn.Linear and in_proj_weight both "
                                 "store (out_features, in_features), so copy the rows as they are")
                raise Failed(f"{name}_proj.weight was not copied from in_proj_weight")
            if not _same(ours.out_proj.weight.detach(), m.out_proj.weight.detach()):
                if _same(ours.out_proj.weight.detach(), m.out_proj.weight.detach().T):
                    raise Failed("out_proj.weight is transposed: copy it as it is")
                raise Failed("out_proj.weight was not copied from PyTorch's out_proj")
            if not bias:
                if any(getattr(ours, f"{p}_proj").bias is not None for p in ("q", "k", "v", "out")):
                    raise Failed("PyTorch's module has no biases (bias=False): build yours with "
                                 "bias=False too, or it adds its own random biases")
            else:
                biases = dict(zip("qkv", m.in_proj_bias.detach().chunk(3)))
                for name in "qkv":
                    if not _same(getattr(ours, f"{name}_proj").bias, biases[name]):
                        raise Failed(f"{name}_proj.bias was not copied from its third of in_proj_bias")
                if not _same(ours.out_proj.bias, m.out_proj.bias.detach()):
                    raise Failed("out_proj.bias was not copied")
            x = torch.randn(2, 5, d_model, generator=seeded(d_model))
            mask = causal_mask(5)
            with torch.no_grad():
                want = m(x, x, x, attn_mask=~mask, need_weights=False)[0]  # PyTorch: True = blocked
                got = ours(x, mask=mask)
            if not close(got, want):
                raise Failed(f"the weights match but the outputs differ by {max_error(got, want):.3g}")
        return check

    return run_checks("load nn.MultiheadAttention weights", [
        ("12 wide, 3 heads, with biases", case(12, 3, True)),
        ("16 wide, 4 heads, without biases", case(16, 4, False)),
        ("8 wide, 2 heads, with biases", case(8, 2, True)),
    ])


# --------------------------------------------------------------------------- KV-cache arithmetic
def check_kv_cache_bytes(fn: Callable[[int, int, int, int, int], int]) -> bool:
    """``fn(num_layers, num_heads, num_kv_heads, d_head, bytes_per_value)``: cache bytes per token."""

    def case(layers: int, heads: int, kv_heads: int, d_head: int, nbytes: int) -> Callable[[], None]:
        def check() -> None:
            want = kv_cache_bytes(layers, kv_heads, d_head, nbytes)
            got = attempt(fn, layers, heads, kv_heads, d_head, nbytes)
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.item()
            if not isinstance(got, (int, float)):
                raise Failed(f"return a number of bytes, got {type(got).__name__}")
            if math.isclose(got, want):
                return
            if math.isclose(got, want / 2):
                raise Failed("half the answer: the cache holds a key *and* a value per head (factor 2)")
            if kv_heads != heads and math.isclose(got, want * heads / kv_heads):
                raise Failed("you cached one K/V per query head; only the num_kv_heads key/value "
                             "heads are cached (that is the point of GQA / MQA)")
            if math.isclose(got, want / layers):
                raise Failed("that is one layer's cache: every layer keeps its own keys and values")
            if math.isclose(got, want / nbytes):
                raise Failed("you counted numbers, not bytes: multiply by bytes_per_value")
            if math.isclose(got, want * 8):
                raise Failed("that is bits, not bytes")
            raise Failed(f"got {got:g} bytes per token, expected {want:g} "
                         f"({layers} layers, {kv_heads} K/V heads of {d_head}, {nbytes} bytes each)")
        return check

    return run_checks("KV-cache bytes per token", [
        ("12 layers, 12 heads (plain MHA) of 64, fp32", case(12, 12, 12, 64, 4)),
        ("32 layers, 32 heads, 8 K/V heads of 128, bf16", case(32, 32, 8, 128, 2)),
        ("6 layers, 8 heads, 1 K/V head (MQA) of 16, int8", case(6, 8, 1, 16, 1)),
    ])
