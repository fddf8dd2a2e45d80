"""Mamba-2: a selective SSM with one data-dependent *scalar* decay per head (SSD).

Dao & Gu (2024), "Transformers are SSMs". Per head, with a learned A < 0 and a step size
Δ_t = softplus(·) > 0 computed from the token (one number per head and step):

    a_t = exp(Δ_t A)                                  scalar decay in (0, 1)
    S_t = a_t S_{t−1} + (Δ_t x_t) B_tᵀ                 state (head_dim × N)
    y_t = S_t C_t + D x_t

In attention's words C plays q, B plays k and Δx plays v: this is RetNet's retention with a
decay that depends on the data. Unrolled, ``y_i = Σ_{j≤i} (Π_{j<m≤i} a_m) (C_i · B_j) Δ_j x_j``,
i.e. ``Y = (C Bᵀ ⊙ L) (Δ X)`` with the causal decay mask ``L_ij = exp(segsum(log a)_ij)`` — the
"state-space duality". Two forms, same numbers (fp64: ~1e-12):

* ``recurrent`` — :func:`ssd_step` in a Python loop: O(1) state, the form for generation;
* ``chunked``   — the SSD algorithm: the quadratic (masked-attention) form inside chunks of
  ``chunk_size`` tokens, the state S passed from chunk to chunk (RetNet's chunkwise form with
  γ replaced by the running product of a_t). ``chunk_size ≥ L`` is the fully quadratic form.

Where this differs from the authors' ``mamba_ssm`` (``modules/ssd_minimal.py``,
``mamba2_simple.py``):
the state is passed between chunks by a Python loop, where ``ssd_minimal_discrete`` does it in one
einsum with a chunk-level segsum mask; one group (B and C shared by all heads, their default
ngroups=1); no learnable initial state, no dt_limit, no fused kernel; PyTorch's default
initialisation for in_proj, conv and out_proj. The convolution (with a bias, as their
``conv_bias=True``, then SiLU) is the package's
:class:`~tfm_course.efficient.short_conv.ShortConvolution`; its window holds d_conv − 1 inputs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .short_conv import ShortConvolution

__all__ = ["ssd", "ssd_step", "segsum", "Mamba2Mixer", "Mamba2State"]

MODES = ("recurrent", "chunked")


# --------------------------------------------------------------------------- helpers
def segsum(log_a: Tensor) -> Tensor:
    """``(..., T) → (..., T, T)``: entry [i, j] = Σ_{j<m≤i} log_a[m] for i ≥ j, −inf above.

    ``exp`` of it is the decay from step j to step i (1 on the diagonal, 0 above). Built as a
    cumulative sum down each column, not as a difference of prefix sums, which would cancel.
    """
    t = log_a.shape[-1]
    below = torch.ones(t, t, dtype=torch.bool, device=log_a.device).tril(-1)  # m > j
    out = (log_a[..., :, None] * below).cumsum(-2)  # [i, j] = Σ_{m ≤ i, m > j} log_a[m]
    causal = torch.ones(t, t, dtype=torch.bool, device=log_a.device).tril()
    return out.masked_fill(~causal, -math.inf)


# --------------------------------------------------------------------------- the two forms
def _check(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
           state: Tensor | None) -> None:
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, L, head_dim), got {tuple(x.shape)}")
    b, h, length, p = x.shape
    if dt.shape != (b, h, length):
        raise ValueError(f"dt must be (batch, heads, L) = {(b, h, length)}, got {tuple(dt.shape)}")
    if A.shape != (h,):
        raise ValueError(f"A must be (heads,) = ({h},), got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape[:3] != (b, h, length) or C.shape != B.shape:
        raise ValueError(f"B and C must both be (batch, heads, L, N) with (batch, heads, L) = "
                         f"{(b, h, length)}; got B {tuple(B.shape)}, C {tuple(C.shape)}")
    if D is not None and D.shape != (h,):
        raise ValueError(f"D must be (heads,) = ({h},), got {tuple(D.shape)}")
    if state is not None and state.shape != (b, h, p, B.shape[-1]):
        raise ValueError(f"initial_state must be (batch, heads, head_dim, N) = "
                         f"{(b, h, p, B.shape[-1])}, got {tuple(state.shape)}")


def ssd_step(x_t: Tensor, dt_t: Tensor, A: Tensor, B_t: Tensor, C_t: Tensor,
             D: Tensor | None = None, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token: ``S = exp(Δ A) S + (Δ x) Bᵀ``, ``y = S C + D x``.

    x_t ``(batch, heads, head_dim)``, dt_t ``(batch, heads)``, A ``(heads,)``, B_t, C_t
    ``(batch, heads, N)``, state ``(batch, heads, head_dim, N)`` or None (zeros).
    Returns ``y_t (batch, heads, head_dim)`` and the new state.
    """
    update = (dt_t[..., None] * x_t)[..., :, None] * B_t[..., None, :]  # (b, h, p, N)
    if state is not None:
        update = torch.exp(dt_t * A)[..., None, None] * state + update
    y = (update @ C_t[..., None])[..., 0]
    return (y if D is None else y + D[:, None] * x_t), update


def _recurrent(x, dt, A, B, C, state):
    outs = []
    for x_t, dt_t, B_t, C_t in zip(x.unbind(2), dt.unbind(2), B.unbind(2), C.unbind(2)):
        y_t, state = ssd_step(x_t, dt_t, A, B_t, C_t, None, state)
        outs.append(y_t)
    return torch.stack(outs, dim=2), state


def _chunked(x, dt, A, B, C, state, chunk_size):
    outs = []
    pieces = (t.split(chunk_size, dim=2) for t in (x, dt, B, C))
    for x_c, dt_c, B_c, C_c in zip(*pieces):
        v = dt_c[..., None] * x_c  # Δx plays v: (b, h, c, p)
        log_a = dt_c * A[:, None]  # (b, h, c): log a_t = Δ_t A
        seg = segsum(log_a)  # (b, h, c, c): log of the decay from step j to step i
        y = ((C_c @ B_c.transpose(-1, -2)) * seg.exp()) @ v  # intra-chunk: masked "attention"
        to_end = seg[..., -1, :].exp()  # decay from step j to the chunk's last step: (b, h, c)
        chunk_state = (v * to_end[..., None]).transpose(-1, -2) @ B_c  # (b, h, p, N)
        if state is not None:
            from_start = log_a.cumsum(-1).exp()[..., None]  # decay since the chunk began
            y = y + from_start * (C_c @ state.transpose(-1, -2))  # what the incoming S contributes
            chunk_state = chunk_state + from_start[..., -1:, :] * state
        state = chunk_state
        outs.append(y)
    return torch.cat(outs, dim=2), state


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
        mode: str = "chunked", chunk_size: int = 64,
        initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The scalar-decay SSM over a whole sequence; see the module docstring.

    Args:
        x: ``(batch, heads, L, head_dim)``; dt: ``(batch, heads, L)``, positive (Δ after softplus).
        A: ``(heads,)``, negative. B, C: ``(batch, heads, L, N)``. D: optional ``(heads,)`` skip.
        mode: ``"recurrent"`` or ``"chunked"``; chunk_size need not divide L.
        initial_state: ``(batch, heads, head_dim, N)`` or None (zeros).

    Returns ``(y (batch, heads, L, head_dim) in x's dtype, final state S_L (float32 or float64))``.
    """
    _check(x, dt, A, B, C, D, initial_state)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    dtype = x.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=x.device.type, enabled=False):
        x, dt, A, B, C = (t.to(work) for t in (x, dt, A, B, C))
        state = None if initial_state is None else initial_state.to(work)
        if mode == "recurrent":
            y, state = _recurrent(x, dt, A, B, C, state)
        else:
            y, state = _chunked(x, dt, A, B, C, state, chunk_size)
        if D is not None:
            y = y + D.to(work)[:, None, None] * x
    return y.to(dtype), state


# --------------------------------------------------------------------------- the mixer
class Mamba2State(NamedTuple):
    """What :meth:`Mamba2Mixer.step` carries between tokens."""

    conv: Tensor  # (batch, d_conv − 1, d_inner + 2N): the last inputs of the convolution
    ssm: Tensor  # (batch, heads, head_dim, N): the state S


class Mamba2Mixer(nn.Module):
    """A Mamba-2 block ``(batch, L, d_model) → (batch, L, d_model)`` (no outer norm or residual).

    in_proj → (z, xBC, Δ_raw); xBC → causal depthwise conv → SiLU → (x, B, C);
    Δ = softplus(Δ_raw + dt_bias); y = ssd(x, Δ, A, B, C, D) per head;
    out_proj(RMSNorm(y ⊙ SiLU(z))) (the gated norm of ``mamba_ssm``, normalising after the gate).
    d_inner = expand · d_model split into ``num_heads`` heads; A_h = −exp(A_log_h) with
    A_log_h = log U(1, 16), D = 1, dt_bias = softplus⁻¹ of log-uniform [1e-3, 0.1] (as mamba_ssm).
    ``forward(u, mode="chunked" | "recurrent", chunk_size=None)`` (same numbers);
    ``step(u_t, state)`` equals ``forward`` token by token.
    """

    def __init__(self, d_model: int, num_heads: int, d_state: int = 16, expand: int = 2,
                 d_conv: int = 4, chunk_size: int = 64) -> None:
        super().__init__()
        if d_model < 1 or num_heads < 1 or (expand * d_model) % num_heads:
            raise ValueError(f"d_inner = expand·d_model = {expand * d_model} must split into "
                             f"num_heads={num_heads} heads")
        if d_state < 1 or d_conv < 1:
            raise ValueError(f"d_state and d_conv must be >= 1, got {d_state} and {d_conv}")
        self.d_model, self.num_heads, self.d_state, self.d_conv = d_model, num_heads, d_state, d_conv
        self.d_inner = expand * d_model
        self.head_dim = self.d_inner // num_heads
        self.chunk_size = chunk_size
        self.conv_dim = self.d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + num_heads, bias=False)
        self.conv = ShortConvolution(self.conv_dim, d_conv, bias=True)  # then SiLU
        self.norm = nn.RMSNorm(self.d_inner, eps=1e-5)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(num_heads))
        dt = torch.exp(torch.rand(num_heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        for p in (self.A_log, self.D, self.dt_bias, self.norm.weight):
            p._no_weight_decay = True  # as in mamba_ssm (its norm weights: by their grouping)

    def no_weight_decay_parameters(self) -> list[nn.Parameter]:
        """``A_log``, ``D``, ``dt_bias`` and the norm's weight: kept out of weight decay."""
        return [p for p in self.parameters() if getattr(p, "_no_weight_decay", False)]

    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return zxbcdt.split([self.d_inner, self.conv_dim, self.num_heads], dim=-1)

    def _ssm_inputs(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return xbc.split([self.d_inner, self.d_state, self.d_state], dim=-1)

    def forward(self, u: Tensor, mode: str = "chunked", chunk_size: int | None = None) -> Tensor:
        return self.forward_with_state(u, mode, chunk_size)[0]

    def forward_with_state(self, u: Tensor, mode: str = "chunked", chunk_size: int | None = None
                           ) -> tuple[Tensor, Mamba2State]:
        """``forward`` and the state after the sequence, the one :meth:`step` would carry (the
        conv's window and the SSD's final S): a prompt's prefill in one parallel pass."""
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"input must be (batch, L, d_model={self.d_model}), got {tuple(u.shape)}")
        b, length, _ = u.shape
        z, xbc, dt = self._split(self.in_proj(u))
        xbc, window = self.conv(xbc)
        x, B, C = self._ssm_inputs(xbc)
        x = x.view(b, length, self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, L, p)
        dt = F.softplus(dt + self.dt_bias).transpose(1, 2)  # (b, h, L)
        B, C = (t[:, None].expand(b, self.num_heads, length, self.d_state) for t in (B, C))
        y, ssm = ssd(x, dt, -torch.exp(self.A_log), B, C, self.D, mode,
                     chunk_size or self.chunk_size)
        y = y.transpose(1, 2).reshape(b, length, self.d_inner)
        return self.out_proj(self._gated_norm(y, z)), Mamba2State(window, ssm)

    def _gated_norm(self, y: Tensor, z: Tensor) -> Tensor:
        """RMSNorm(y ⊙ SiLU(z)), computed in float32 (fp64 stays) like mamba_ssm's."""
        h = y.to(z.dtype) * F.silu(z)
        return self.norm(h.to(torch.promote_types(h.dtype, torch.float32))).to(h.dtype)

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> Mamba2State:
        """Zeros: an empty convolution window and an empty state."""
        device = self.A_log.device if device is None else device
        return Mamba2State(torch.zeros(batch, self.d_conv - 1, self.conv_dim, device=device),
                           torch.zeros(batch, self.num_heads, self.head_dim, self.d_state,
                                       device=device))

    def step(self, u_t: Tensor, state: Mamba2State | None = None) -> tuple[Tensor, Mamba2State]:
        """One token ``(batch, d_model)`` → ``(y_t (batch, d_model), new state)``: O(1) work."""
        if u_t.dim() != 2 or u_t.shape[-1] != self.d_model:
            raise ValueError(f"u_t must be (batch, d_model={self.d_model}), got {tuple(u_t.shape)}")
        if state is None:
            state = self.initial_state(u_t.shape[0], u_t.device)
        z, xbc, dt = self._split(self.in_proj(u_t))
        xbc, window = self.conv(xbc[:, None], state.conv)
        x, B, C = self._ssm_inputs(xbc[:, 0])
        x = x.view(-1, self.num_heads, self.head_dim)  # (b, h, p)
        dt = F.softplus(dt + self.dt_bias)  # (b, h)
        B, C = (t[:, None].expand(-1, self.num_heads, -1) for t in (B, C))
        work = torch.promote_types(x.dtype, torch.float32)  # the state stays in fp32 (or fp64)
        with torch.autocast(device_type=u_t.device.type, enabled=False):
            A, D = -torch.exp(self.A_log.to(work)), self.D.to(work)
            y, ssm = ssd_step(x.to(work), dt.to(work), A, B.to(work), C.to(work), D,
                              state.ssm.to(work))
        y = self.out_proj(self._gated_norm(y.reshape(-1, self.d_inner), z))
        return y, Mamba2State(window, ssm)
