"""Today's decoder (chapter 13): chapter 8's GPT with the changes of Llama and Qwen3, each a switch.

    config = LlamaConfig.llama(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2)
    model = Llama(config)
    logits, loss = model(ids, targets)                  # ids, targets (B, T) -> (B, T, V), scalar
    out = model.generate(prompt, max_new_tokens=20, temperature=0)   # a preallocated KV cache

The switches, GPT-2's setting first (:meth:`LlamaConfig.gpt2`) and Llama's second
(:meth:`LlamaConfig.llama`; :meth:`LlamaConfig.qwen3` adds QK-norm):

* ``norm``: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm, chapter 4), before each sub-layer;
* ``ffn``: ``"gelu"`` (tanh GELU, GPT-2's) or ``"swiglu"`` (chapter 4), at about the same parameters;
* ``positions``: ``"learned"`` (an embedding per position) or ``"rope"`` (chapter 2);
* ``n_kv_heads``: ``n_heads`` (multi-head), fewer (grouped-query), or 1 (multi-query; chapter 3);
* ``bias``: biases in every linear layer and norm, or none;
* ``qk_norm``: an RMSNorm over each head's queries and keys before RoPE (Qwen3);
* ``tie``: the output layer shares the token embedding's matrix, or has its own.

Every layer is the package's (``RMSNorm``, ``FeedForward``, ``RotaryEmbedding``); the weights
are initialised as chapter 8's GPT is, whatever the switches, so that an ablation changes one
thing. :mod:`tfm_course.models.llama_hf` maps Hugging Face's Llama and Qwen3 weights onto it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import decoding
from ..attention import fused_attention, kv_cache_bytes, merge_heads
from ..layers.feedforward import FeedForward
from ..layers.norms import LayerNorm, RMSNorm
from ..positional import RotaryEmbedding
from .gpt import IGNORE_INDEX, TanhGELUFeedForward
from .kv_cache import ConcatCache, KVCache
from .transformer import check_ids_in_range

__all__ = ["LlamaConfig", "Llama", "KVCache", "ConcatCache", "swiglu_width"]


def swiglu_width(d_model: int, multiple_of: int = 8) -> int:
    """A SwiGLU width with about the parameters of a 4·d_model GELU block: 3·d·w ≈ 8·d², so
    w ≈ 8·d/3, rounded up to a multiple of ``multiple_of`` (as Llama's code rounds it)."""
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    head_dim: int | None = None    # None: d_model // n_heads
    d_ff: int | None = None        # None: 4·d_model (gelu) or swiglu_width(d_model)
    max_len: int = 256
    norm: str = "layer"
    ffn: str = "gelu"
    positions: str = "learned"
    bias: bool = True
    qk_norm: bool = False
    tie: bool = True
    rope_base: float = 10000.0
    rope_scale: float = 1.0  # position interpolation: angles of position p / rope_scale
    eps: float = 1e-5
    dropout: float = 0.0

    def __post_init__(self) -> None:
        choices = {"norm": ("layer", "rms"), "ffn": ("gelu", "swiglu"), "positions": ("learned", "rope")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                             "or give head_dim")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        if self.positions == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE rotates pairs of features: head_dim must be even, got {self.d_head}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        return swiglu_width(self.d_model) if self.ffn == "swiglu" else 4 * self.d_model

    @classmethod
    def gpt2(cls, **sizes) -> "LlamaConfig":
        """Chapter 8's GPT: LayerNorm, GELU, learned positions, biases, tied output layer."""
        return cls(**sizes)

    @classmethod
    def llama(cls, **sizes) -> "LlamaConfig":
        """Llama's choices: RMSNorm, SwiGLU, RoPE, no biases, an untied output layer."""
        return replace(cls(**sizes), norm="rms", ffn="swiglu", positions="rope", bias=False, tie=False,
                       eps=sizes.get("eps", 1e-6))

    @classmethod
    def qwen3(cls, **sizes) -> "LlamaConfig":
        """Qwen3's: Llama's plus QK-norm."""
        return replace(cls.llama(**sizes), qk_norm=True)


def _norm(config: LlamaConfig, width: int | None = None) -> nn.Module:
    width = width or config.d_model
    if config.norm == "rms":
        return RMSNorm(width, eps=config.eps)
    return LayerNorm(width, eps=config.eps, bias=config.bias)


class Attention(nn.Module):
    """Causal self-attention with grouped K/V heads, optional QK-norm and RoPE:
    ``(B, T, d_model) -> (B, T, d_model)``. Query head ``h`` reads K/V head ``h // (n_heads / kv_heads)``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = c = config
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.d_head, bias=c.bias)
        self.k_proj = nn.Linear(c.d_model, c.kv_heads * c.d_head, bias=c.bias)
        self.v_proj = nn.Linear(c.d_model, c.kv_heads * c.d_head, bias=c.bias)
        self.o_proj = nn.Linear(c.n_heads * c.d_head, c.d_model, bias=c.bias)
        self.q_norm = RMSNorm(c.d_head, eps=c.eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.d_head, eps=c.eps) if c.qk_norm else None
        self.rotary = RotaryEmbedding(c.d_head, base=c.rope_base, scale=c.rope_scale) \
            if c.positions == "rope" else None

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        c, (B, T, _) = self.config, x.shape
        q = self.q_proj(x).view(B, T, c.n_heads, c.d_head)
        k = self.k_proj(x).view(B, T, c.kv_heads, c.d_head)
        v = self.v_proj(x).view(B, T, c.kv_heads, c.d_head).transpose(1, 2)
        if self.q_norm is not None:  # per head, over d_head (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, heads, T, d_head)
        offset = cache.length if cache is not None else 0
        if self.rotary is not None:
            q, k = self.rotary.rotate(q, offset), self.rotary.rotate(k, offset)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # every position so far
        p = c.dropout if self.training else 0.0
        # Query head h reads K/V head h // (n_heads // kv_heads), without copying K/V per query head.
        out = fused_attention(q, k, v, dropout_p=p, is_causal=T > 1,  # one new query reads every key
                              enable_gqa=c.kv_heads != c.n_heads)
        return self.o_proj(merge_heads(out))


class Block(nn.Module):
    """Pre-norm: ``x + attn(norm1(x))``, then ``x + ffn(norm2(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c = config
        self.norm1, self.attn, self.norm2 = _norm(c), Attention(c), _norm(c)
        self.ffn = FeedForward(c.d_model, c.hidden, "swiglu", bias=c.bias) if c.ffn == "swiglu" \
            else TanhGELUFeedForward(c.d_model, c.hidden, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)  # on each branch's output, as in chapter 8's GPT

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), cache, layer))
        return x + self.dropout(self.ffn(self.norm2(x)))


class Llama(nn.Module):
    """``forward(ids (B, T), targets=None, cache=None) -> (logits (B, T, V), loss)``; ``targets``
    holds each position's next token (``IGNORE_INDEX`` where there is none)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Embedding(c.max_len, c.d_model) if c.positions == "learned" else None
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = _norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie:
            self.lm_head.weight = self.tok_embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Chapter 8's GPT initialisation for every setting: N(0, 0.02) for matrices and
        embeddings, zero biases, N(0, 0.02/√(2·n_layers)) for the two residual projections."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            out = block.ffn.down if self.config.ffn == "swiglu" else block.ffn.linear2
            for proj in (block.attn.o_proj, out):
                nn.init.normal_(proj.weight, mean=0.0, std=std)

    def forward(self, ids: Tensor, targets: Tensor | None = None, cache: KVCache | None = None
                ) -> tuple[Tensor, Tensor | None]:
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"ids must be integer token ids (batch, seq), got {tuple(ids.shape)} {ids.dtype}")
        offset = cache.length if cache is not None else 0
        if self.pos_embed is not None and offset + ids.shape[1] > self.config.max_len:
            raise ValueError(f"positions up to {offset + ids.shape[1]} exceed max_len {self.config.max_len}")
        check_ids_in_range(ids, self.config.vocab_size)
        x = self.tok_embed(ids)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(offset, offset + ids.shape[1], device=ids.device))
        x = self.dropout(x)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += ids.shape[1]
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    @classmethod
    def from_gpt(cls, gpt: nn.Module) -> "Llama":
        """Chapter 8's :class:`~tfm_course.models.gpt.GPT` (tanh GELU) in this layout, same weights:
        its stacked ``qkv`` matrix split into ``q_proj``, ``k_proj``, ``v_proj``."""
        g = gpt.config
        if g.activation != "gelu_tanh":
            raise ValueError(f"only the tanh GELU of GPT-2 maps onto ffn='gelu', got {g.activation!r}")
        model = cls(LlamaConfig.gpt2(vocab_size=g.vocab_size, d_model=g.d_model, n_layers=g.n_layers,
                                     n_heads=g.n_heads, max_len=g.max_len, bias=g.bias, dropout=g.dropout))
        state = {}
        for name, tensor in gpt.state_dict().items():
            if ".attn.qkv." in name:
                for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
                    state[name.replace(".qkv.", f".{part}_proj.")] = chunk
            else:
                state[name.replace(".attn.out_proj.", ".attn.o_proj.")] = tensor
        model.load_state_dict(state)
        return model.to(next(gpt.parameters()).device)

    def new_cache(self, batch: int, max_len: int | None = None, kind: type[KVCache] = KVCache) -> KVCache:
        """An empty cache (preallocated; ``kind=ConcatCache``: chapter 8's concatenating one)."""
        weight = self.tok_embed.weight
        return kind(self.config, batch, max_len, device=weight.device, dtype=weight.dtype)

    def stepper(self, batch: int, max_len: int | None = None) -> "_Stepper":
        """The decoding interface of :mod:`tfm_course.decoding`, over a preallocated cache."""
        return _Stepper(self, self.new_cache(batch, max_len))

    @torch.no_grad()
    def generate(self, ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None, eos_id: int | None = None) -> Tensor:
        """Continue ``ids`` ``(B, t0)`` by ``max_new_tokens`` (``temperature=0``: greedy), with the cache."""
        total = ids.shape[1] + max_new_tokens
        if self.pos_embed is not None and total > self.config.max_len:
            raise ValueError(f"the prompt ({ids.shape[1]}) plus max_new_tokens ({max_new_tokens}) "
                             f"exceed max_len {self.config.max_len}")
        was_training = self.training
        self.eval()
        try:
            return decoding.generate(self.stepper(ids.shape[0], total), ids, max_new_tokens, temperature,
                                     top_k, top_p, generator, eos_id=eos_id)
        finally:
            self.train(was_training)

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """Bytes cached per token and sequence: 2 · layers · kv_heads · d_head · bytes_per_value."""
        c = self.config
        return kv_cache_bytes(c.n_layers, c.kv_heads, c.d_head, bytes_per_value)


class _Stepper:
    """``stepper(prefix (B, t)) -> logits (B, V)`` of its last position, running only new tokens."""

    def __init__(self, model: Llama, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    def __call__(self, prefix: Tensor) -> Tensor:
        if prefix.shape[1] <= self.cache.length:
            raise ValueError(f"the cache has seen {self.cache.length} positions; the prefix must be longer, "
                             f"got {tuple(prefix.shape)}")
        logits, _ = self.model(prefix[:, self.cache.length:], cache=self.cache)
        return logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.cache.reorder(index)
