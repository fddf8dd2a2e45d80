"""GPT: a decoder-only Transformer trained to predict the next token (Radford et al., 2018; 2019).

    config = GPTConfig(vocab_size=65, max_len=64, d_model=128, n_layers=4, n_heads=4)
    model = GPT(config)
    logits, loss = model(ids, targets)   # ids (B, T); targets = the next tokens, ids shifted by one
    out = model.generate(prompt, max_new_tokens=100, temperature=0.8, top_k=200)

GPT-2's layout, which this file follows:

1. a token embedding plus a *learned* position embedding, then dropout;
2. ``n_layers`` pre-LN blocks (:class:`Block`): ``x = x + attn(norm1(x))`` with a causal mask,
   then ``x = x + ffn(norm2(x))`` with a 4·d_model GELU feed-forward layer;
3. a final LayerNorm and an output layer that *is* the token embedding (weight tying).

The loss is the cross-entropy of every position at once against its next token; the causal mask
is what makes that honest (position t never sees t + 1). Decoding goes through
:mod:`tfm_course.decoding` with the steppers at the end of this file: :class:`Recompute` runs the
whole prefix at every step, :class:`KVCache` only the new tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import decoding
from ..attention import merge_heads, split_heads
from ..layers import FeedForward, LayerNorm
from .gpt_hf import config_from_hf, copy_hf_weights, load_hf_gpt2
from .transformer import check_ids_in_range

__all__ = ["GPTConfig", "GPT", "Block", "CausalSelfAttention", "TanhGELUFeedForward", "Recompute",
           "KVCache"]

IGNORE_INDEX = -100  # a target equal to this is left out of the loss (PyTorch's default)


@dataclass
class GPTConfig:
    """The sizes of a GPT. ``activation``: ``"gelu_tanh"`` (GPT-2; Hugging Face's ``gelu_new``) or
    ``"gelu"`` (the exact GELU, as nanoGPT uses)."""

    vocab_size: int
    max_len: int
    d_model: int
    n_layers: int
    n_heads: int
    dropout: float = 0.0
    bias: bool = True
    activation: str = "gelu_tanh"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'gelu' or 'gelu_tanh', got {self.activation!r}")


class TanhGELUFeedForward(FeedForward):
    """:class:`~tfm_course.layers.FeedForward` with GELU's tanh approximation, as GPT-2 computes it:
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (Hendrycks & Gimpel, 2016)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__(d_model, d_ff, activation="gelu", dropout=dropout, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(F.gelu(self.linear1(x), approximate="tanh")))


class CausalSelfAttention(nn.Module):
    """GPT-2's masked multi-head self-attention: ``(B, T, d_model) -> (B, T, d_model)``.

    The maths of :class:`~tfm_course.attention.MultiHeadAttention` called with ``is_causal=True``
    (chapter 8 asserts it), except that **one** ``(d_model -> 3·d_model)`` layer, ``qkv``, makes
    the queries, keys and values: the three projection matrices stacked, as GPT-2's ``c_attn``
    and nanoGPT store them. One matrix multiply instead of three, forward and backward, is what
    lets this GPT train as fast as nanoGPT's (``tools/bench/bench_gpt.py``). ``is_causal=True`` lets
    PyTorch's fused kernel (FlashAttention on a recent GPU) skip the masked half of the scores
    without ever reading a ``(T, T)`` mask.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # [W_q | W_k | W_v], GPT-2's c_attn
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # GPT-2's c_proj

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(B, T, d_model)`` -> queries, keys and values, each ``(B, heads, T, d_head)``."""
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)
        return split_heads(q, self.n_heads), split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x)
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out_proj(merge_heads(out))

    def step(self, x: Tensor, past: tuple[Tensor, Tensor] | None
             ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The KV cache: attention for ``n`` new positions ``x`` ``(B, n, d_model)`` that also
        reads the keys and values ``past`` ``(B, heads, t, d_head)`` of the ``t`` positions
        before them. Returns the output ``(B, n, d_model)`` and the keys and values of all
        ``t + n`` positions. Inference only (no dropout)."""
        q, k, v = self.project(x)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        n, total = x.shape[1], k.shape[2]
        if n == 1:  # the newest query may read every key: no mask at all
            out = F.scaled_dot_product_attention(q, k, v)
        elif n == total:  # nothing cached yet (the prompt): plain causal attention
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # query i sits at position total - n + i and reads keys up to it
            mask = torch.ones(n, total, dtype=torch.bool, device=x.device).tril(diagonal=total - n)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(merge_heads(out)), (k, v)


class Block(nn.Module):
    """A pre-LN decoder block without cross-attention: ``(B, T, d_model) -> (B, T, d_model)``.

    ``x = x + dropout(attn(norm1(x)));  x = x + dropout(ffn(norm2(x)))``, with
    :class:`CausalSelfAttention` and the package's ``LayerNorm`` and ``FeedForward``
    (:mod:`tfm_course.layers`).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, p = config.d_model, config.dropout
        self.norm1 = LayerNorm(d, bias=config.bias)
        self.attn = CausalSelfAttention(d, config.n_heads, bias=config.bias, dropout=p)
        self.norm2 = LayerNorm(d, bias=config.bias)
        if config.activation == "gelu_tanh":
            self.ffn = TanhGELUFeedForward(d, 4 * d, bias=config.bias)
        else:
            self.ffn = FeedForward(d, 4 * d, activation="gelu", bias=config.bias)
        self.dropout = nn.Dropout(p)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))


class GPT(nn.Module):
    """A GPT language model; ``forward(ids (B, T), targets=None) -> (logits (B, T, V), loss)``.

    ``targets`` ``(B, T)`` holds the next token of every position (``IGNORE_INDEX`` = -100 where
    there is none); ``loss`` is then the mean cross-entropy, else ``None``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_embed.weight  # tied: one tensor (Press & Wolf, 2017)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) for every matrix and embedding, zero biases, and
        N(0, 0.02/√(2·n_layers)) for the two projections that write into the residual stream in
        each block, so the stream's variance does not grow with depth (2·n_layers additions)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.out_proj, block.ffn.linear2):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layers))

    def embed(self, ids: Tensor, offset: int = 0) -> Tensor:
        """``(B, T)`` ids at positions ``offset … offset+T-1`` -> ``(B, T, d_model)``."""
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"ids must be integer token ids (batch, seq), got {tuple(ids.shape)} "
                             f"{ids.dtype}")
        if offset + ids.shape[1] > self.config.max_len:
            raise ValueError(f"positions up to {offset + ids.shape[1]} exceed max_len "
                             f"{self.config.max_len}")
        check_ids_in_range(ids, self.config.vocab_size)
        positions = torch.arange(offset, offset + ids.shape[1], device=ids.device)
        return self.dropout(self.tok_embed(ids) + self.pos_embed(positions))

    def features(self, ids: Tensor) -> Tensor:
        """The final normalised hidden states ``(B, T, d_model)``, before the output layer."""
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, ids: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        logits = self.lm_head(self.features(ids))  # (B, T, V)
        if targets is None:
            return logits, None
        if targets.shape != ids.shape:
            raise ValueError(f"targets {tuple(targets.shape)} must have the shape of ids "
                             f"{tuple(ids.shape)}: the next token of every position")
        check_ids_in_range(targets.masked_fill(targets == IGNORE_INDEX, 0), self.config.vocab_size,
                           "target ids")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    # ----------------------------------------------------------------------- generation
    def stepper(self, use_cache: bool = True) -> "Recompute | KVCache":
        """The decoding interface of :mod:`tfm_course.decoding` (the prompt is the first prefix)."""
        return KVCache(self) if use_cache else Recompute(self)

    @torch.no_grad()
    def generate(self, ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 eos_id: int | None = None, min_p: float | None = None) -> Tensor:
        """Continue the prompt ``ids`` ``(B, t0)``: returns ``(B, t0 + max_new_tokens)`` (fewer
        with ``eos_id``, once every row has produced it).

        ``temperature=0`` is greedy; see :func:`tfm_course.decoding.sample`. The prompt plus the
        new tokens must fit in ``max_len`` (learned positions stop there). The model runs in
        ``eval()`` mode and gets its training flag back afterwards.
        """
        if ids.dim() == 2 and ids.shape[1] + max_new_tokens > self.config.max_len:
            raise ValueError(f"the prompt ({ids.shape[1]} tokens) plus max_new_tokens "
                             f"({max_new_tokens}) exceed max_len {self.config.max_len}")
        was_training = self.training
        self.eval()
        try:
            return decoding.generate(self.stepper(use_cache), ids, max_new_tokens, temperature,
                                     top_k, top_p, generator, eos_id=eos_id, min_p=min_p)
        finally:
            self.train(was_training)

    # ----------------------------------------------------------------------- cost
    def matmul_params(self) -> int:
        """Weights that take part in a matrix multiply, per token: 12·d² per block (Q, K, V and
        output projections 4·d², feed-forward 8·d²) and V·d for the tied output layer. Position
        and token *lookups*, biases and norms do no multiplies of this kind."""
        d, c = self.config.d_model, self.config
        return c.n_layers * 12 * d * d + c.vocab_size * d

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, forward and backward: 6·N + 12·n_layers·d_model·T.

        A weight does one multiply-add (2 FLOPs) per token forward and two backward (the input's
        and its own gradient): 6 per weight, N = :meth:`matmul_params`. Attention adds q·kᵀ and
        weights·v, 2·2·T·d per token and layer forward, times 3 with the backward pass; a kernel
        computes the masked half of the T × T scores too, so the whole T counts (Chowdhery et al.,
        2022, appendix B; nanoGPT's ``estimate_mfu``). ``seq_len`` defaults to ``max_len``.
        """
        T = self.config.max_len if seq_len is None else seq_len
        return 6 * self.matmul_params() + 12 * self.config.n_layers * self.config.d_model * T

    def estimate_mfu(self, tokens_per_second: float, peak_flops: float,
                     seq_len: int | None = None) -> float:
        """Model FLOPs utilisation: achieved training FLOP/s over the device's peak FLOP/s (pass
        the peak for the dtype you train in, e.g. 65e12 for a T4 in fp16)."""
        if peak_flops <= 0:
            raise ValueError(f"peak_flops must be positive, got {peak_flops}")
        return self.flops_per_token(seq_len) * tokens_per_second / peak_flops

    def kv_cache_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes the KV cache grows by per generated token and sequence: 2·n_layers·d_model values
        (a key and a value per layer)."""
        return 2 * self.config.n_layers * self.config.d_model * dtype.itemsize

    # ----------------------------------------------------------------------- Hugging Face
    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> "GPT":
        """A copy of a Hugging Face ``GPT2LMHeadModel`` (same logits, in fp32, to ~1e-6); the
        details (``Conv1D``'s transposed weights, the packed ``c_attn``) are in
        :mod:`tfm_course.models.gpt_hf`."""
        ours = cls(GPTConfig(**config_from_hf(hf_model.config)))
        ours = ours.to(device=hf_model.transformer.wte.weight.device)
        copy_hf_weights(ours, hf_model)
        return ours

    @classmethod
    def from_pretrained(cls, name_or_folder: str | Path = "gpt2", sha256: str | None = None,
                        revision: str | None = None) -> "GPT":
        """GPT-2's weights, loaded with Hugging Face ``transformers`` and copied (:meth:`from_hf`).

        ``name_or_folder``: a folder written by ``save_pretrained``, or a model name on the Hub
        (downloaded at ``revision``, a commit hash: Colab only). With ``sha256`` the weights file
        ``model.safetensors`` must have that hash, else ``ValueError``: pin it so a changed
        download cannot slip in.
        """
        return cls.from_hf(load_hf_gpt2(name_or_folder, sha256, revision))


# --------------------------------------------------------------------------- decoding steppers
class Recompute:
    """No cache: the whole prefix runs through the model at every step (O(T²) token passes
    through the linear layers for T tokens, O(T³) work in self-attention)."""

    def __init__(self, model: GPT) -> None:
        self.model = model

    def __call__(self, prefix: Tensor) -> Tensor:
        return self.model.lm_head(self.model.features(prefix)[:, -1])  # (B, V)

    def reorder(self, index: Tensor) -> None:
        pass  # no state


class KVCache:
    """Incremental decoding: each call runs only the tokens it has not seen yet.

    The first call (the prompt) fills, per block, the keys and values of every position,
    ``(B, heads, t, d_head)`` each; later calls feed the new token alone, whose query reads the
    cache. Same maths as :class:`Recompute`. :meth:`nbytes` counts the cache:
    :meth:`GPT.kv_cache_bytes_per_token` per token and sequence.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.kv: list[tuple[Tensor, Tensor] | None] = [None] * len(model.blocks)
        self.length = 0  # positions processed so far

    def __call__(self, prefix: Tensor) -> Tensor:
        if prefix.shape[1] <= self.length:
            raise ValueError(f"KVCache has seen {self.length} positions, so the prefix must have "
                             f"more than {self.length}; got {tuple(prefix.shape)}")
        model = self.model
        x = model.embed(prefix[:, self.length:], offset=self.length)  # (B, new, d_model)
        for i, block in enumerate(model.blocks):
            attended, self.kv[i] = block.attn.step(block.norm1(x), self.kv[i])
            x = x + attended
            x = x + block.ffn(block.norm2(x))
        self.length = prefix.shape[1]
        return model.lm_head(model.norm(x[:, -1]))  # (B, V)

    def reorder(self, index: Tensor) -> None:
        self.kv = [None if kv is None else (kv[0][index], kv[1][index]) for kv in self.kv]

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values now."""
        return sum(t.numel() * t.element_size() for kv in self.kv if kv is not None for t in kv)
