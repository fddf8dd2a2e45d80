"""A short causal depthwise convolution over the q, k, v projections of a linear-attention mixer.

    conv = ShortConvolution(channels=96, size=4)             # one filter of 4 taps per channel
    y, window = conv(x)                                      # x (batch, L, 96) → y (batch, L, 96)
    y_t, window = conv(x_t[:, None], window)                 # one token, carrying the last 3 inputs

Output channel c at position t mixes only channel c of the last ``size`` inputs:

    y_t[c] = silu( Σ_{j=0}^{size−1} w[c, j] · x_{t−size+1+j}[c] )       (x_s = 0 for s < 0)

so it is causal, has ``channels × size`` weights (no bias by default), and generating token by
token needs only the last ``size − 1`` inputs: the **window**, ``(batch, size − 1, channels)``,
which :func:`~tfm_course.models.mixers.state_bytes` counts in the mixer's state.

Why a recurrent mixer wants it: a token's key and value are then built from that token *and its
neighbours*, so the key written at a value's position can carry the key token just before it.
That is the first half of an induction / lookup circuit, which attention forms with a layer of
its own. Mamba has one (on its input branch); flash-linear-attention turns it on by default for
DeltaNet; Zoology's MQAR study gives the recurrent models "the BASED recipe ... a short
convolution, for fair comparison" (its README; there a separate convolution layer, here on q, k, v).

As in flash-linear-attention's ``ShortConvolution`` (``fla/modules/conv/short_conv.py``) and its
layers (``fla/layers/multiscale_retention.py``, ``delta_net.py``): applied after the q, k and v
projections, before any rotation or feature map, with a SiLU after it and no bias. fla uses three
convolutions (q, k, v); one depthwise convolution over their concatenated channels is the same
computation, since no channel sees another. Written here from the formula above, not copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ShortConvolution", "short_convolution"]

ACTIVATIONS = ("silu", None)


class ShortConvolution(nn.Module):
    """Causal depthwise convolution of width ``size`` over ``channels``, then SiLU (or nothing).

    ``forward(x, window=None)`` takes ``x (batch, L, channels)`` and the ``size − 1`` inputs that
    came before it (None: the sequence starts here, zeros) and returns ``(y (batch, L, channels),
    new window (batch, size − 1, channels))``. Run over a whole sequence at once, or one token at a
    time carrying the window, it gives the same outputs. The window is kept in fp32 (fp64 stays
    fp64) like the mixers' other recurrent states.
    """

    def __init__(self, channels: int, size: int, bias: bool = False,
                 activation: str | None = "silu") -> None:
        super().__init__()
        if not isinstance(size, int) or size < 1 or channels < 1:
            raise ValueError(f"need channels >= 1 and an integer size >= 1, got channels={channels}, "
                             f"size={size!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.channels, self.size, self.activation = channels, size, activation
        conv = nn.Conv1d(channels, channels, size, groups=channels, bias=bias)  # PyTorch's init
        self.weight = conv.weight  # (channels, 1, size); the last tap multiplies the current input
        self.bias = conv.bias

    @property
    def window_values(self) -> int:
        """Numbers in the window carried per sequence: ``(size − 1) · channels``."""
        return (self.size - 1) * self.channels

    def forward(self, x: Tensor, window: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.channels:
            raise ValueError(f"x must be (batch, L, channels={self.channels}), got {tuple(x.shape)}")
        b, length, c = x.shape
        expected = (b, self.size - 1, c)
        if window is None:
            window = x.new_zeros(expected)
        elif tuple(window.shape) != expected:
            raise ValueError(f"window must be (batch, size - 1, channels) = {expected}, "
                             f"got {tuple(window.shape)}")
        full = torch.cat([window.to(x.dtype), x], dim=1)  # (b, size − 1 + L, c)
        y = F.conv1d(full.transpose(1, 2), self.weight.to(x.dtype),
                     None if self.bias is None else self.bias.to(x.dtype), groups=c).transpose(1, 2)
        if self.activation == "silu":
            y = F.silu(y)
        keep = torch.promote_types(x.dtype, torch.float32)
        return y, full[:, full.shape[1] - (self.size - 1):].to(keep)

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, size={self.size}, bias={self.bias is not None}, "
                f"activation={self.activation}")


def short_convolution(channels: int, size: int | None) -> ShortConvolution | None:
    """The mixers' switch: None for ``size`` None or 0 (off), else ``ShortConvolution(channels, size)``.

    A negative or non-integer ``size`` raises ValueError.
    """
    if size is None or (isinstance(size, int) and not isinstance(size, bool) and size == 0):
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"short_conv must be None, 0 (off) or a positive integer width, got {size!r}")
    return ShortConvolution(channels, size)
