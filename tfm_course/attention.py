"""Scaled dot-product attention, its masks, and multi-head attention.

Conventions used everywhere in tfm_course:

* batch-first tensors; per-head tensors are ``(batch, heads, seq, d_head)``;
* a mask is **boolean, True = may attend** (PyTorch's ``F.scaled_dot_product_attention``
  convention) and broadcasts to the score shape ``(..., n_q, n_k)``;
* a query row whose keys are all masked gets an output of **zeros**, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "scaled_dot_product_attention",
    "fused_attention",
    "causal_mask",
    "padding_mask",
    "check_mask",
    "masked_softmax",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "kv_cache_bytes",
]


# --------------------------------------------------------------------------- validation
def _check_qkv(q: Tensor, k: Tensor, v: Tensor, gqa: bool = False) -> None:
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"q, k, v need at least 2 dims (..., seq, d); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share d_k: q is {tuple(q.shape)} (..., n_q, d_k), "
            f"k is {tuple(k.shape)} (..., n_k, d_k)"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys n_k: k is {tuple(k.shape)}, "
            f"v is {tuple(v.shape)}"
        )
    if gqa:  # q (..., heads, n_q, d), k and v (..., kv_heads, n_k, d)
        if q.dim() < 3 or k.shape[:-2] != v.shape[:-2] or q.shape[:-3] != k.shape[:-3] or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"enable_gqa needs q (..., heads, n_q, d) and k, v (..., kv_heads, n_k, d) with heads "
                             f"a multiple of kv_heads; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                             f"v {tuple(v.shape)}")
        return
    if q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        return  # the usual case, checked without the cost of a broadcast
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch) dims of q {tuple(q.shape)}, k {tuple(k.shape)} and "
            f"v {tuple(v.shape)} do not broadcast"
        ) from None


def check_mask(mask: Tensor, score_shape: tuple[int, ...] | torch.Size) -> None:
    """Raise ``ValueError`` unless ``mask`` is boolean and broadcasts to ``score_shape``.

    The mask may have fewer dims than the scores, but broadcasting must not *grow* the scores:
    a ``(batch, n_k)`` padding mask against ``(batch, heads, n_q, n_k)`` scores would silently
    line its batch axis up with ``n_q``, so it is rejected (unless batch happens to equal ``n_q``:
    then it is a valid ``(n_q, n_k)`` mask, and no shape check can tell the two apart).
    """
    score_shape = tuple(score_shape)
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}"
        )
    try:
        out = torch.broadcast_shapes(tuple(mask.shape), score_shape)
    except RuntimeError:
        out = None
    if out != score_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores "
            f"(..., n_q, n_k) = {score_shape}; a key-padding mask (batch, n_k) needs "
            "mask[:, None, None, :] for (batch, heads, n_q, n_k) scores"
        )


def _check_bias(bias: Tensor, score_shape: tuple[int, ...] | torch.Size) -> None:
    if not bias.is_floating_point():
        raise ValueError(f"bias must be a float tensor added to the scores, got dtype {bias.dtype}")
    try:
        out = torch.broadcast_shapes(tuple(bias.shape), tuple(score_shape))
    except RuntimeError:
        out = None
    if out != tuple(score_shape):
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores "
            f"(..., n_q, n_k) = {tuple(score_shape)}"
        )


# --------------------------------------------------------------------------- masks
def causal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(n, n)``: True on and below the diagonal (query i may attend keys 0..i).

    To *apply* it, prefer ``is_causal=True`` (:func:`fused_attention`, :class:`MultiHeadAttention`):
    on CUDA a materialised mask keeps PyTorch from choosing the FlashAttention kernel.
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean ``(batch, max_len)``: True for real tokens, False for padding.

    ``lengths`` is ``(batch,)``; the mask is made on its device. Use ``m[:, None, None, :]`` as a
    *key*-padding mask for ``(batch, heads, n_q, n_k)`` scores, or ``m[:, None, :]`` for
    ``(batch, n_q, n_k)``.

    Without ``max_len`` the longest length must be read, which on a GPU makes the CPU wait for it:
    in a training loop pass ``max_len``. Lengths above ``max_len`` raise a ``ValueError`` when they
    are on the CPU; on a GPU the check would cost that same wait, so it is skipped there (such a
    row is simply all True).
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {tuple(lengths.shape)}")
    if max_len is None or lengths.device.type == "cpu":
        longest = int(lengths.max()) if lengths.numel() else 0
        max_len = longest if max_len is None else max_len
        if longest > max_len:
            raise ValueError(f"a length {longest} exceeds max_len {max_len}")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


# --------------------------------------------------------------------------- attention
def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis (the keys) that gives masked keys zero weight.

    ``scores`` ``(..., n_q, n_k)``; boolean ``mask`` broadcastable to it, True = may attend.
    The scores are converted to fp32 first, whatever their dtype, and the weights are returned in
    ``scores.dtype``. Masked scores are filled with the most negative finite **fp32** number,
    ``torch.finfo(torch.float32).min`` ≈ -3.4e38 (not ``-inf``, which makes an all-masked row
    0/0 = NaN; and not fp16's -65504, which an fp32 bias can undercut), and a row with no allowed
    key gets all-zero weights instead of uniform ones.
    """
    weights_dtype = scores.dtype
    scores = scores.float()
    if mask is not None:
        check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # empty rows: uniform -> zeros
    return weights.to(weights_dtype)


def _causal(n_q: int, n_k: int, device: torch.device | str | None) -> Tensor:
    """Boolean ``(n_q, n_k)``: query ``i`` sits at position ``n_k - n_q + i`` (the queries are the
    last ``n_q`` positions, as with a KV cache) and may attend keys up to it. ``n_q == n_k``:
    :func:`causal_mask`."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)


def _with_causal(mask: Tensor | None, n_q: int, n_k: int, device: torch.device) -> Tensor:
    causal = _causal(n_q, n_k, device)
    return causal if mask is None else mask & causal


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    return_weights: bool = False,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ / √d_k + bias) v, written out so every step can be inspected.

    Shapes: q ``(..., n_q, d_k)``, k ``(..., n_k, d_k)``, v ``(..., n_k, d_v)``, optional boolean
    ``mask`` broadcastable to ``(..., n_q, n_k)`` with True = may attend, optional float ``bias``
    broadcastable to the same shape, added to the scaled scores (ALiBi, T5 relative bias).
    ``is_causal=True`` also applies the causal mask (combined with ``mask`` if one is given).
    Returns the output ``(..., n_q, d_v)``, or ``(output, weights)`` with weights ``(..., n_q, n_k)``.

    Precision: q is scaled by 1/√d_k *before* the product, in the input dtype (as PyTorch's own
    maths backend does): in fp16, ``q @ kᵀ`` can exceed 65504 and become inf even where the
    scaled scores fit. The scores are then converted to fp32 and the softmax runs in fp32 whatever
    the input dtype; masked scores are filled with fp32's most negative finite number (not
    ``-inf``), and rows with no allowed key get zero weights, so a fully masked row yields zeros
    instead of NaN (see :func:`masked_softmax`).
    """
    _check_qkv(q, k, v)
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (..., n_q, n_k)
    scores = scores.float()
    if bias is not None:
        _check_bias(bias, scores.shape)
        scores = scores + bias.float()
    if is_causal:
        if mask is not None:
            check_mask(mask, scores.shape)
        mask = _with_causal(mask, q.shape[-2], k.shape[-2], q.device)
    weights = masked_softmax(scores, mask)  # fp32, (..., n_q, n_k)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    output = weights.to(v.dtype) @ v
    return (output, weights.to(q.dtype)) if return_weights else output


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """The same maths through PyTorch's fused kernel ``F.scaled_dot_product_attention``.

    Faster and lighter (the ``(n_q, n_k)`` weights are never stored), but it cannot return the
    weights. Say ``is_causal=True`` rather than passing :func:`causal_mask`: with no other mask
    or bias the kernel is then told ``is_causal=True`` and never reads a mask, which on CUDA lets
    PyTorch pick FlashAttention (a materialised boolean mask rules it out). With a ``mask`` or
    ``bias`` as well, the causal mask is combined with them.

    Fully masked rows are given every key (so the kernel never computes 0/0) and their output is
    then zeroed, to match :func:`scaled_dot_product_attention` instead of returning NaN. Both
    steps run unconditionally: asking whether any row is empty would make the CPU wait for the
    GPU. The ``bias`` is cast to the input dtype (the kernel takes its float mask in q's dtype),
    and masked keys get that dtype's most negative finite number in it.

    ``enable_gqa=True`` (grouped-query attention, chapters 3 and 13): q ``(B, heads, n_q, d)``
    with k, v ``(B, kv_heads, n_k, d)``; query head ``h`` reads K/V head ``h // (heads // kv_heads)``,
    as ``k.repeat_interleave(heads // kv_heads, dim=1)`` would give. Kernels that support it read
    each K/V head in place (on a GPU: FlashAttention and cuDNN, in fp16/bf16); the others repeat
    the heads internally. Needs PyTorch >= 2.5.
    """
    _check_qkv(q, k, v, gqa=enable_gqa)
    gqa = {"enable_gqa": True} if enable_gqa else {}  # the argument exists from PyTorch 2.5
    n_q, n_k = q.shape[-2], k.shape[-2]
    if enable_gqa or q.shape[:-2] == k.shape[:-2]:
        lead = q.shape[:-2]
    else:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    score_shape = lead + (n_q, n_k)
    if bias is not None:
        _check_bias(bias, score_shape)
        bias = bias.to(q.dtype)
    if mask is not None:
        check_mask(mask, score_shape)
    if is_causal:
        if mask is None and bias is None and n_q == n_k:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, **gqa)
        mask = _with_causal(mask, n_q, n_k, q.device)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, **gqa)
    row_ok = mask.any(dim=-1, keepdim=True)  # (..., n_q, 1): False for a row with no key
    mask = mask | ~row_ok  # let empty rows attend everywhere; zeroed below
    attn_mask = mask if bias is None else bias.masked_fill(~mask, torch.finfo(q.dtype).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, **gqa)
    return out.masked_fill(~row_ok, 0.0)


# --------------------------------------------------------------------------- heads
def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(batch, seq, heads * d_head)`` -> ``(batch, heads, seq, d_head)``.

    ``view`` to ``(batch, seq, heads, d_head)`` *then* ``transpose``: viewing straight to
    ``(batch, heads, seq, d_head)`` runs without error but mixes positions across heads.
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (batch, seq, heads * d_head), got {tuple(x.shape)}")
    batch, seq, width = x.shape
    if width % num_heads:
        raise ValueError(f"width {width} of {tuple(x.shape)} is not divisible by {num_heads} heads")
    return x.view(batch, seq, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(batch, heads, seq, d_head)`` -> ``(batch, seq, heads * d_head)``; inverse of split_heads."""
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects (batch, heads, seq, d_head), got {tuple(x.shape)}")
    batch, heads, seq, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * d_head)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first, with optional grouped-query heads.

    Args:
        d_model: width of the model; split into ``num_heads`` heads of ``d_model // num_heads``.
        num_heads: query heads.
        num_kv_heads: key/value heads (default ``num_heads``). ``1`` is multi-query attention,
            anything in between grouped-query attention; each K/V head serves
            ``num_heads // num_kv_heads`` query heads.
        bias: whether the four projections have biases.
        dropout: dropout on the attention weights (training only).
        fused: use ``F.scaled_dot_product_attention`` unless weights are requested.
        rotary: optional module ``rotary(q, k) -> (q, k)`` applied to the per-head queries and
            keys ``(batch, heads, seq, d_head)`` before the scores (RoPE, chapter 2).

    ``forward(query, key=None, value=None, mask=None, need_weights=False, position_bias=None,
    is_causal=False)``: ``position_bias`` is an optional float tensor added to the scores (ALiBi,
    T5); ``is_causal=True`` applies the causal mask without building it, so the fused kernel can
    use FlashAttention on CUDA (prefer it to ``mask=causal_mask(n)``). query
    ``(batch, n_q, d_model)``, key/value ``(batch, n_k, d_model)`` (default: the query, i.e.
    self-attention), boolean mask broadcastable to ``(batch, heads, n_q, n_k)``, True = may attend.
    Returns ``(batch, n_q, d_model)``, or ``(output, weights)`` with weights
    ``(batch, heads, n_q, n_k)`` when ``need_weights``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        fused: bool = True,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}")
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.d_head = d_model // num_heads
        self.dropout, self.fused, self.rotary = dropout, fused, rotary
        kv_width = num_kv_heads * self.d_head
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        position_bias: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must be (batch, seq, d_model={self.d_model}), got {tuple(t.shape)}"
                )
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"batch / length mismatch: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
        q = split_heads(self.q_proj(query), self.num_heads)  # (b, h, n_q, d_head)
        k = split_heads(self.k_proj(key), self.num_kv_heads)  # (b, h_kv, n_k, d_head)
        v = split_heads(self.v_proj(value), self.num_kv_heads)
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        if self.num_kv_heads != self.num_heads:  # each K/V head serves a group of query heads
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if mask is not None:
            check_mask(mask, (query.shape[0], self.num_heads, query.shape[1], key.shape[1]))
        p = self.dropout if self.training else 0.0
        if need_weights or not self.fused:
            out, weights = scaled_dot_product_attention(
                q, k, v, mask, return_weights=True, dropout_p=p, bias=position_bias,
                is_causal=is_causal)
        else:
            out = fused_attention(q, k, v, mask, dropout_p=p, bias=position_bias,
                                  is_causal=is_causal)
            weights = None
        out = self.out_proj(merge_heads(out))
        return (out, weights) if need_weights else out

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A copy of PyTorch's ``nn.MultiheadAttention`` (packed in-projection, with or without bias).

        Remember PyTorch's masks are the other way round (True = *blocked*) and that
        ``batch_first=False`` modules take ``(seq, batch, d)`` inputs.
        """
        if not m._qkv_same_embed_dim:
            raise ValueError("only nn.MultiheadAttention with kdim == vdim == embed_dim is supported")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("nn.MultiheadAttention with add_bias_kv or add_zero_attn has no counterpart here")
        ours = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout)
        ours = ours.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        wq, wk, wv = m.in_proj_weight.detach().chunk(3)
        with torch.no_grad():
            for proj, w in ((ours.q_proj, wq), (ours.k_proj, wk), (ours.v_proj, wv)):
                proj.weight.copy_(w)
            ours.out_proj.weight.copy_(m.out_proj.weight)
            if m.in_proj_bias is not None:
                bq, bk, bv = m.in_proj_bias.detach().chunk(3)
                for proj, b in ((ours.q_proj, bq), (ours.k_proj, bk), (ours.v_proj, bv)):
                    proj.bias.copy_(b)
                ours.out_proj.bias.copy_(m.out_proj.bias)
        return ours


def kv_cache_bytes(num_layers: int, num_kv_heads: int, d_head: int, bytes_per_value: int = 2) -> int:
    """Bytes a decoder caches per token: a key and a value of ``d_head`` numbers per K/V head and layer.

    ``2 * num_layers * num_kv_heads * d_head * bytes_per_value`` (2 bytes for bf16 / fp16). Multi-head
    attention caches ``num_heads`` K/V heads, grouped-query fewer, multi-query one.
    """
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("d_head", d_head), ("bytes_per_value", bytes_per_value)):
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    return 2 * num_layers * num_kv_heads * d_head * bytes_per_value
