"""Mamba: a selective state-space model (S6) and the block around it.

Gu & Dao (2023). Every channel d of the input drives N hidden states through a linear recurrence
whose step size Δ_t, input map B_t and output map C_t depend on the current token ("selective"):

    h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t x_t          Ā = exp(ΔA) (zero-order hold), B̄ ≈ ΔB (Euler)
    y_t = C_t · h_t + D x_t

Because the coefficients change with t, this is a *scan*, not a convolution. Two forms:

* ``sequential`` — a Python loop over t: O(L) work, L steps, the form used for generation;
* ``parallel``   — a work-efficient (Blelloch-style) scan of the associative operator
  ``(a₁, b₁) ∘ (a₂, b₂) = (a₂a₁, a₂b₁ + b₂)``: O(L) work in O(log L) rounds. It pays on a GPU;
  on a CPU the loop is usually faster (many small ops either way, and the scan does twice the work).

:class:`MambaBlock` adds in_proj, a causal depthwise convolution, the input-dependent Δ, B, C,
the S4D-real initialisation of A, a SiLU gate and out_proj, and a ``step()`` for inference.

Where this code differs from the authors' ``mamba_ssm`` (``modules/mamba_simple.py``): their block
marks ``A_log`` and ``D`` with ``_no_weight_decay = True`` so that their training scripts leave
them out of weight decay (decay would pull A_log towards 0, i.e. every A_n towards −1, erasing the
S4D-real spread of time scales). The same flags are set here, but :func:`tfm_course.train.train`
applies one weight decay (default 0) to every parameter and does not read them; pass your own
optimizer with parameter groups (see :meth:`MambaBlock.no_weight_decay_parameters`) when you use
weight decay. The scan is plain PyTorch, not the fused CUDA kernel (same numbers, more memory).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["selective_scan", "linear_scan", "MambaBlock", "MambaState"]

MODES = ("sequential", "parallel")


# --------------------------------------------------------------------------- scans
def linear_scan(a: Tensor, b: Tensor, mode: str = "sequential") -> Tensor:
    """All states of ``h_t = a_t ⊙ h_{t−1} + b_t`` with ``h_{−1} = 0``, along dim 1 (time).

    a, b: ``(batch, L, ...)`` of the same shape; returns h of that shape.
    """
    if a.shape != b.shape or a.dim() < 2:
        raise ValueError(f"a and b must have the same shape (batch, L, ...); got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if mode == "sequential":
        h, states = None, []
        # unbind, not a[:, t]: indexing inside a loop makes the backward pass quadratic in L
        for a_t, b_t in zip(a.unbind(1), b.unbind(1)):
            h = b_t if h is None else a_t * h + b_t
            states.append(h)
        return torch.stack(states, dim=1)
    if mode == "parallel":
        return _parallel_scan(a, b)
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _parallel_scan(a: Tensor, b: Tensor) -> Tensor:
    """Recursive even/odd scan: combine neighbours, scan the half-length sequence, fill the gaps."""
    length = a.shape[1]
    if length == 1:
        return b
    if length % 2:  # pad with the identity element (a = 1, b = 0)
        a = torch.cat([a, torch.ones_like(a[:, :1])], dim=1)
        b = torch.cat([b, torch.zeros_like(b[:, :1])], dim=1)
    a_even, a_odd = a[:, 0::2], a[:, 1::2]
    b_even, b_odd = b[:, 0::2], b[:, 1::2]
    # pair (2i, 2i+1) as one step: h_{2i+1} = a_odd a_even h_{2i−1} + (a_odd b_even + b_odd)
    h_odd = _parallel_scan(a_odd * a_even, a_odd * b_even + b_odd)  # h at positions 1, 3, 5, ...
    # h_{2i} = a_{2i} h_{2i−1} + b_{2i}, with h_{−1} = 0 for the first one
    h_before = torch.cat([torch.zeros_like(h_odd[:, :1]), h_odd[:, :-1]], dim=1)
    h_even = a_even * h_before + b_even
    h = torch.stack([h_even, h_odd], dim=2).flatten(1, 2)  # interleave: 0, 1, 2, 3, ...
    return h[:, :length]


def _check_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                D: Tensor | None) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, L, d_inner), got {tuple(x.shape)}")
    batch, length, d_inner = x.shape
    if delta.shape != x.shape:
        raise ValueError(f"delta must match x (batch, L, d_inner) = {tuple(x.shape)}, "
                         f"got {tuple(delta.shape)}")
    if A.dim() != 2 or A.shape[0] != d_inner:
        raise ValueError(f"A must be (d_inner={d_inner}, N), got {tuple(A.shape)}")
    n = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        if t.shape != (batch, length, n):
            raise ValueError(f"{name} must be (batch, L, N) = {(batch, length, n)}, "
                             f"got {tuple(t.shape)}")
    if D is not None and D.shape != (d_inner,):
        raise ValueError(f"D must be (d_inner,) = ({d_inner},), got {tuple(D.shape)}")


def selective_scan(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Tensor | None = None, mode: str = "sequential",
                   return_state: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The S6 recurrence ``h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t x_t``, ``y_t = C_t · h_t + D x_t``.

    Args:
        x, delta: ``(batch, L, d_inner)``; delta is the (already positive) step size Δ.
        A: ``(d_inner, N)`` (negative for a stable, decaying state).
        B, C: ``(batch, L, N)``, shared by all channels.
        D: optional ``(d_inner,)`` skip connection.
        mode: ``"sequential"`` or ``"parallel"``; same result.

    Returns y ``(batch, L, d_inner)`` in x's dtype; the scan itself runs in float32 even under
    autocast (a bf16 state would lose the slow decays). Materialises ``(batch, L, d_inner, N)``.
    ``return_state=True`` also returns the last hidden state ``h_L`` ``(batch, d_inner, N)`` (in
    the scan's dtype), from which :meth:`MambaBlock.step` continues.
    """
    _check_scan(x, delta, A, B, C, D)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    dtype = x.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, delta, A, B, C = (t.to(work) for t in (x, delta, A, B, C))
        decay = torch.exp(delta[..., None] * A)  # Ā: (b, L, d, N)
        drive = (delta * x)[..., None] * B[:, :, None, :]  # B̄ x: (b, L, d, N)
        h = linear_scan(decay, drive, mode)
        y = (h * C[:, :, None, :]).sum(-1)  # C_t · h_t: (b, L, d)
        if D is not None:
            y = y + D.to(work) * x
    return (y.to(dtype), h[:, -1]) if return_state else y.to(dtype)


# --------------------------------------------------------------------------- the block
class MambaState(NamedTuple):
    """What :meth:`MambaBlock.step` carries between tokens."""

    conv: Tensor  # (batch, d_inner, d_conv − 1): the last inputs seen by the causal convolution
    ssm: Tensor  # (batch, d_inner, N): the hidden state h


class MambaBlock(nn.Module):
    """One Mamba block: ``(batch, L, d_model) → (batch, L, d_model)`` (no norm, no residual).

    in_proj → (x, z); x → causal depthwise conv1d → SiLU → x_proj gives (Δ_low, B, C);
    Δ = softplus(dt_proj(Δ_low)); y = selective_scan(x, Δ, A, B, C, D); out_proj(y ⊙ SiLU(z)).
    Defaults as in the paper: expand E = 2, N = 16, conv kernel 4, dt_rank = ⌈d_model / 16⌉;
    A = −(1, 2, ..., N) for every channel (S4D-real), D = 1, and dt_proj's bias set so that
    softplus(bias) is log-uniform in [dt_min, dt_max]. About 6·d_model² parameters.
    """

    def __init__(self, d_model: int, d_state: int = 16, expand: int = 2, d_conv: int = 4,
                 dt_rank: int | None = None, dt_min: float = 1e-3, dt_max: float = 0.1,
                 scan_mode: str = "sequential") -> None:
        super().__init__()
        if scan_mode not in MODES:
            raise ValueError(f"scan_mode must be one of {MODES}, got {scan_mode!r}")
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
        self.scan_mode = scan_mode
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner,
                                padding=d_conv - 1)  # pad both sides; keep the first L outputs
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        # S4D-real: A_dn = −n; stored as log so that A = −exp(A_log) stays negative while training
        a = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.A_log._no_weight_decay = True  # as in mamba_ssm; read by no_weight_decay_parameters
        self.D._no_weight_decay = True
        with torch.no_grad():
            std = self.dt_rank ** -0.5
            self.dt_proj.weight.uniform_(-std, std)
            dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min)).clamp(min=1e-4)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus

    def no_weight_decay_parameters(self) -> list[nn.Parameter]:
        """The parameters the authors exclude from weight decay: ``A_log`` and ``D``.

        Give them their own AdamW group with ``"weight_decay": 0.0`` and the rest another.
        """
        return [p for p in self.parameters() if getattr(p, "_no_weight_decay", False)]

    def _ssm_inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x ``(..., d_inner)`` → Δ ``(..., d_inner)``, B, C ``(..., N)``."""
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.softplus(self.dt_proj(dt)), B, C

    def forward(self, u: Tensor, scan_mode: str | None = None) -> Tensor:
        return self.forward_with_state(u, scan_mode)[0]

    def forward_with_state(self, u: Tensor, scan_mode: str | None = None) -> tuple[Tensor, MambaState]:
        """The whole sequence ``(batch, L, d_model)`` at once, and the state :meth:`step` would
        carry after it (the convolution's last inputs, the scan's last h): a prefill by the scan."""
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"input must be (batch, L, d_model={self.d_model}), "
                             f"got {tuple(u.shape)}")
        length = u.shape[1]
        x_in, z = self.in_proj(u).chunk(2, dim=-1)  # (b, L, d_inner) each
        x = self.conv1d(x_in.transpose(1, 2))[..., :length].transpose(1, 2)  # causal: first L outputs
        x = F.silu(x)
        delta, B, C = self._ssm_inputs(x)
        A = -torch.exp(self.A_log)
        y, h = selective_scan(x, delta, A, B, C, self.D, mode=scan_mode or self.scan_mode,
                              return_state=True)
        window = F.pad(x_in.transpose(1, 2), (max(0, self.d_conv - 1 - length), 0))  # zeros before t = 0
        return self.out_proj(y * F.silu(z)), MambaState(window[..., window.shape[-1] - (self.d_conv - 1):], h)

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> MambaState:
        """Zeros: an empty convolution window and an empty hidden state."""
        device = self.A_log.device if device is None else device
        return MambaState(torch.zeros(batch, self.d_inner, self.d_conv - 1, device=device),
                          torch.zeros(batch, self.d_inner, self.d_state, device=device))

    def step(self, u_t: Tensor, state: MambaState | None = None) -> tuple[Tensor, MambaState]:
        """One token ``(batch, d_model)`` → ``(y_t (batch, d_model), new state)``: O(1) work."""
        if u_t.dim() != 2 or u_t.shape[-1] != self.d_model:
            raise ValueError(f"u_t must be (batch, d_model={self.d_model}), got {tuple(u_t.shape)}")
        if state is None:
            state = self.initial_state(u_t.shape[0], u_t.device)
        x, z = self.in_proj(u_t).chunk(2, dim=-1)  # (b, d_inner)
        window = torch.cat([state.conv.to(x.dtype), x[..., None]], dim=-1)  # (b, d_inner, d_conv)
        x = (window * self.conv1d.weight[:, 0]).sum(-1) + self.conv1d.bias
        x = F.silu(x)
        delta, B, C = self._ssm_inputs(x)
        work = torch.promote_types(x.dtype, torch.float32)  # the state stays in fp32 (or fp64)
        with torch.autocast(device_type=u_t.device.type, enabled=False):
            A = -torch.exp(self.A_log.to(work))
            x, delta, B, C = x.to(work), delta.to(work), B.to(work), C.to(work)
            decay, drive = torch.exp(delta[..., None] * A), (delta * x)[..., None] * B[:, None, :]
            h = decay * state.ssm.to(work) + drive  # (b, d_inner, N)
            y = (h * C[:, None, :]).sum(-1) + self.D.to(work) * x
        out = self.out_proj(y.to(z.dtype) * F.silu(z))
        return out, MambaState(window[..., 1:], h)
