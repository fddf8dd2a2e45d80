"""Checkers for chapter 13, "Today's decoder".

>>> from tfm_course.exercises import ch13
>>> ch13.check_rmsnorm(my_rmsnorm)          # fn(x, weight, eps) -> RMSNorm of x over its last dim
>>> ch13.check_swiglu(my_swiglu)            # fn(x, w_gate, w_up, w_down) -> the SwiGLU block
>>> ch13.check_kv_head_of(my_kv_head_of)    # fn(n_heads, n_kv_heads) -> the K/V head of each query head
>>> ch13.check_hf_name(my_hf_name)          # fn(our_name) -> Hugging Face's name of that tensor

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.llama import Llama, LlamaConfig
from ..models.llama_hf import hf_name
from ._checking import Failed, attempt, compare_with_mistakes, run_checks, seeded

__all__ = ["check_rmsnorm", "check_swiglu", "check_kv_head_of", "check_hf_name"]


# --------------------------------------------------------------------------- RMSNorm
def check_rmsnorm(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """``fn(x, weight, eps)``: ``x / sqrt(mean(x²) + eps) · weight`` over the last dimension, for
    ``x`` of any shape ``(..., d)`` and ``weight`` ``(d,)``. No mean is subtracted and there is no bias."""

    def case(shape: tuple[int, ...], eps: float, offset: float, seed: int) -> Callable[[], None]:
        def check() -> None:
            g = seeded(seed)
            x = torch.randn(*shape, generator=g, dtype=torch.float64) + offset
            w = torch.rand(shape[-1], generator=g, dtype=torch.float64) + 0.5
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
            got = attempt(fn, x.clone(), w.clone(), eps)
            mistakes = [
                (lambda: F.layer_norm(x, (shape[-1],), w, None, eps),
                 "you subtracted the mean: that is LayerNorm; RMSNorm divides by the root mean square "
                 "of x itself, without centring it"),
                (lambda: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w,
                 "eps is added outside the square root: RMSNorm adds it to mean(x²), inside"),
                (lambda: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * w,
                 "the mean is over the first dimension: normalise each vector over its last one (d)"),
                (lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps),
                 "the weight is missing: multiply by it after normalising"),
                (lambda: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w,
                 "you divided by the root of the *sum* of squares: use their mean (divide by d)"),
                (lambda: x / torch.sqrt(x.var(-1, keepdim=True) + eps) * w,
                 "you divided by the standard deviation (centred): RMSNorm uses mean(x²), not the variance"),
            ]
            compare_with_mistakes(got, want, mistakes, "the normalised tensor", atol=1e-9)
        return check

    return run_checks("RMSNorm", [
        ("a (4, 8) batch", case((4, 8), 1e-6, 0.0, 0)),
        ("inputs far from zero mean (centring would change them)", case((2, 3, 16), 1e-5, 3.0, 1)),
        ("a large eps, which must sit inside the root", case((5, 6), 0.5, 0.0, 2)),
    ])


# --------------------------------------------------------------------------- SwiGLU
def check_swiglu(fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> bool:
    """``fn(x, w_gate, w_up, w_down)``: ``(SiLU(x W_gateᵀ) ⊙ x W_upᵀ) W_downᵀ``, the layout of
    ``nn.Linear`` weights: ``w_gate``, ``w_up`` ``(d_ff, d)``, ``w_down`` ``(d, d_ff)``; ``x`` ``(..., d)``."""

    def case(d: int, d_ff: int, seed: int) -> Callable[[], None]:
        def check() -> None:
            g = seeded(seed)
            x = torch.randn(3, 5, d, generator=g, dtype=torch.float64)
            gate, up = (torch.randn(d_ff, d, generator=g, dtype=torch.float64) / d**0.5 for _ in range(2))
            down = torch.randn(d, d_ff, generator=g, dtype=torch.float64) / d_ff**0.5
            want = (F.silu(x @ gate.T) * (x @ up.T)) @ down.T
            got = attempt(fn, x.clone(), gate.clone(), up.clone(), down.clone())
            mistakes = [
                (lambda: (F.silu(x @ up.T) * (x @ gate.T)) @ down.T,
                 "the SiLU is on the wrong branch: it goes on the gate (W_gate, HF's gate_proj, Meta's "
                 "w1), and the up branch (W_up, w3) stays linear"),
                (lambda: (F.gelu(x @ gate.T) * (x @ up.T)) @ down.T,
                 "that is GeGLU: SwiGLU's gate goes through SiLU (x · sigmoid(x)), not GELU"),
                (lambda: (torch.sigmoid(x @ gate.T) * (x @ up.T)) @ down.T,
                 "a sigmoid gate is GLU; SwiGLU's is SiLU, x · sigmoid(x)"),
                (lambda: F.silu(x @ gate.T) @ down.T,
                 "the up branch is missing: multiply the gated activation elementwise by x W_upᵀ"),
                (lambda: (F.silu(x @ gate) * (x @ up)) @ down,
                 "the weights are used untransposed: nn.Linear stores (out, in), so x @ W.T"),
            ]
            compare_with_mistakes(got, want, mistakes, "the block's output", atol=1e-9)
        return check

    return run_checks("SwiGLU", [("d = 8, d_ff = 24", case(8, 24, 0)), ("d = 12, d_ff = 32", case(12, 32, 1))])


# --------------------------------------------------------------------------- GQA heads
def check_kv_head_of(fn: Callable[[int, int], Any]) -> bool:
    """``fn(n_heads, n_kv_heads)``: for each query head ``h = 0 … n_heads-1``, the index of the
    K/V head it reads, as Hugging Face's ``repeat_kv`` (and :class:`~tfm_course.models.llama.Llama`)
    arrange them: consecutive query heads share one K/V head."""

    def case(n_heads: int, n_kv: int) -> Callable[[], None]:
        def check() -> None:
            group = n_heads // n_kv
            want = [h // group for h in range(n_heads)]
            got = attempt(fn, n_heads, n_kv)
            got = got.tolist() if isinstance(got, Tensor) else list(got) if got is not None else None
            if got == want:
                return
            if got == [h % n_kv for h in range(n_heads)]:
                raise Failed("you interleaved the heads (h % n_kv_heads): the K/V heads are repeated in "
                             "blocks, so query heads 0 … g-1 read K/V head 0 (g = n_heads / n_kv_heads)")
            if got == [min(h // n_kv, n_kv - 1) for h in range(n_heads)] or got == [h // n_kv for h in range(n_heads)]:
                raise Failed("you divided by n_kv_heads: divide by the group size n_heads / n_kv_heads")
            raise Failed(f"for {n_heads} query and {n_kv} K/V heads expected {want}, got {got}")
        return check

    return run_checks("GQA head mapping", [(f"{h} query heads, {k} K/V heads", case(h, k))
                                           for h, k in ((8, 2), (6, 3), (4, 4), (9, 1), (12, 4))])


# --------------------------------------------------------------------------- weight names
def check_hf_name(fn: Callable[[str], str]) -> bool:
    """``fn(our_name)``: the name of the same tensor in Hugging Face's ``LlamaForCausalLM`` /
    ``Qwen3ForCausalLM`` state dict, for every parameter of a Qwen3-style
    :class:`~tfm_course.models.llama.Llama` (``blocks.0.ffn.gate.weight`` ->
    ``model.layers.0.mlp.gate_proj.weight``)."""
    model = Llama(LlamaConfig.qwen3(vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1))
    names = list(model.state_dict())
    hints = {
        "up_proj": "gate and up are swapped: our `gate` (through the SiLU) is HF's gate_proj, `up` is up_proj",
        "post_attention_layernorm": "the norms are swapped: norm1 (before attention) is input_layernorm, "
                                    "norm2 (before the MLP) post_attention_layernorm",
        "input_layernorm": "the norms are swapped: norm1 (before attention) is input_layernorm, "
                           "norm2 (before the MLP) post_attention_layernorm",
    }

    def check() -> None:
        for name in names:
            want = hf_name(name)
            got = attempt(fn, name)
            if got == want:
                continue
            if isinstance(got, str) and "model." + got == want:
                raise Failed(f"{name}: the transformer's tensors live under `model.` ({want})")
            if isinstance(got, str) and got.replace("layers.", "blocks.") == want.replace("layers.", "blocks."):
                raise Failed(f"{name}: HF calls the blocks `layers` ({want})")
            for part, hint in hints.items():
                if isinstance(got, str) and part in got and part not in want:
                    raise Failed(f"{name} -> {got}: {hint}")
            raise Failed(f"{name}: expected {want!r}, got {got!r}")

    return run_checks("Hugging Face weight names", [(f"all {len(names)} parameters", check)])
