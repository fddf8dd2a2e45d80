"""Position information for self-attention: sinusoidal, learned, rotary (RoPE), ALiBi, T5 relative bias.

Self-attention without positions is permutation-equivariant (chapter 1): shuffle the tokens and
the outputs shuffle with them. Each tool below injects order in a different place:

* **absolute, added to the embeddings** — :func:`sinusoidal_encoding` /
  :class:`SinusoidalPositionalEncoding` (Vaswani et al., 2017) and
  :class:`LearnedPositionalEmbedding` (BERT, GPT-1/2/3);
* **rotating queries and keys** — :class:`RotaryEmbedding` (RoPE, Su et al., 2021), handed to
  ``MultiHeadAttention(rotary=...)``;
* **a float bias added to the attention scores** — :func:`alibi_bias` (Press et al., 2021) and
  :class:`T5RelativeBias` (Raffel et al., 2020), passed as ``position_bias=...``; both return
  ``(1, heads, n_q, n_k)``.

Whenever ``n_q < n_k`` (decoding with a cache) the queries are taken to be the *last* ``n_q``
positions: query ``i`` sits at position ``n_k - n_q + i``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "sinusoidal_encoding",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "rotate_half",
    "RotaryEmbedding",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
    "T5RelativeBias",
]


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_batch_first(x: Tensor, d_model: int) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"expected batch-first embeddings (batch, seq, d_model={d_model}), "
                         f"got {tuple(x.shape)}")


def _query_positions(n_q: int, n_k: int, device: torch.device | str | None) -> Tensor:
    if n_q > n_k:
        raise ValueError(f"n_q={n_q} queries but only n_k={n_k} keys: queries are the last n_q positions")
    return torch.arange(n_k - n_q, n_k, device=device)


# --------------------------------------------------------------------------- sinusoidal
def sinusoidal_encoding(max_len: int, d_model: int, base: float = 10000.0,
                        device: torch.device | str | None = None) -> Tensor:
    """The table of Vaswani et al. (2017), ``(max_len, d_model)``, fp32 on ``device`` (default CPU)::

        PE[p, 2i]     = sin(p / base^(2i / d_model))
        PE[p, 2i + 1] = cos(p / base^(2i / d_model))

    Sine and cosine of the same frequency sit side by side (interleaved), so pair ``i`` is the
    point ``(sin, cos)`` of the angle ``p · ω_i`` on the unit circle. The angles are computed in
    float64 on the CPU (MPS has no float64) and the fp32 table is then moved to ``device``: pass
    ``device=x.device`` before adding it to activations ``x``.
    """
    _positive(max_len=max_len, d_model=d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    angle = position * omega  # (max_len, d_model/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe.to(device=device, dtype=torch.float32)


class SinusoidalPositionalEncoding(nn.Module):
    """``(batch, seq, d_model) -> (batch, seq, d_model)``: adds ``PE[offset : offset + seq]``.

    The table is a buffer with ``persistent=False``: it moves with ``.to(device)`` but is not
    saved in the ``state_dict`` (it is a function of the sizes, not a parameter). It is added as
    ``(1, seq, d_model)``, one row per *position*, broadcast over the batch.
    """

    def __init__(self, d_model: int, max_len: int = 4096, dropout: float = 0.0,
                 base: float = 10000.0) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_batch_first(x, self.d_model)
        end = offset + x.shape[1]
        if offset < 0 or end > self.max_len:
            raise ValueError(f"positions {offset}..{end - 1} do not fit the table of "
                             f"max_len={self.max_len}; build the module with a larger max_len")
        return self.dropout(x + self.pe[None, offset:end].to(x.dtype))


# --------------------------------------------------------------------------- learned
class LearnedPositionalEmbedding(nn.Module):
    """``(batch, seq, d_model) -> (batch, seq, d_model)``: adds a trained row per position.

    One ``d_model`` vector per position up to ``max_len`` (BERT, GPT-1/2/3): ``max_len · d_model``
    parameters. There is no row for position ``max_len`` or beyond, so longer inputs raise a
    ``ValueError`` instead of an index error deep inside ``nn.Embedding``.
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02) -> None:
        super().__init__()
        _positive(max_len=max_len, d_model=d_model)
        self.max_len, self.d_model = max_len, d_model
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * init_std)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_batch_first(x, self.d_model)
        end = offset + x.shape[1]
        if offset < 0 or end > self.max_len:
            raise ValueError(f"positions {offset}..{end - 1} but a learned table only has rows for "
                             f"0..{self.max_len - 1} (max_len={self.max_len}); it cannot embed "
                             "positions it was never given")
        return x + self.weight[None, offset:end].to(x.dtype)


# --------------------------------------------------------------------------- rotary
def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim, split into two halves (the GPT-NeoX / HF layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): rotate each (query, key) feature pair by ``position · θ_i``.

    Pairing convention: **split halves**, as in GPT-NeoX and Hugging Face's Llama — feature ``i``
    is paired with feature ``i + d_head/2`` and rotated by the angle ``p · θ_i`` with
    ``θ_i = base^(-2i / d_head)``. The RoFormer paper (and GPT-J, Meta's original LLaMA code) pairs
    *adjacent* features ``(2i, 2i + 1)`` instead; the two are the same rotation up to a fixed
    permutation of the features, which is why checkpoints are converted by permuting the rows of
    the query and key projections.

    ``rotary(q, k, offset=0) -> (q, k)`` with q, k ``(batch, heads, seq, d_head)`` holding the same
    ``seq`` tokens at positions ``offset, offset + 1, ...`` (with a KV cache: rotate the new keys
    before appending them). Use :meth:`rotate` to rotate one tensor at its own positions. Angles
    are computed in fp32 whatever the input dtype. ``scale`` > 1 rotates position ``p`` as
    ``p / scale`` (linear position interpolation, Hugging Face's ``rope_type="linear"``).
    ``MultiHeadAttention(rotary=...)`` calls
    ``rotary(q, k)`` without an offset (whole sequences from position 0); chapter 13's
    :class:`~tfm_course.models.llama.Llama` passes the cache's length as the offset.
    """

    def __init__(self, d_head: int, base: float = 10000.0, scale: float = 1.0) -> None:
        super().__init__()
        _positive(d_head=d_head)
        if d_head % 2:
            raise ValueError(f"d_head must be even (features are rotated in pairs), got {d_head}")
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self.d_head, self.base, self.scale = d_head, base, scale
        # scale > 1: position interpolation (Chen et al., 2023), position p rotated as p / scale
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head) / scale
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # θ_i, (d_head/2,)

    def cos_sin(self, seq: int, offset: int = 0) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of the angles for positions ``offset .. offset+seq-1``: ``(seq, d_head)``."""
        position = torch.arange(offset, offset + seq, device=self.inv_freq.device, dtype=torch.float32)
        angle = position[:, None] * self.inv_freq[None, :]  # (seq, d_head/2)
        angle = torch.cat((angle, angle), dim=-1)  # feature i and i + d_head/2 share an angle
        return angle.cos(), angle.sin()

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``x`` ``(batch, heads, seq, d_head)`` as if it sat at positions ``offset, ...``."""
        if x.dim() != 4 or x.shape[-1] != self.d_head:
            raise ValueError(f"expected (batch, heads, seq, d_head={self.d_head}), got {tuple(x.shape)}")
        if offset < 0:
            raise ValueError(f"offset must be non-negative, got {offset}")
        cos, sin = self.cos_sin(x.shape[-2], offset)
        rotated = x.float() * cos + rotate_half(x.float()) * sin
        return rotated.to(x.dtype)

    def forward(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must hold the same positions; "
                             "to rotate them at different positions call rotate(x, offset) on each")
        return self.rotate(q, offset), self.rotate(k, offset)


# --------------------------------------------------------------------------- ALiBi
def alibi_slopes(num_heads: int, device: torch.device | str | None = None) -> Tensor:
    """The head-specific slopes of ALiBi (Press et al., 2021), ``(num_heads,)``, fp32 on ``device``.

    For ``n`` heads, a power of 2, the slopes are the geometric sequence ``2^(-8/n · i)`` for
    ``i = 1..n`` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, as in the paper's code, take the
    slopes of the closest smaller power of 2, ``m``, and add every other slope of ``2m`` heads.
    """
    _positive(num_heads=num_heads)

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_2(closest)
    if closest != num_heads:
        slopes += power_of_2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def alibi_bias(num_heads: int, n_q: int, n_k: int | None = None,
               device: torch.device | str | None = None) -> Tensor:
    """``-slope_h · |i - j|`` as a float bias ``(1, num_heads, n_q, n_k)`` for the attention scores.

    Under a causal mask this is the paper's ``-m · (i - j)`` for keys ``j <= i``; without one it
    is the symmetric variant (used by bidirectional encoders), which cannot tell left from right.
    """
    n_k = n_q if n_k is None else n_k
    _positive(num_heads=num_heads, n_q=n_q, n_k=n_k)
    i = _query_positions(n_q, n_k, device)
    j = torch.arange(n_k, device=device)
    distance = (i[:, None] - j[None, :]).abs().float()  # (n_q, n_k)
    slopes = alibi_slopes(num_heads, device=device)
    return -(slopes[:, None, None] * distance)[None]


# --------------------------------------------------------------------------- T5 relative bias
def relative_position_bucket(relative_position: Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket (Raffel et al., 2020) of ``relative_position = key position − query position``.

    Bidirectional: half the buckets for keys to the left (``<= 0``), half for keys to the right.
    Unidirectional (causal): keys to the right all fall in bucket 0 (they are masked anyway). In
    each half, distances below ``max_exact = buckets/2`` get a bucket each; larger ones share
    logarithmically wider buckets up to ``max_distance``, beyond which all share the last bucket.
    Returns a long tensor of the same shape.
    """
    _positive(num_buckets=num_buckets, max_distance=max_distance)
    if relative_position.is_floating_point():
        raise ValueError(f"relative_position must be an integer tensor, got {relative_position.dtype}")
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        if num_buckets % 2:
            raise ValueError(f"bidirectional buckets are split in two halves: num_buckets must be even, "
                             f"got {num_buckets}")
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"need num_buckets per direction >= 2 and max_distance > {max_exact}, got "
                         f"{num_buckets} buckets and max_distance={max_distance}")
    # T5's order of operations (log ratio first, then times the bucket count): at exact bucket
    # boundaries another order can round the other way and disagree with T5 / Hugging Face
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class T5RelativeBias(nn.Module):
    """A learned scalar per (bucket, head), added to the scores: ``forward(n_q, n_k) -> (1, heads, n_q, n_k)``.

    T5 computes it in the first layer of each stack and shares it with the other layers.
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        _positive(num_heads=num_heads, num_buckets=num_buckets, max_distance=max_distance)
        self.num_heads, self.num_buckets = num_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, n_q: int, n_k: int | None = None) -> Tensor:
        n_k = n_q if n_k is None else n_k
        _positive(n_q=n_q, n_k=n_k)
        device = self.embedding.weight.device
        i = _query_positions(n_q, n_k, device)
        j = torch.arange(n_k, device=device)
        bucket = relative_position_bucket(j[None, :] - i[:, None], self.bidirectional,
                                          self.num_buckets, self.max_distance)  # (n_q, n_k)
        return self.embedding(bucket).permute(2, 0, 1)[None]  # (1, heads, n_q, n_k)
