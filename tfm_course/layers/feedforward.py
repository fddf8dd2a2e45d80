"""The position-wise feed-forward block: the same two-layer MLP applied to every position."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = ("relu", "gelu", "swiglu")

# The weight names of each kind of block (see FeedForward's docstring).
_NAMES = {"relu": ("linear1", "linear2"), "gelu": ("linear1", "linear2"), "swiglu": ("gate", "up", "down")}


class FeedForward(nn.Module):
    """``(..., d_model) -> (..., d_model)``, the same MLP at every position.

    * ``relu`` / ``gelu``: ``linear2(act(linear1(x)))``, i.e. act(x W1 + b1) W2 + b2, hidden width
      ``d_ff`` (Vaswani et al. use ReLU and d_ff = 4 · d_model; BERT and GPT use GELU). The names
      are those of PyTorch's ``nn.TransformerEncoderLayer``, so ``EncoderLayer.from_torch`` copies
      ``linear1`` and ``linear2`` by name.
    * ``swiglu`` (Shazeer, 2020): ``down(SiLU(gate(x)) ⊙ up(x))``, i.e. (SiLU(x W1) ⊙ x W3) W2.
      The names are Hugging Face LLaMA's ``gate_proj``, ``up_proj``, ``down_proj`` without the
      suffix (Meta's reference code: ``w1``, ``w3``, ``w2``): **``gate`` is the branch through the
      SiLU**, ``up`` the linear branch, ``down`` the output projection. Three matrices instead of
      two, so at a matched parameter count its hidden width is usually 2/3 of a ReLU block's.

    A SwiGLU block has no ``linear1`` / ``linear2``, and a ReLU / GELU block has no ``gate``,
    ``up`` / ``down``: code written for the other layout fails with an ``AttributeError`` that says
    so, instead of silently loading a weight into the wrong branch. ``d_model`` and ``d_ff`` are
    attributes of every block.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation, self.d_model, self.d_ff = activation, d_model, d_ff
        if activation == "swiglu":
            self.gate = nn.Linear(d_model, d_ff, bias=bias)  # W1: through the SiLU
            self.up = nn.Linear(d_model, d_ff, bias=bias)    # W3: the linear branch
            self.down = nn.Linear(d_ff, d_model, bias=bias)  # W2: back to d_model
        else:
            self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
            self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected (..., d_model={self.d_model}), got {tuple(x.shape)}")
        if self.activation == "swiglu":
            return self.down(self.dropout(F.silu(self.gate(x)) * self.up(x)))
        hidden = F.relu(self.linear1(x)) if self.activation == "relu" else F.gelu(self.linear1(x))
        return self.linear2(self.dropout(hidden))

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            activation = self.__dict__.get("activation")
            if activation in _NAMES and name in {n for names in _NAMES.values() for n in names}:
                raise AttributeError(
                    f"a {activation!r} FeedForward has no {name!r}: its weights are "
                    f"{', '.join(_NAMES[activation])} (SwiGLU: gate = W1 through the SiLU, up = W3, "
                    f"down = W2, as Hugging Face LLaMA's gate_proj / up_proj / down_proj)") from None
            raise
