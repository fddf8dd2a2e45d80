"""A small causal language model whose only varying part is the sequence mixer.

    model = MixerLM(vocab_size=256, mixer="mamba")          # attention / performer / retnet / mamba / hybrid
    logits = model(tokens)                                   # (batch, L) -> (batch, L, vocab_size)
    logits_t, state = model.step(tokens[:, t], state)        # generation, one token at a time
    model.state_bytes(context_len)                           # bytes that state holds

Token embedding → ``num_layers`` pre-norm layers ``x + mixer(norm(x))``, ``x + ffn(norm(x))`` →
RMSNorm → a linear head. Everything but the mixer is the same for every choice, and the
feed-forward width of each layer is set so that **every layer has about the parameter count of an
attention layer** (a Mamba block is bigger than attention's four projections, so its FFN is
narrower). ``"hybrid"`` uses Mamba layers with one attention layer in the middle (index
``num_layers // 2``), the pattern of Jamba and Zamba. Positions come from the mixers themselves:
RoPE in attention and the Performer, RetNet's rotation, Mamba's convolution.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..layers import FeedForward, RMSNorm
from .mixers import MIXER_KINDS, make_mixer, state_bytes

__all__ = ["MixerLM", "MixerLayer", "MIXERS", "layer_kinds", "count_parameters"]

MIXERS = MIXER_KINDS + ("hybrid",)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable numbers in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def layer_kinds(mixer: str, num_layers: int) -> list[str]:
    """The mixer of each layer: ``mixer`` everywhere, or for ``"hybrid"`` Mamba with one attention
    layer at index ``num_layers // 2``."""
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
    if num_layers < 1 or (mixer == "hybrid" and num_layers < 2):
        raise ValueError(f"num_layers must be >= 1 (>= 2 for a hybrid), got {num_layers} for {mixer!r}")
    if mixer != "hybrid":
        return [mixer] * num_layers
    return ["attention" if i == num_layers // 2 else "mamba" for i in range(num_layers)]


class MixerLayer(nn.Module):
    """Pre-norm layer ``(batch, L, d_model) → (batch, L, d_model)``: mixer, then feed-forward."""

    def __init__(self, kind: str, d_model: int, num_heads: int, d_ff: int,
                 num_features: int | None = None, scan_mode: str = "sequential",
                 short_conv: int | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.mixer = make_mixer(kind, d_model, num_heads, num_features, scan_mode, short_conv)
        self.ffn = FeedForward(d_model, d_ff, activation="gelu")

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.ffn(self.norm2(x))

    def prefill(self, x: Tensor) -> tuple[Tensor, Any]:
        """A whole prompt ``(batch, L, d_model)`` through the layer, and its mixer's state after it:
        by the mixer's own parallel form where it has one (``forward_with_state``), else by a
        loop of :meth:`step` over this layer's inputs."""
        h = self.norm1(x)
        if hasattr(self.mixer, "forward_with_state"):
            mixed, state = self.mixer.forward_with_state(h)
        else:
            outs, state = [], None
            for h_t in h.unbind(1):
                out, state = self.mixer.step(h_t, state)
                outs.append(out)
            mixed = torch.stack(outs, dim=1)
        x = x + mixed
        return x + self.ffn(self.norm2(x)), state

    def step(self, x_t: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """One position ``(batch, d_model)``; ``state`` is the mixer's (None at the start)."""
        y, state = self.mixer.step(self.norm1(x_t), state)
        x_t = x_t + y
        return x_t + self.ffn(self.norm2(x_t)), state


def _matched_ffn_width(kind: str, d_model: int, num_heads: int, target: int,
                       num_features: int | None, short_conv: int | None = None) -> int:
    """FFN width that brings a ``kind`` layer closest to ``target`` parameters (at least 8)."""
    probe = MixerLayer(kind, d_model, num_heads, 1, num_features, short_conv=short_conv)
    fixed = count_parameters(probe) - count_parameters(probe.ffn)
    per_unit = 2 * d_model + 1  # one hidden unit: a row of W1, its bias, a column of W2
    return max(8, round((target - fixed - d_model) / per_unit))


class MixerLM(nn.Module):
    """``forward(tokens (batch, L)) -> logits (batch, L, vocab_size)``; see the module docstring.

    Args:
        vocab_size: tokens are in ``[0, vocab_size)``.
        mixer: one of :data:`MIXERS`.
        d_model, num_layers, num_heads: width, depth, heads of attention / Performer / RetNet.
        d_ff: FFN width of an attention layer (default ``4 · d_model``); other layers get the
            width that matches an attention layer's parameter count (``match_parameters=True``)
            or this same width (``False``).
        num_features: random features per Performer head (default ``2 · d_head``).
        scan_mode: Mamba's scan, ``"sequential"`` (CPU) or ``"parallel"`` (GPU); same result.
        short_conv: width of a causal depthwise convolution on q, k, v in every mixer layer
            (None or 0: off; only for :data:`~tfm_course.models.mixers.CONV_CAPABLE_KINDS`, see
            :func:`~tfm_course.models.mixers.make_mixer`). Its weights count towards the layer's
            parameters, so with ``match_parameters`` the FFN is narrower by as much.
        tie_embeddings: the head reuses the embedding matrix (GPT-2, ``mamba_ssm`` and Zoology
            do), so emitting a token that was read is a dot product with its own embedding.
        embed_std: if given, the embedding starts as N(0, ``embed_std``²) (those references:
            0.02) instead of PyTorch's N(0, 1).
    """

    def __init__(self, vocab_size: int, mixer: str = "attention", d_model: int = 64,
                 num_layers: int = 2, num_heads: int = 4, d_ff: int | None = None,
                 num_features: int | None = None, match_parameters: bool = True,
                 scan_mode: str = "sequential", short_conv: int | None = None,
                 tie_embeddings: bool = False, embed_std: float | None = None) -> None:
        super().__init__()
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model {d_model} must split into {num_heads} heads of even width")
        self.mixer, self.vocab_size, self.d_model = mixer, vocab_size, d_model
        kinds = layer_kinds(mixer, num_layers)
        d_ff = d_ff or 4 * d_model
        target = count_parameters(MixerLayer("attention", d_model, num_heads, d_ff))
        widths = {kind: d_ff if kind == "attention" or not match_parameters
                  else _matched_ffn_width(kind, d_model, num_heads, target, num_features, short_conv)
                  for kind in set(kinds)}
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(MixerLayer(kind, d_model, num_heads, widths[kind], num_features,
                                               scan_mode, short_conv) for kind in kinds)
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if embed_std is not None:
            nn.init.normal_(self.embed.weight, std=embed_std)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be integer ids (batch, L), got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def step(self, token: Tensor, state: list[Any] | None = None) -> tuple[Tensor, list[Any]]:
        """One token per sequence ``(batch,)`` → ``(logits (batch, vocab_size), new state)``.

        ``state`` holds one entry per layer (None at the start). Feeding a sequence token by token
        gives the logits of :meth:`forward` at each position.
        """
        if token.dim() != 1 or token.is_floating_point():
            raise ValueError(f"token must be integer ids (batch,), got {tuple(token.shape)} {token.dtype}")
        state = [None] * len(self.layers) if state is None else state
        x, new_state = self.embed(token), []
        for layer, layer_state in zip(self.layers, state):
            x, layer_state = layer.step(x, layer_state)
            new_state.append(layer_state)
        return self.head(self.norm(x)), new_state

    @torch.no_grad()
    def prefill(self, tokens: Tensor) -> tuple[Tensor, list[Any]]:
        """A prompt ``tokens`` ``(batch, L)``, layer by layer (:meth:`MixerLayer.prefill`: every
        mixer kind's parallel or chunked form, ``forward_with_state``); returns the
        last position's logits and the state :meth:`step` continues from."""
        if tokens.dim() != 2 or tokens.is_floating_point() or tokens.shape[1] < 1:
            raise ValueError(f"tokens must be integer ids (batch, L >= 1), got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        x, state = self.embed(tokens), []
        for layer in self.layers:
            x, layer_state = layer.prefill(x)
            state.append(layer_state)
        return self.head(self.norm(x[:, -1])), state

    def state_bytes(self, context_len: int, bytes_per_value: int = 4) -> int:
        """Bytes of generation state per sequence after ``context_len`` tokens (all layers)."""
        return sum(state_bytes(layer.mixer, context_len, bytes_per_value) for layer in self.layers)

    def num_parameters(self) -> int:
        return count_parameters(self)
