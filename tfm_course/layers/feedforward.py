"""The position-wise feed-forward block: the same two-layer MLP applied to every position."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = ("relu", "gelu", "swiglu")


class FeedForward(nn.Module):
    """``(batch, seq, d_model) -> (batch, seq, d_model)``.

    * ``relu`` / ``gelu``: W2 · act(W1 x + b1) + b2 with hidden width ``d_ff`` (Vaswani et al. use
      ReLU and d_ff = 4 · d_model; BERT and GPT use GELU).
    * ``swiglu``: W2 · (SiLU(W1 x) ⊙ W3 x), Shazeer (2020); it has three matrices, so at matched
      parameter count its hidden width is usually 2/3 of a ReLU block's.

    Naming trap for SwiGLU: ``linear1`` is W1, the branch through the SiLU (the *gate* in GLU
    terms; LLaMA's ``w1`` / Hugging Face's ``gate_proj``), and the attribute ``gate`` is W3, the
    *linear* branch (LLaMA's ``w3`` / ``up_proj``). ``linear2`` is W2 (``w2`` / ``down_proj``).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.linear1.in_features:
            raise ValueError(f"expected (..., d_model={self.linear1.in_features}), got {tuple(x.shape)}")
        hidden = self.linear1(x)
        if self.activation == "relu":
            hidden = F.relu(hidden)
        elif self.activation == "gelu":
            hidden = F.gelu(hidden)
        else:
            hidden = F.silu(hidden) * self.gate(x)
        return self.linear2(self.dropout(hidden))
