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
top-k and top-p), :func:`greedy_search` (from ``<bos>``, for encoder-decoders) and
:func:`beam_search` (K live hypotheses plus a list of finished ones, as fairseq and Hugging Face do).
:func:`sample`, :func:`top_k_filter` and :func:`top_p_filter` turn logits into a token.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import Tensor, nn

from .attention import causal_mask, merge_heads, scaled_dot_product_attention, split_heads
from .models.transformer import Transformer, source_mask

__all__ = ["greedy_search", "beam_search", "length_penalty", "Recompute", "KVCache",
           "greedy_decode", "beam_decode"]


class Stepper(Protocol):
    def __call__(self, prefix: Tensor) -> Tensor: ...
    def reorder(self, index: Tensor) -> None: ...


# --------------------------------------------------------------------------- searches
def greedy_search(next_logits: Callable[[Tensor], Tensor], batch_size: int, bos_id: int,
                  eos_id: int, max_len: int, pad_id: int = 0,
                  device: torch.device | str | None = None) -> Tensor:
    """Pick the most likely token at every step; returns ``(batch, L)`` with ``L <= max_len``.

    ``next_logits(prefix (batch, t)) -> (batch, V)``; the prefix starts with ``<bos>``. The output
    holds the generated tokens (no ``<bos>``), ``<eos>`` included, and ``pad_id`` after it. It stops
    early once every sequence has produced ``<eos>``.
    """
    if batch_size <= 0 or max_len <= 0:
        raise ValueError(f"batch_size and max_len must be positive, got {batch_size}, {max_len}")
    prefix = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    for _ in range(max_len):
        logits = next_logits(prefix)
        if logits.dim() != 2 or logits.shape[0] != batch_size:
            raise ValueError(f"next_logits must return (batch={batch_size}, V), got {tuple(logits.shape)}")
        token = logits.argmax(dim=-1).masked_fill(done, pad_id)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        done = done | (token == eos_id)
        if bool(done.all()):
            break
    return prefix[:, 1:]


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^α. Beam search ranks by log p(Y) / lp(Y)."""
    return ((5.0 + length.float()) / 6.0) ** alpha


def beam_search(stepper: Stepper, batch_size: int, beam_size: int, bos_id: int, eos_id: int,
                max_len: int, alpha: float = 0.6, pad_id: int = 0,
                device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best hypotheses per example; return the best ``(batch, L)`` and its score.

    The stepper sees ``batch_size * beam_size`` rows (example-major: rows ``b*K … b*K+K-1`` are the
    beams of example ``b``). Hypotheses are ranked by length-normalised log-probability
    (:func:`length_penalty`; ``alpha=0`` is the plain sum). A finished hypothesis (it produced
    ``<eos>``) keeps its score and length and is only extended with padding. Returns the tokens
    (no ``<bos>``, ``pad_id`` after ``<eos>``) and the normalised scores ``(batch,)``.
    """
    if beam_size <= 0 or batch_size <= 0 or max_len <= 0:
        raise ValueError(f"batch_size, beam_size and max_len must be positive, got "
                         f"{batch_size}, {beam_size}, {max_len}")
    B, K = batch_size, beam_size
    prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    logp_sum = torch.zeros(B, K, device=device)
    logp_sum[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    length = torch.zeros(B, K, dtype=torch.long, device=device)
    done = torch.zeros(B, K, dtype=torch.bool, device=device)
    for _ in range(max_len):
        logits = stepper(prefix)
        V = logits.shape[-1]
        if logits.shape != (B * K, V):
            raise ValueError(f"the stepper must return (batch*beam={B * K}, V), got {tuple(logits.shape)}")
        logp = torch.log_softmax(logits.float(), dim=-1).view(B, K, V)
        # a finished beam may only be extended by padding, at no cost
        pad_only = torch.full((V,), float("-inf"), device=logp.device)
        pad_only[pad_id] = 0.0
        logp = torch.where(done[..., None], pad_only, logp)
        cand_sum = logp_sum[..., None] + logp  # (B, K, V)
        cand_len = (length + (~done).long())[..., None].expand(B, K, V)
        cand_score = cand_sum / length_penalty(cand_len, alpha)
        best = cand_score.view(B, K * V).topk(K, dim=-1).indices  # (B, K)
        beam, token = best // V, best % V
        logp_sum = cand_sum.view(B, K * V).gather(1, best)
        length = cand_len.reshape(B, K * V).gather(1, best)
        done = done.gather(1, beam) | (token == eos_id)
        rows = (beam + torch.arange(B, device=beam.device)[:, None] * K).view(-1)
        stepper.reorder(rows)
        prefix = torch.cat([prefix[rows], token.view(-1, 1)], dim=1)
        if bool(done.all()):
            break
    score = logp_sum / length_penalty(length, alpha)
    top = score.argmax(dim=-1)  # (B,)
    rows = top + torch.arange(B, device=top.device) * K
    return prefix[rows, 1:], score.gather(1, top[:, None]).squeeze(1)


# --------------------------------------------------------------------------- steppers
class Recompute:
    """No cache: the whole decoder runs on the whole prefix at each step."""

    def __init__(self, model: Transformer, src: Tensor) -> None:
        self.model, self.src = model, src
        self.memory = model.encode(src)

    def __call__(self, prefix: Tensor) -> Tensor:
        mask = causal_mask(prefix.shape[1], device=prefix.device)  # no padding inside a prefix
        return self.model.decode(prefix, self.memory, self.src, tgt_mask=mask)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.src, self.memory = self.src[index], self.memory[index]


def _heads(proj: nn.Linear, x: Tensor, num_heads: int) -> Tensor:
    return split_heads(proj(x), num_heads)  # (B, heads, seq, d_head)


def _repeat_kv(attn: nn.Module, t: Tensor) -> Tensor:
    group = attn.num_heads // attn.num_kv_heads
    return t if group == 1 else t.repeat_interleave(group, dim=1)


class KVCache:
    """Incremental decoding: each call processes only ``prefix[:, -1]``, the newest token.

    Per decoder layer it stores the self-attention keys and values of every earlier position
    ``(B, heads, t, d_head)`` and the cross-attention keys and values of the memory
    ``(B, heads, S, d_head)``, computed once. The attention itself uses the layer's own
    projections (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and
    :func:`~tfm_course.attention.scaled_dot_product_attention`, so the result equals
    :class:`Recompute` up to float rounding.
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
            k = _repeat_kv(attn, _heads(attn.k_proj, memory, attn.num_kv_heads))
            v = _repeat_kv(attn, _heads(attn.v_proj, memory, attn.num_kv_heads))
            self.cross.append((k, v))
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * len(model.decoder.layers)
        self.length = 0  # positions processed so far

    def _self_attention(self, i: int, attn: nn.Module, x: Tensor) -> Tensor:
        if attn.rotary is not None:
            raise ValueError("KVCache does not support rotary self-attention")
        q = _heads(attn.q_proj, x, attn.num_heads)  # (B, h, 1, d_head)
        k = _repeat_kv(attn, _heads(attn.k_proj, x, attn.num_kv_heads))
        v = _repeat_kv(attn, _heads(attn.v_proj, x, attn.num_kv_heads))
        if self.self_kv[i] is not None:
            k = torch.cat([self.self_kv[i][0], k], dim=2)  # (B, h, t+1, d_head)
            v = torch.cat([self.self_kv[i][1], v], dim=2)
        self.self_kv[i] = (k, v)
        # the newest query may read every cached key: the causal mask is implicit
        return attn.out_proj(merge_heads(scaled_dot_product_attention(q, k, v)))

    def _cross_attention(self, i: int, attn: nn.Module, x: Tensor) -> Tensor:
        q = _heads(attn.q_proj, x, attn.num_heads)
        k, v = self.cross[i]
        out = scaled_dot_product_attention(q, k, v, mask=self.memory_mask)
        return attn.out_proj(merge_heads(out))

    def __call__(self, prefix: Tensor) -> Tensor:
        if prefix.shape[1] != self.length + 1:
            raise ValueError(f"KVCache has seen {self.length} positions, so the prefix must have "
                             f"{self.length + 1}; got {tuple(prefix.shape)}")
        model = self.model
        x = model.embed(prefix[:, -1:], model.tgt_embed, offset=self.length)  # (B, 1, d)
        for i, layer in enumerate(model.decoder.layers):
            if layer.norm_first:
                x = x + self._self_attention(i, layer.self_attn, layer.norm1(x))
                x = x + self._cross_attention(i, layer.cross_attn, layer.norm2(x))
                x = x + layer.ffn(layer.norm3(x))
            else:
                x = layer.norm1(x + self._self_attention(i, layer.self_attn, x))
                x = layer.norm2(x + self._cross_attention(i, layer.cross_attn, x))
                x = layer.norm3(x + layer.ffn(x))
        if model.decoder.norm is not None:
            x = model.decoder.norm(x)
        self.length += 1
        return model.out_proj(x)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.memory_mask = self.memory_mask[index]
        self.cross = [(k[index], v[index]) for k, v in self.cross]
        self.self_kv = [None if kv is None else (kv[0][index], kv[1][index]) for kv in self.self_kv]


# --------------------------------------------------------------------------- for a model
def _never_special(stepper: Stepper, banned: tuple[int, ...]) -> Stepper:
    """Wrap a stepper so that it never proposes ``<pad>`` or ``<bos>``."""

    class Banned:
        def __call__(self, prefix: Tensor) -> Tensor:
            logits = stepper(prefix).clone()
            logits[:, list(banned)] = float("-inf")
            return logits

        def reorder(self, index: Tensor) -> None:
            stepper.reorder(index)

    return Banned()


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len: int,
                  use_cache: bool = True) -> Tensor:
    """Greedy translations ``(B, L)`` of ``src`` ``(B, S)``; ``use_cache`` picks :class:`KVCache`."""
    was_training = model.training
    model.eval()
    stepper = (KVCache if use_cache else Recompute)(model, src)
    stepper = _never_special(stepper, (model.pad_id, bos_id))
    out = greedy_search(stepper, src.shape[0], bos_id, eos_id, max_len, model.pad_id, src.device)
    model.train(was_training)
    return out


@torch.no_grad()
def beam_decode(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len: int,
                beam_size: int = 4, alpha: float = 0.6,
                use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """Beam-search translations ``(B, L)`` of ``src`` and their normalised log-probabilities."""
    was_training = model.training
    model.eval()
    src_beams = src.repeat_interleave(beam_size, dim=0)  # (B*K, S), example-major
    stepper = (KVCache if use_cache else Recompute)(model, src_beams)
    stepper = _never_special(stepper, (model.pad_id, bos_id))
    out = beam_search(stepper, src.shape[0], beam_size, bos_id, eos_id, max_len, alpha,
                      model.pad_id, src.device)
    model.train(was_training)
    return out
