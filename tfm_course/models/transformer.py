"""The encoder-decoder Transformer of Vaswani et al. (2017), for sequence-to-sequence tasks.

    model = Transformer(src_vocab_size, tgt_vocab_size, d_model=128, num_heads=4,
                        num_encoder_layers=2, num_decoder_layers=2, d_ff=512)
    logits = model(src, tgt_in)            # (batch, T, tgt_vocab_size), teacher forcing

The pieces, in the order data flows through them:

1. embeddings scaled by √d_model, plus the sinusoidal positional encoding, then dropout;
2. :class:`Encoder` — a stack of :class:`~tfm_course.layers.EncoderLayer` and a final norm;
3. :class:`Decoder` — a stack of :class:`~tfm_course.layers.DecoderLayer` and a final norm
   (``nn.Transformer`` adds both final norms, also in the post-LN setting);
4. a linear projection to target-vocabulary logits (optionally tied to the target embedding).

Masks are boolean, True = may attend: :func:`source_mask` (source key padding, also used by the
cross-attention) and :func:`target_mask` (causal *and* target key padding). For right-padded
targets, the usual case, :meth:`Transformer.decode` needs no target mask at all: ``is_causal=True``
is exact at every real position and lets CUDA use FlashAttention.

Decoding goes through :mod:`tfm_course.decoding`, which talks to the model through a *stepper*:
``model.stepper(src, use_cache)`` returns :class:`Recompute` or :class:`KVCache`.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import (MultiHeadAttention, causal_mask, merge_heads,
                         scaled_dot_product_attention, split_heads)
from ..layers import DecoderLayer, EncoderLayer, LayerNorm

__all__ = ["source_mask", "target_mask", "Encoder", "Decoder", "Transformer", "sequence_loss",
           "attend_with_cache", "Recompute", "KVCache"]


# --------------------------------------------------------------------------- masks
def _check_tokens(tokens: Tensor, name: str) -> None:
    if tokens.dim() != 2 or tokens.is_floating_point():
        raise ValueError(f"{name} must be integer token ids (batch, seq), got "
                         f"{tuple(tokens.shape)} {tokens.dtype}")


def check_ids_in_range(ids: Tensor, size: int, name: str = "token ids") -> None:
    """``ValueError`` unless every id lies in ``[0, size)``: checked where it is free, on the CPU.

    Reading a GPU tensor's minimum on the host waits for all queued GPU work (a host sync), and
    the embedding and the loss would do it at every training and decoding step. On a GPU the
    kernels themselves still stop a bad id (CUDA's embedding and cross-entropy raise a device-side
    assertion), just with a cruder message: check data on the CPU before moving it when in doubt.
    """
    if ids.device.type != "cpu" or ids.numel() == 0:
        return
    low, high = ids.aminmax()
    if low < 0 or high >= size:
        raise ValueError(f"{name} must lie in [0, {size}), got values in [{int(low)}, {int(high)}]")


def _check_right_padded(tokens: Tensor, pad_id: int) -> None:
    """``ValueError`` if a ``<pad>`` comes before a real token in some row (on the CPU only)."""
    if tokens.device.type != "cpu" or tokens.shape[1] < 2:
        return
    pad = tokens == pad_id
    if bool((pad[:, :-1] & ~pad[:, 1:]).any()):
        raise ValueError("tgt_in has <pad> before a real token (left padding?): the causal mask "
                         "alone would let real queries read it; pass tgt_mask=target_mask(tgt_in)")


def source_mask(src: Tensor, pad_id: int = 0) -> Tensor:
    """Key-padding mask ``(batch, 1, 1, S)``: True where the *key* is a real source token.

    It broadcasts over heads and over queries: no query (in the encoder's self-attention or in
    the decoder's cross-attention) may read a padded source position.
    """
    _check_tokens(src, "src")
    return (src != pad_id)[:, None, None, :]


def target_mask(tgt: Tensor, pad_id: int = 0) -> Tensor:
    """Causal and key-padding mask ``(batch, 1, T, T)``: query t may read keys s <= t that are real.

    The padding part is indexed by *key* (last axis), like :func:`source_mask`. With right
    padding every query row keeps a real key (the first token), so no row is empty. With *left*
    padding the rows of the leading pads are empty (their only earlier keys are pads); attention
    then gives them zero output instead of NaN, and real queries never read a pad either way.
    """
    _check_tokens(tgt, "tgt")
    keys = (tgt != pad_id)[:, None, None, :]  # (batch, 1, 1, T)
    return keys & causal_mask(tgt.shape[1], device=tgt.device)  # (batch, 1, T, T)


# --------------------------------------------------------------------------- stacks
class Encoder(nn.Module):
    """``num_layers`` encoder layers and an optional final LayerNorm: ``(B, S, d) -> (B, S, d)``."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int,
                 dropout: float = 0.1, activation: str = "relu", norm_first: bool = False,
                 final_norm: bool = True, layer_norm_eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout=dropout, activation=activation,
                         norm_first=norm_first, bias=bias, layer_norm_eps=layer_norm_eps)
            for _ in range(num_layers))
        self.norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias) if final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask=mask)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoder) -> "Encoder":
        """A copy of ``nn.TransformerEncoder`` (its layers and its ``norm``, if any)."""
        ours = cls(0, 1, 1, 1, final_norm=False)
        ours.layers = nn.ModuleList(EncoderLayer.from_torch(layer) for layer in m.layers)
        ours.norm = LayerNorm.from_torch(m.norm) if m.norm is not None else None
        return ours


class Decoder(nn.Module):
    """``num_layers`` decoder layers and an optional final LayerNorm.

    ``forward(x, memory, tgt_mask=None, memory_mask=None, need_weights=False,
    tgt_is_causal=False)``: ``x`` (B, T, d), ``memory`` (B, S, d) -> (B, T, d); with
    ``need_weights`` also a list with each layer's cross-attention weights (B, heads, T, S).
    ``tgt_is_causal`` is passed to every :class:`~tfm_course.layers.DecoderLayer`.
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int,
                 dropout: float = 0.1, activation: str = "relu", norm_first: bool = False,
                 final_norm: bool = True, layer_norm_eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout=dropout, activation=activation,
                         norm_first=norm_first, bias=bias, layer_norm_eps=layer_norm_eps)
            for _ in range(num_layers))
        self.norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias) if final_norm else None

    def forward(self, x: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, need_weights: bool = False,
                tgt_is_causal: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        weights = []
        for layer in self.layers:
            if need_weights:
                x, w = layer(x, memory, tgt_mask, memory_mask, need_weights=True,
                             tgt_is_causal=tgt_is_causal)
                weights.append(w)
            else:
                x = layer(x, memory, tgt_mask, memory_mask, tgt_is_causal=tgt_is_causal)
        x = self.norm(x) if self.norm is not None else x
        return (x, weights) if need_weights else x

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoder) -> "Decoder":
        """A copy of ``nn.TransformerDecoder`` (its layers and its ``norm``, if any)."""
        ours = cls(0, 1, 1, 1, final_norm=False)
        ours.layers = nn.ModuleList(DecoderLayer.from_torch(layer) for layer in m.layers)
        ours.norm = LayerNorm.from_torch(m.norm) if m.norm is not None else None
        return ours


# --------------------------------------------------------------------------- the model
class Transformer(nn.Module):
    """Encoder-decoder Transformer with token embeddings, sinusoidal positions and an output layer.

    ``forward(src (B, S), tgt_in (B, T)) -> logits (B, T, tgt_vocab_size)``; masks are built from
    ``pad_id``. ``tie_embeddings`` shares the target embedding matrix with the output projection
    (Press & Wolf, 2017; Vaswani et al. also share it with the source embedding when the two
    languages share a vocabulary). All matrices start with Xavier-uniform initialisation.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 512,
                 num_heads: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 d_ff: int = 2048, dropout: float = 0.1, activation: str = "relu",
                 norm_first: bool = False, max_len: int = 512, pad_id: int = 0,
                 tie_embeddings: bool = False, layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        from ..positional import sinusoidal_encoding

        self.d_model, self.pad_id, self.max_len = d_model, pad_id, max_len
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        stack = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
                     activation=activation, norm_first=norm_first, layer_norm_eps=layer_norm_eps)
        self.encoder = Encoder(num_encoder_layers, **stack)
        self.decoder = Decoder(num_decoder_layers, **stack)
        self.out_proj = nn.Linear(d_model, tgt_vocab_size)
        self.reset_parameters()
        if tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform for every matrix (Glorot & Bengio, 2010); vectors keep their init."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed(self, tokens: Tensor, table: nn.Embedding, offset: int = 0) -> Tensor:
        """``(B, T)`` ids -> ``(B, T, d_model)``: embedding · √d_model + PE[offset : offset + T]."""
        _check_tokens(tokens, "tokens")
        check_ids_in_range(tokens, table.num_embeddings)
        if offset + tokens.shape[1] > self.max_len:
            raise ValueError(f"positions up to {offset + tokens.shape[1]} exceed max_len "
                             f"{self.max_len}")
        x = table(tokens) * math.sqrt(self.d_model)
        return self.dropout(x + self.pe[offset:offset + tokens.shape[1]].to(x.dtype))

    def encode(self, src: Tensor) -> Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, d_model)``."""
        return self.encoder(self.embed(src, self.src_embed), mask=source_mask(src, self.pad_id))

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor, tgt_mask: Tensor | None = None,
               need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Decoder input ids ``(B, T)`` and memory -> logits ``(B, T, tgt_vocab)``.

        ``src`` supplies the cross-attention padding mask. With ``need_weights`` also each
        layer's cross-attention weights.

        ``tgt_mask=None`` means the targets are **right-padded** (as
        :meth:`~tfm_course.data.translation.TranslationTask.batch` makes them). Then the causal
        mask alone is exact at every real position (a real query's earlier keys are all real), so
        the self-attention runs with ``is_causal=True`` and no mask tensor, which lets the fused
        kernel use FlashAttention on CUDA. Only padded positions differ from
        :func:`target_mask` (they also read the padding before them), and they are never labels.
        Other padding needs ``tgt_mask=target_mask(tgt_in)``; on CPU tensors a ``<pad>`` before a
        real token raises ``ValueError`` (checked where it is free, as token ids are).
        """
        if memory.shape[:2] != src.shape:
            raise ValueError(f"memory {tuple(memory.shape)} does not belong to src {tuple(src.shape)}")
        if tgt_mask is None:
            _check_right_padded(tgt_in, self.pad_id)
        return self._decode(tgt_in, memory, src, tgt_mask, need_weights)

    def _decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor, tgt_mask: Tensor | None,
                need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """:meth:`decode` without the padding check; ``tgt_mask=None`` means causal only."""
        out = self.decoder(self.embed(tgt_in, self.tgt_embed), memory, tgt_mask,
                           source_mask(src, self.pad_id), need_weights=need_weights,
                           tgt_is_causal=tgt_mask is None)
        if need_weights:
            return self.out_proj(out[0]), out[1]
        return self.out_proj(out)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: logits ``(B, T, tgt_vocab)`` for every position of ``tgt_in`` at once."""
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src {tuple(src.shape)} and tgt_in {tuple(tgt_in.shape)} must share the batch")
        return self.decode(tgt_in, self.encode(src), src)

    def stepper(self, src: Tensor, use_cache: bool = True) -> "Recompute | KVCache":
        """The decoding interface of :mod:`tfm_course.decoding` for source ids ``src`` ``(B, S)``."""
        return (KVCache if use_cache else Recompute)(self, src)

    @classmethod
    def from_torch(cls, m: nn.Transformer, src_vocab_size: int, tgt_vocab_size: int,
                   **kwargs) -> "Transformer":
        """A model whose encoder and decoder stacks are copies of ``nn.Transformer``'s.

        ``nn.Transformer`` has no embeddings or output layer; ours keep their own initialisation.
        """
        layer = m.encoder.layers[0]
        ours = cls(src_vocab_size, tgt_vocab_size, d_model=m.d_model, num_heads=m.nhead,
                   num_encoder_layers=0, num_decoder_layers=0,
                   d_ff=layer.linear1.out_features, dropout=layer.dropout.p,
                   norm_first=layer.norm_first, layer_norm_eps=layer.norm1.eps, **kwargs)
        ours.encoder = Encoder.from_torch(m.encoder)
        ours.decoder = Decoder.from_torch(m.decoder)
        return ours.to(device=layer.linear1.weight.device)


# --------------------------------------------------------------------------- loss
def sequence_loss(logits: Tensor, target: Tensor, pad_id: int = 0,
                  label_smoothing: float = 0.0, never_labels: Sequence[int] = ()) -> Tensor:
    """Mean label-smoothed cross-entropy over the non-pad positions (Szegedy et al., 2016).

    ``logits`` (..., V), ``target`` (...). The smoothed target puts 1 − ε + ε/V on the right token
    and ε/V on every other one, so the loss is (1 − ε)·NLL + ε·mean over classes of −log p, which
    equals ``F.cross_entropy(..., label_smoothing=ε, ignore_index=pad_id)``.

    ``never_labels`` lists token ids that are never a label (``<pad>``, ``<bos>``): the smoothing
    mass skips them, so with V' = V − len(never_labels) the target is 1 − ε + ε/V' on the right
    token, ε/V' on the other possible labels and 0 on the never-labels (the Annotated
    Transformer's ``LabelSmoothing`` zeroes ``<pad>`` the same way). Otherwise the model is
    trained to give ``<pad>`` and ``<bos>`` probability ε/V each, mass that decoding must ban.
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits (..., V) {tuple(logits.shape)} do not match target {tuple(target.shape)}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    V = logits.shape[-1]
    excluded = sorted(set(int(i) for i in never_labels))
    if any(not 0 <= i < V for i in excluded) or len(excluded) >= V:
        raise ValueError(f"never_labels must be ids in [0, {V}) that leave some label, got "
                         f"{list(never_labels)}")
    keep = target != pad_id
    labels = target.masked_fill(~keep, 0)
    check_ids_in_range(labels, V, "target ids")
    if excluded and labels.device.type == "cpu" and bool(
            torch.isin(labels[keep], torch.tensor(excluded)).any()):
        raise ValueError(f"a target id is in never_labels {excluded}: those tokens must never be labels")
    logp = F.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if excluded:
        allowed = torch.ones(V, dtype=torch.bool, device=logits.device)
        allowed[excluded] = False
        uniform = -logp[..., allowed].mean(dim=-1)  # over the V' tokens that can be labels
    else:
        uniform = -logp.mean(dim=-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * uniform
    return (per_token * keep).sum() / keep.sum().clamp(min=1)


# --------------------------------------------------------------------------- decoding steppers
def attend_with_cache(attn: MultiHeadAttention, x: Tensor, past: tuple[Tensor, Tensor] | None
                      ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Causal self-attention for ``n`` new positions ``x`` ``(B, n, d_model)`` that also reads the
    cached keys and values ``past`` ``(B, kv_heads, t, d_head)`` of the ``t`` positions before them.

    Returns the output ``(B, n, d_model)`` and the keys and values of all ``t + n`` positions, the
    new cache. It uses ``attn``'s own projections, so its rows equal the last ``n`` rows of ``attn``
    run on the whole sequence with a causal mask. Inference only: no attention dropout.
    """
    if attn.rotary is not None:
        raise ValueError("the KV cache does not support rotary attention (RoPE) yet")
    q = split_heads(attn.q_proj(x), attn.num_heads)  # (B, heads, n, d_head)
    k = split_heads(attn.k_proj(x), attn.num_kv_heads)  # (B, kv_heads, n, d_head)
    v = split_heads(attn.v_proj(x), attn.num_kv_heads)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    n, total = x.shape[1], k.shape[2]
    group = attn.num_heads // attn.num_kv_heads  # grouped-query: each K/V head serves `group`
    keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if n == 1:  # the newest query may read every key: no mask
        out = F.scaled_dot_product_attention(q, keys, values)
    else:  # query i (at position total - n + i) reads keys up to its own position
        mask = torch.ones(n, total, dtype=torch.bool, device=x.device).tril(diagonal=total - n)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return attn.out_proj(merge_heads(out)), (k, v)


class Recompute:
    """No cache: the whole decoder runs on the whole prefix at every step.

    Generating T tokens costs 1 + 2 + … + T = O(T²) token passes through the decoder's linear
    layers, and O(T³) in its self-attention (step t compares t queries with t keys); the
    cross-attention keys and values of the source are recomputed at every step too.
    """

    def __init__(self, model: Transformer, src: Tensor) -> None:
        self.model, self.src = model, src
        self.memory = model.encode(src)  # (B, S, d_model)

    def __call__(self, prefix: Tensor) -> Tensor:
        # causal only (is_causal=True, no mask tensor), as in KVCache: every token of a prefix,
        # whatever its id, is a key for the queries after it
        return self.model._decode(prefix, self.memory, self.src, None)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.src, self.memory = self.src[index], self.memory[index]


class KVCache:
    """Incremental decoding: each call runs only the positions it has not seen yet.

    Per decoder layer it keeps the self-attention keys and values of every earlier position,
    ``(B, kv_heads, t, d_head)`` each, and the cross-attention keys and values of the source,
    ``(B, kv_heads, S, d_head)`` each, computed once. Generating T tokens then costs O(T) token
    passes through the linear layers and O(T²) in self-attention. :meth:`nbytes` counts both
    parts: the self-attention part grows by ``2·layers·kv_heads·d_head`` numbers per token and
    sequence (:func:`tfm_course.attention.kv_cache_bytes`); the cross-attention part is that much
    per *source* token, from the start.
    """

    def __init__(self, model: Transformer, src: Tensor) -> None:
        self.model = model
        memory = model.encode(src)
        self.memory_mask = source_mask(src, model.pad_id)  # (B, 1, 1, S)
        self.cross: list[tuple[Tensor, Tensor]] = []
        for layer in model.decoder.layers:
            attn = layer.cross_attn
            if attn.rotary is not None:
                raise ValueError("KVCache does not support rotary cross-attention")
            self.cross.append((split_heads(attn.k_proj(memory), attn.num_kv_heads),
                               split_heads(attn.v_proj(memory), attn.num_kv_heads)))
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * len(model.decoder.layers)
        self.length = 0  # positions processed so far

    def _cross_attention(self, i: int, attn: MultiHeadAttention, x: Tensor) -> Tensor:
        q = split_heads(attn.q_proj(x), attn.num_heads)
        group = attn.num_heads // attn.num_kv_heads
        k, v = (t.repeat_interleave(group, 1) for t in self.cross[i])
        out = scaled_dot_product_attention(q, k, v, mask=self.memory_mask)  # no NaN on empty rows
        return attn.out_proj(merge_heads(out))

    def __call__(self, prefix: Tensor) -> Tensor:
        if prefix.shape[1] <= self.length:
            raise ValueError(f"KVCache has seen {self.length} positions, so the prefix must have "
                             f"more than {self.length}; got {tuple(prefix.shape)}")
        model = self.model
        x = model.embed(prefix[:, self.length:], model.tgt_embed, offset=self.length)  # (B, n, d)
        for i, layer in enumerate(model.decoder.layers):
            if layer.norm_first:
                attended, self.self_kv[i] = attend_with_cache(layer.self_attn, layer.norm1(x),
                                                              self.self_kv[i])
                x = x + attended
                x = x + self._cross_attention(i, layer.cross_attn, layer.norm2(x))
                x = x + layer.ffn(layer.norm3(x))
            else:
                attended, self.self_kv[i] = attend_with_cache(layer.self_attn, x, self.self_kv[i])
                x = layer.norm1(x + attended)
                x = layer.norm2(x + self._cross_attention(i, layer.cross_attn, x))
                x = layer.norm3(x + layer.ffn(x))
        if model.decoder.norm is not None:
            x = model.decoder.norm(x)
        self.length = prefix.shape[1]
        return model.out_proj(x[:, -1])

    def reorder(self, index: Tensor) -> None:
        self.memory_mask = self.memory_mask[index]
        self.cross = [(k[index], v[index]) for k, v in self.cross]
        self.self_kv = [None if kv is None else (kv[0][index], kv[1][index]) for kv in self.self_kv]

    def nbytes(self) -> int:
        """Bytes held by the cache now: self-attention keys/values plus the cross-attention ones."""
        tensors = [t for kv in self.cross + [kv for kv in self.self_kv if kv is not None] for t in kv]
        return sum(t.numel() * t.element_size() for t in tensors)
