"""T5 (Raffel et al., 2020): an encoder-decoder Transformer that reads and writes text.

    model = T5(T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4))
    logits = model(input_ids, decoder_input_ids, attention_mask)     # (batch, T, vocab_size)
    tokens = model.generate(input_ids, attention_mask, max_new_tokens=20)

Where it departs from the 2017 Transformer (:mod:`tfm_course.models.transformer`):

* **no position embeddings**: a learned scalar per (relative-distance bucket, head) is added to
  the attention scores (:class:`~tfm_course.positional.T5RelativeBias`). Only the first block of
  each stack owns the table; the bias it computes is passed to every other block. The encoder's
  buckets are bidirectional, the decoder's causal; cross-attention has no position bias;
* **no 1/√d_kv** in the scores: the query projection's initialisation is √d_kv smaller instead;
* **RMS-style LayerNorm** (no mean subtraction, no bias; :class:`~tfm_course.layers.RMSNorm`),
  **pre-norm**, and a final norm after each stack; no bias anywhere;
* **one embedding matrix** for the encoder input, the decoder input and (T5 v1.0) the output
  layer, whose input is then scaled by d_model^-1/2; embeddings are *not* scaled by √d_model;
* a ReLU feed-forward block (v1.0) or a gated-GELU one (``feed_forward="gated-gelu"``, v1.1).

Masks are bool, True = real token / may attend. The decoder starts from ``decoder_start_id``
(= ``pad_id`` = 0 in T5) and stops at ``eos_id`` (1). The blocks live in
:mod:`tfm_course.models.t5_blocks`, the sizes (:class:`T5Config`) in :mod:`tfm_course.models.t5_config`,
Hugging Face's weight names in :mod:`tfm_course.models.t5_hf`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ..decoding import greedy_search
from ..layers import FeedForward, RMSNorm
from ..positional import T5RelativeBias
from .t5_blocks import (BlockCache, GatedGELU, T5Attention, T5Block, T5Stack, attention_bias,
                        causal_mask_last, prefix_lm_mask)
from .t5_config import T5Config
from .t5_hf import hf_state_to_ours, read_hf_folder

__all__ = ["T5Config", "T5", "T5Stepper", "shift_right", "init_t5_weights",
           # the building blocks, from t5_blocks
           "attention_bias", "causal_mask_last", "prefix_lm_mask", "T5Attention", "GatedGELU",
           "T5Block", "T5Stack"]


def _check_ids(ids: Tensor, name: str) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integer token ids (batch, seq), got "
                         f"{getattr(ids, 'shape', type(ids))} {getattr(ids, 'dtype', '')}")


def shift_right(labels: Tensor, start_id: int = 0) -> Tensor:
    """Teacher forcing: decoder input = ``[start, labels[:-1]]`` per row, ``(B, T) -> (B, T)``."""
    _check_ids(labels, "labels")
    start = torch.full_like(labels[:, :1], start_id)
    return torch.cat([start, labels[:, :-1]], dim=1)


@torch.no_grad()
def init_t5_weights(model: nn.Module, config: T5Config) -> None:
    """Mesh TensorFlow's initialisation, as in T5: normal with these standard deviations.

    Embedding (``model.shared``) 1; q (d_model·d_kv)^-1/2 (the missing 1/√d_kv of the scores lives
    here); k, v d_model^-1/2; o (heads·d_kv)^-1/2; FFN in d_model^-1/2, out d_ff^-1/2; relative
    bias d_model^-1/2; an untied output layer (``model.lm_head``) d_model^-1/2; norms 1. Used by
    :class:`T5` and by the single-stack models of :mod:`tfm_course.models.t5_lm`.
    """
    c = config
    nn.init.normal_(model.shared.weight, std=1.0)
    if model.lm_head.weight is not model.shared.weight:  # tied: the embedding's init stands
        nn.init.normal_(model.lm_head.weight, std=c.d_model ** -0.5)
    for m in model.modules():
        if isinstance(m, T5Attention):
            nn.init.normal_(m.q.weight, std=(c.d_model * c.d_kv) ** -0.5)
            nn.init.normal_(m.k.weight, std=c.d_model ** -0.5)
            nn.init.normal_(m.v.weight, std=c.d_model ** -0.5)
            nn.init.normal_(m.o.weight, std=(c.num_heads * c.d_kv) ** -0.5)
        elif isinstance(m, FeedForward):  # ReLU: linear1, linear2
            nn.init.normal_(m.linear1.weight, std=c.d_model ** -0.5)
            nn.init.normal_(m.linear2.weight, std=c.d_ff ** -0.5)
        elif isinstance(m, GatedGELU):
            nn.init.normal_(m.gate.weight, std=c.d_model ** -0.5)
            nn.init.normal_(m.up.weight, std=c.d_model ** -0.5)
            nn.init.normal_(m.down.weight, std=c.d_ff ** -0.5)
        elif isinstance(m, T5RelativeBias):
            nn.init.normal_(m.embedding.weight, std=c.d_model ** -0.5)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)


# --------------------------------------------------------------------------- the model
class T5(nn.Module):
    """Shared embedding, encoder stack, decoder stack, output layer (tied by default)."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config, self.pad_id = config, config.pad_id
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, config.num_layers, cross_attention=False, bidirectional=True)
        self.decoder = T5Stack(config, config.num_decoder_layers, cross_attention=True,
                               bidirectional=False)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    def reset_parameters(self) -> None:
        """Mesh TensorFlow's initialisation, as in T5 (:func:`init_t5_weights`)."""
        init_t5_weights(self, self.config)

    @staticmethod
    def _source_mask(shape: torch.Size, attention_mask: Tensor | None) -> Tensor | None:
        """Check a bool ``(batch, src_len)`` source mask (True on real tokens); None stays None."""
        if attention_mask is not None and (not isinstance(attention_mask, Tensor)
                                           or attention_mask.dtype != torch.bool
                                           or attention_mask.shape != shape):
            raise ValueError(f"attention_mask must be bool (batch, src_len) = {tuple(shape)}, True on "
                             f"real tokens; got {getattr(attention_mask, 'shape', type(attention_mask))} "
                             f"{getattr(attention_mask, 'dtype', '')}")
        return None if attention_mask is None else attention_mask[:, None, None, :]  # (B, 1, 1, S)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``(B, S)`` ids -> memory ``(B, S, d_model)``; padded keys (mask False) are never read."""
        _check_ids(input_ids, "input_ids")
        return self.encoder(self.shared(input_ids), self._source_mask(input_ids.shape, attention_mask))

    def decode(self, decoder_input_ids: Tensor, memory: Tensor, attention_mask: Tensor | None = None,
               caches: list[BlockCache] | None = None, past: int = 0) -> Tensor:
        """Decoder ids ``(B, T)`` -> logits ``(B, T, vocab)``; ``attention_mask`` is the source's.

        With ``caches`` (one per decoder block), ``decoder_input_ids`` are the tokens after the
        ``past`` ones already cached.
        """
        _check_ids(decoder_input_ids, "decoder_input_ids")
        if memory.dim() != 3 or memory.shape[0] != decoder_input_ids.shape[0]:
            raise ValueError(f"memory must be (batch={decoder_input_ids.shape[0]}, src_len, d_model), "
                             f"got {tuple(memory.shape)}")
        memory_mask = self._source_mask(memory.shape[:2], attention_mask)
        n = decoder_input_ids.shape[1]
        causal = causal_mask_last(n, past + n, decoder_input_ids.device)
        x = self.decoder(self.shared(decoder_input_ids), causal, memory, memory_mask, caches, past)
        if self.config.rescale_output:
            x = x * self.config.d_model ** -0.5
        return self.lm_head(x)

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor,
                attention_mask: Tensor | None = None) -> Tensor:
        """Teacher forcing: logits ``(B, T, vocab)``; ``attention_mask`` bool ``(B, S)``, True on
        real tokens (None: no padding)."""
        _check_ids(input_ids, "input_ids")
        _check_ids(decoder_input_ids, "decoder_input_ids")
        if input_ids.shape[0] != decoder_input_ids.shape[0]:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and decoder_input_ids "
                             f"{tuple(decoder_input_ids.shape)} must share the batch")
        return self.decode(decoder_input_ids, self.encode(input_ids, attention_mask), attention_mask)

    # ----------------------------------------------------------------------- generation
    def stepper(self, src: Tensor, use_cache: bool = True,
                attention_mask: Tensor | None = None) -> "T5Stepper":
        """A stepper for :mod:`tfm_course.decoding`; the mask defaults to ``src != pad_id``."""
        return T5Stepper(self, src, use_cache, attention_mask)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 max_new_tokens: int = 20, use_cache: bool = True) -> Tensor:
        """Greedy decoding ``(B, L <= max_new_tokens)``: no start token, ``eos_id`` kept, ``pad_id``
        after it. The mask defaults to ``input_ids != pad_id``."""
        was_training = self.training
        self.eval()
        try:
            stepper = self.stepper(input_ids, use_cache, attention_mask)
            return greedy_search(stepper, input_ids.shape[0], self.config.decoder_start_id,
                                 self.config.eos_id, max_new_tokens, self.pad_id, input_ids.device)
        finally:
            self.train(was_training)

    # ----------------------------------------------------------------------- Hugging Face
    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> "T5":
        """A copy of a Hugging Face ``T5ForConditionalGeneration`` (same logits in fp32), on its
        device and in its train / eval mode."""
        config = T5Config.from_hf(hf_model.config)
        state = hf_model.state_dict()
        if hf_model.lm_head.weight.data_ptr() == hf_model.shared.weight.data_ptr():
            state.pop("lm_head.weight", None)  # tied
        model = cls._from_hf_state(config, state).to(hf_model.shared.weight.device)
        return model.train(hf_model.training)

    @classmethod
    def from_pretrained(cls, folder: str | Path, sha256: str | None = None) -> "T5":
        """Load a ``save_pretrained`` folder (``config.json`` + ``model.safetensors`` or
        ``pytorch_model.bin``) without importing ``transformers``; ``sha256`` pins the weights file.

        Returns the model on the CPU in ``eval()`` mode (dropout off), as Hugging Face does.
        """
        config_dict, state = read_hf_folder(folder, sha256)
        if "lm_head.weight" in state and torch.equal(state["lm_head.weight"], state["shared.weight"]):
            state.pop("lm_head.weight")  # tied, saved twice
        return cls._from_hf_state(T5Config.from_hf(config_dict), state).eval()

    @classmethod
    def _from_hf_state(cls, config: T5Config, state: dict[str, Tensor]) -> "T5":
        """Our model from Hugging Face's state dict: untied iff it has its own ``lm_head.weight``."""
        config.tie_embeddings = "lm_head.weight" not in state
        model = cls(config)
        missing, unexpected = model.load_state_dict(hf_state_to_ours(state), strict=False)
        missing = [k for k in missing if not (config.tie_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"Hugging Face T5 weights do not fit: missing {missing}, "
                             f"unexpected {unexpected}")
        return model


class T5Stepper:
    """The :mod:`tfm_course.decoding` stepper of a :class:`T5`: ``stepper(prefix (N, t)) -> (N, vocab)``.

    The source is encoded once. Without a cache, each call runs the decoder on the whole prefix.
    With one, each call runs only the tokens not seen yet: every decoder block appends their
    self-attention keys and values to its cache, and computes its cross-attention keys and
    values from the memory once, on the first call. ``reorder(index)`` picks (or repeats) rows.
    """

    def __init__(self, model: T5, src: Tensor, use_cache: bool = True,
                 attention_mask: Tensor | None = None) -> None:
        _check_ids(src, "src")
        if attention_mask is None:
            attention_mask = src != model.pad_id
        self.model, self.use_cache = model, use_cache
        model._source_mask(src.shape, attention_mask)  # checks it
        self.mask = attention_mask
        self.memory = model.encode(src, self.mask)  # (N, S, d_model)
        self.caches = [BlockCache() for _ in model.decoder.blocks] if use_cache else None
        self.seen = 0

    def __call__(self, prefix: Tensor) -> Tensor:
        _check_ids(prefix, "prefix")
        if prefix.shape[0] != self.memory.shape[0]:
            raise ValueError(f"prefix has {prefix.shape[0]} rows, the source {self.memory.shape[0]}")
        if not self.use_cache:
            return self.model.decode(prefix, self.memory, self.mask)[:, -1]
        if prefix.shape[1] <= self.seen:
            raise ValueError(f"the cache holds {self.seen} positions: the prefix must be longer, "
                             f"got {tuple(prefix.shape)}")
        logits = self.model.decode(prefix[:, self.seen:], self.memory, self.mask, self.caches, self.seen)
        self.seen = prefix.shape[1]
        return logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.memory, self.mask = self.memory[index], self.mask[index]
        for cache in self.caches or []:
            cache.reorder(index)
