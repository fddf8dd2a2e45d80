"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet): a state that corrects itself.

Linear attention adds ``v kᵀ`` to its state and never removes anything. The delta rule (Schlag
et al. 2021; parallelised by Yang et al. 2024) first reads what the state stores under the key,
``S k``, and replaces a fraction β of it by the new value — one step of gradient descent on
``½‖S k − v‖²``. Gated DeltaNet (Yang et al. 2025) also decays the whole state by α_t ∈ (0, 1]:

    S_t = α_t S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ          state (d_v × d_k) per head
    o_t = S_t q_t                                                 α_t = 1: DeltaNet

with ‖k_t‖ = 1 and β_t = sigmoid(·) ∈ (0, 1), so ``I − β k kᵀ`` never amplifies. Two forms,
same numbers (fp64: ~1e-12):

* ``recurrent`` — :func:`delta_rule_step` in a Python loop (generation);
* ``chunkwise`` — inside a chunk, write ``u_i = β_i (v_i − α_i S_{i−1} k_i)`` (the correction
  actually added, ``S_i = α_i S_{i−1} + u_i k_iᵀ``). Unrolling S_{i−1} gives a *triangular linear
  system* for all u of a chunk at once, ``(I + A) U = diag(β) V − diag(βΓ) K S₀ᵀ`` with
  ``A_ij = β_i (Γ_i/Γ_j) k_i·k_j`` for j < i and Γ_i the gate's running product since the chunk
  began. Its solution ``U = T diag(β) V − (T diag(βΓ) K) S₀ᵀ``, ``T = (I + A)⁻¹``, is the WY
  representation (``u`` and ``w`` in flash-linear-attention; inverting I + A is the UT transform).
  Then ``O = diag(Γ) Q S₀ᵀ + (Q Kᵀ ⊙ M) U`` and ``S_end = Γ_c S₀ + Uᵀ diag(Γ_c/Γ) K`` with the
  causal decay mask ``M_ij = Γ_i/Γ_j``: matrix products, as in RetNet's and Mamba-2's chunked forms.

Differences from flash-linear-attention (``fla/ops/delta_rule/naive.py``,
``fla/ops/gated_delta_rule/naive.py``, ``fla/layers/delta_net.py``, ``gated_deltanet.py``): the
state is stored as (d_v × d_k), as in the papers (fla's naive references store its transpose);
q's scale d_k^(−1/2) is applied by the mixer, not inside :func:`delta_rule`; ``T`` is applied
with ``torch.linalg.solve_triangular`` instead of fla's row-by-row recursion (same numbers);
chunks need not divide L; the chunks are visited by a Python loop. :class:`DeltaNetMixer` uses
one conv over the concatenated q, k, v (the same as fla's three depthwise convs; the package's
:class:`~tfm_course.efficient.short_conv.ShortConvolution`), keeps k−1 inputs as its conv state
(fla keeps k), has value width = key width = d_model / heads (fla's Gated DeltaNet widens values
by ``expand_v=2`` and uses ``head_dim=256``), and has no output gate (fla's Gated DeltaNet
defaults to ``use_gate=True``: ``RMSNorm(o) ⊙ SiLU(g_proj(x))``); the per-head RMSNorm on the
output is kept. PyTorch's default initialisation for the projections.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .mamba2 import segsum
from .short_conv import short_convolution

__all__ = ["delta_rule", "delta_rule_step", "DeltaNetMixer", "DeltaNetState"]

MODES = ("recurrent", "chunkwise")


# --------------------------------------------------------------------------- the two forms
def delta_rule_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor,
                    log_alpha_t: Tensor | None = None,
                    state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token: ``S ← α S``; ``S ← S + β (v − S k) kᵀ``; ``o = S q``.

    q_t, k_t ``(batch, heads, d_k)``, v_t ``(batch, heads, d_v)``, beta_t and log_alpha_t
    (log α ≤ 0, None for α = 1) ``(batch, heads)``, state ``(batch, heads, d_v, d_k)`` or None
    (zeros). Returns ``o_t (batch, heads, d_v)`` and the new state.
    """
    if state is None:
        state = v_t.new_zeros(*v_t.shape, k_t.shape[-1])
    if log_alpha_t is not None:
        state = log_alpha_t.exp()[..., None, None] * state
    correction = beta_t[..., None] * (v_t - (state @ k_t[..., None])[..., 0])  # u = β (v − S k)
    state = state + correction[..., :, None] * k_t[..., None, :]
    return (state @ q_t[..., None])[..., 0], state


def _recurrent(q, k, v, beta, log_alpha, state):
    outs, gates = [], (log_alpha.unbind(2) if log_alpha is not None else [None] * q.shape[2])
    for q_t, k_t, v_t, b_t, g_t in zip(q.unbind(2), k.unbind(2), v.unbind(2), beta.unbind(2), gates):
        o_t, state = delta_rule_step(q_t, k_t, v_t, b_t, g_t, state)
        outs.append(o_t)
    return torch.stack(outs, dim=2), state


def _chunkwise(q, k, v, beta, log_alpha, state, chunk_size):
    outs = []
    if log_alpha is None:
        log_alpha = beta.new_zeros(beta.shape)
    for q_c, k_c, v_c, b_c, g_c in zip(*(t.split(chunk_size, dim=2)
                                         for t in (q, k, v, beta, log_alpha))):
        mask = segsum(g_c).exp()  # M_ij = Γ_i / Γ_j for j ≤ i, 0 above: (b, h, c, c)
        gamma = g_c.cumsum(-1).exp()[..., None]  # Γ_i: the gate's product since the chunk began
        system = torch.eye(q_c.shape[2], dtype=q.dtype, device=q.device) \
            + (b_c[..., None] * (k_c @ k_c.transpose(-1, -2)) * mask).tril(-1)  # I + A
        rhs = torch.cat([b_c[..., None] * v_c, b_c[..., None] * gamma * k_c], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)  # T βV, T βΓK (WY)
        out_scores = (q_c @ k_c.transpose(-1, -2)) * mask
        if state is not None:
            u = u - w @ state.transpose(-1, -2)  # the corrections, given the incoming state
        out = out_scores @ u
        to_end = mask[..., -1, :, None]  # Γ_c / Γ_j: decay from step j to the chunk's end
        new_state = (u * to_end).transpose(-1, -2) @ k_c  # (b, h, d_v, d_k)
        if state is not None:
            out = out + gamma * (q_c @ state.transpose(-1, -2))
            new_state = new_state + gamma[..., -1:, :] * state
        state = new_state
        outs.append(out)
    return torch.cat(outs, dim=2), state


def _check(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_alpha: Tensor | None,
           state: Tensor | None) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be (batch, heads, L, d_k); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (batch, heads, L, d_v) = {tuple(q.shape[:3])} + (d_v,); "
                         f"got {tuple(v.shape)}")
    for name, t in (("beta", beta), ("log_alpha", log_alpha)):
        if t is not None and t.shape != q.shape[:3]:
            raise ValueError(f"{name} must be (batch, heads, L) = {tuple(q.shape[:3])}, "
                             f"got {tuple(t.shape)}")
    want = (*q.shape[:2], v.shape[-1], q.shape[-1])
    if state is not None and state.shape != want:
        raise ValueError(f"initial_state must be (batch, heads, d_v, d_k) = {want}, "
                         f"got {tuple(state.shape)}")


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_alpha: Tensor | None = None,
               mode: str = "chunkwise", chunk_size: int = 64,
               initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule over a sequence; see the module docstring.

    Args:
        q, k: ``(batch, heads, L, d_k)`` (k should have unit norm); v: ``(batch, heads, L, d_v)``.
        beta: ``(batch, heads, L)`` in [0, 1]; log_alpha: ``(batch, heads, L)``, ≤ 0, or None.
        mode: ``"recurrent"`` or ``"chunkwise"``; chunk_size need not divide L.
        initial_state: ``(batch, heads, d_v, d_k)`` or None (zeros).

    Returns ``(o (batch, heads, L, d_v) in q's dtype, final state (float32 or float64))``.
    """
    _check(q, k, v, beta, log_alpha, initial_state)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, beta = (t.to(work) for t in (q, k, v, beta))
        log_alpha = None if log_alpha is None else log_alpha.to(work)
        state = None if initial_state is None else initial_state.to(work)
        if mode == "recurrent":
            out, state = _recurrent(q, k, v, beta, log_alpha, state)
        else:
            out, state = _chunkwise(q, k, v, beta, log_alpha, state, chunk_size)
    return out.to(dtype), state


# --------------------------------------------------------------------------- the mixer
class DeltaNetState(NamedTuple):
    """What :meth:`DeltaNetMixer.step` carries between tokens."""

    memory: Tensor  # (batch, heads, d_head, d_head): the state S
    conv: Tensor | None = None  # (batch, short_conv − 1, 3·d_model): the conv's window, or None


def _l2_normalise(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # fla's eps, inside the root


class DeltaNetMixer(nn.Module):
    """DeltaNet / Gated DeltaNet as a mixer ``(batch, L, d_model) → (batch, L, d_model)``.

    q, k, v = projections → causal depthwise conv of ``short_conv`` taps (None or 0: none) →
    SiLU, as fla's layer; q, k L2-normalised per head, q scaled by d_head^(−1/2);
    β = sigmoid(b_proj(x)); gated: log α = −exp(A_log) · softplus(a_proj(x) + dt_bias)
    (Mamba-2's Δ·A; fla's initialisation: A ~ U(0, 16), softplus(dt_bias) log-uniform in
    [1e-3, 0.1]). The per-head output is RMS-normalised, then projected. ``step(x_t, state)``
    equals ``forward`` token by token. See the module docstring for what differs from fla.
    """

    def __init__(self, d_model: int, num_heads: int, gated: bool = False, short_conv: int = 4,
                 chunk_size: int = 64) -> None:
        super().__init__()
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model {d_model} must split into num_heads={num_heads} heads")
        self.d_model, self.num_heads, self.gated = d_model, num_heads, gated
        self.d_head, self.short_conv, self.chunk_size = d_model // num_heads, short_conv, chunk_size
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model, bias=False)
                                                 for _ in range(3))
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)
        self.qkv_conv = short_convolution(3 * d_model, short_conv)  # conv + SiLU; None when off
        if gated:
            self.a_proj = nn.Linear(d_model, num_heads, bias=False)
            self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(0, 16).log())
            dt = torch.exp(torch.rand(num_heads) * (math.log(0.1) - math.log(1e-3))
                           + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
            self.A_log._no_weight_decay = self.dt_bias._no_weight_decay = True  # as in fla
        self.o_norm = nn.RMSNorm(self.d_head, eps=1e-5)
        self.o_norm.weight._no_weight_decay = True  # a norm's scale, like A_log and dt_bias
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def _inputs(self, x: Tensor, window: Tensor | None = None) -> tuple[Tensor | None, ...]:
        """x ``(batch, L, d_model)`` → q, k, v ``(batch, L, heads, d_head)``, β and log α
        ``(batch, L, heads)`` (log α None if not gated), and the conv's new window."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if self.qkv_conv is None:
            qkv = F.silu(qkv)  # fla applies SiLU without the conv too
        else:
            qkv, window = self.qkv_conv(qkv, window)  # the conv's output is already SiLU'd
        q, k, v = qkv.unflatten(-1, (3, self.num_heads, self.d_head)).unbind(-3)
        q, k = _l2_normalise(q) / math.sqrt(self.d_head), _l2_normalise(k)
        beta = torch.sigmoid(self.b_proj(x))
        log_alpha = (-torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
                     if self.gated else None)
        return q, k, v, beta, log_alpha, window

    def _norm(self, out: Tensor, dtype: torch.dtype) -> Tensor:
        """Per-head RMSNorm of ``(..., heads, d_head)`` in float32 (fp64 stays) as fla's; → dtype."""
        return self.o_norm(out.to(torch.promote_types(out.dtype, torch.float32))).to(dtype)

    def forward(self, x: Tensor, mode: str = "chunkwise", chunk_size: int | None = None) -> Tensor:
        return self.forward_with_state(x, mode, chunk_size)[0]

    def forward_with_state(self, x: Tensor, mode: str = "chunkwise", chunk_size: int | None = None
                           ) -> tuple[Tensor, DeltaNetState]:
        """``forward`` and the state after the sequence, the one :meth:`step` would carry (the
        final S of the chunkwise form and the conv's window): a prompt's prefill in one pass."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, L, d_model={self.d_model}), got {tuple(x.shape)}")
        *inputs, window = self._inputs(x)
        q, k, v, beta, log_alpha = (None if t is None else t.transpose(1, 2) for t in inputs)
        out, memory = delta_rule(q, k, v, beta, log_alpha, mode, chunk_size or self.chunk_size)
        out = self.o_proj(self._norm(out.transpose(1, 2), x.dtype).flatten(2))  # (b, L, h·d_head)
        return out, DeltaNetState(memory, window)

    def step(self, x_t: Tensor, state: DeltaNetState | None = None) -> tuple[Tensor, DeltaNetState]:
        """One token ``(batch, d_model)`` → ``(y_t (batch, d_model), new state)``: O(1) work."""
        if x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"x_t must be (batch, d_model={self.d_model}), got {tuple(x_t.shape)}")
        *inputs, window = self._inputs(x_t[:, None], None if state is None else state.conv)
        work = torch.promote_types(inputs[0].dtype, torch.float32)  # the state stays in fp32
        q, k, v, beta, log_alpha = (None if t is None else t[:, 0].to(work) for t in inputs)
        with torch.autocast(device_type=x_t.device.type, enabled=False):
            out, memory = delta_rule_step(q, k, v, beta, log_alpha,
                                          None if state is None else state.memory.to(work))
        return self.o_proj(self._norm(out, x_t.dtype).flatten(1)), DeltaNetState(memory, window)
