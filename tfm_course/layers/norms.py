"""LayerNorm and RMSNorm written out: normalise each position's feature vector on its own."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """(x − mean) / sqrt(var + eps) · weight + bias over the last dim; equals ``nn.LayerNorm``.

    The variance is the *biased* one (divide by d, not d − 1), as in PyTorch. ``fused=True`` (the
    default) computes it with PyTorch's one-kernel ``F.layer_norm``; ``fused=False`` runs the
    formula written out below: six tensor operations and as many again backward, which made each
    training step of a small GPT on the CPU about 10% longer (``tools/bench/bench_gpt.py``).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True, fused: bool = True) -> None:
        super().__init__()
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"expected (..., {self.weight.shape[0]}), got {tuple(x.shape)}")
        if self.fused:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        y = (x - mean) / torch.sqrt(var + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y

    @classmethod
    def from_torch(cls, m: nn.LayerNorm) -> "LayerNorm":
        """A copy of ``nn.LayerNorm`` over the last dimension."""
        if len(m.normalized_shape) != 1:
            raise ValueError(f"only 1-D normalized_shape is supported, got {m.normalized_shape}")
        ours = cls(m.normalized_shape[0], eps=m.eps, bias=m.bias is not None)
        ours = ours.to(device=m.weight.device, dtype=m.weight.dtype)
        with torch.no_grad():
            ours.weight.copy_(m.weight)
            if m.bias is not None:
                ours.bias.copy_(m.bias)
        return ours


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight (Zhang & Sennrich, 2019): no centring, no bias.

    The mean of squares is taken in fp32 whatever the input's dtype, and the result cast back
    before the weight multiplies it, as Hugging Face's Llama does: in bf16 the sum of d squares
    would keep only 8 bits of mantissa."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"expected (..., {self.weight.shape[0]}), got {tuple(x.shape)}")
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight

    @classmethod
    def from_torch(cls, m: nn.Module) -> "RMSNorm":
        """A copy of ``nn.RMSNorm`` (PyTorch >= 2.4) over the last dimension.

        PyTorch's default ``eps=None`` means ``torch.finfo(dtype).eps`` of the input; the copy uses
        that number for the module's dtype.
        """
        if len(m.normalized_shape) != 1:
            raise ValueError(f"only 1-D normalized_shape is supported, got {m.normalized_shape}")
        if m.weight is None:
            raise ValueError("nn.RMSNorm without elementwise_affine has no weight to copy")
        eps = m.eps if m.eps is not None else torch.finfo(m.weight.dtype).eps
        ours = cls(m.normalized_shape[0], eps=eps).to(device=m.weight.device, dtype=m.weight.dtype)
        with torch.no_grad():
            ours.weight.copy_(m.weight)
        return ours
