"""Retention (RetNet): one computation with a parallel, a recurrent and a chunkwise form.

Sun et al. (2023) replace softmax attention by a decayed linear attention. For one head with decay
``0 < γ ≤ 1``, query ``q_n``, key ``k_m`` and value ``v_m``:

    out_n = Σ_{m ≤ n} γ^(n−m) (q_n · k_m) v_m                                   (unnormalised)

* **parallel**   ``(Q Kᵀ ⊙ D) V`` with ``D_nm = γ^(n−m)`` for ``n ≥ m`` and 0 above the diagonal.
  ``⊙`` is element-wise: D is a causal decay mask, not a matrix product. O(L²) time and memory.
* **recurrent**  ``S_n = γ S_{n−1} + k_nᵀ v_n``, ``out_n = q_n S_n``: a (d_k × d_v) state per head,
  O(1) memory per generated token.
* **chunkwise**  the parallel form inside chunks of B tokens and the recurrent form across them:
  ``R_i = K_[i]ᵀ (V_[i] ⊙ ζ) + γ^B R_{i−1}`` with ``ζ_j = γ^(B−j−1)``, and
  ``out_[i] = (Q_[i] K_[i]ᵀ ⊙ D) V_[i] + (Q_[i] R_{i−1}) ⊙ ξ`` with ``ξ_j = γ^(j+1)``.

All three give the same numbers (fp32: ~1e-5). :class:`MultiScaleRetention` is the layer around
it: one γ per head (γ_h = 1 − 2^(−5−h)), a rotation of q and k by position, per-head group norm,
a swish gate, and a ``step()`` that generates token by token from the recurrent state.

Where this code deliberately differs from the authors' torchscale implementation
(``torchscale/component/multiscale_retention.py`` and ``architecture/retnet.py``):

* **no extra normalisations.** torchscale divides the decay mask by the square root of its row
  sums, divides ``QKᵀ ⊙ D`` by ``max(|row sum|, 1)``, and carries matching running scales in the
  recurrent and chunkwise forms, for numerical range in long fp16 runs. Those factors change the
  numbers per form and only cancel after the per-head norm (exactly only with its eps = 0), so
  :func:`retention` computes the plain sum the paper writes, on which the three forms agree exactly.
* **the per-head norm.** torchscale's current code uses an RMSNorm without learned weights (its
  first release, a LayerNorm without them); here ``nn.GroupNorm(heads, ...)``, a per-head LayerNorm
  with a learned per-channel scale and shift (initialised to 1 and 0).
* **value width.** The paper and torchscale's first release widen the values to
  ``2·d_model`` (``value_factor=2``; later configs set the width directly, e.g. 1280 for
  d_model 768); the default here is ``value_factor=1``, so parameter counts match the book's
  attention layers.
* **initialisation.** torchscale draws q, k, v and gate projections with Xavier-uniform, gain
  2^−2.5, and the output with gain 1; here PyTorch's default ``nn.Linear`` initialisation.
* **an optional short convolution** (``short_conv=k``, off by default): not in the paper or in
  torchscale; flash-linear-attention's retention layer has one as an option (``use_short_conv``,
  off by default there too), applied as here: on q, k and v after their projections, before the
  rotation (:mod:`~tfm_course.efficient.short_conv`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .short_conv import short_convolution

__all__ = ["retention", "retention_step", "decay_mask", "default_gammas", "MultiScaleRetention",
           "RetentionState"]

MODES = ("parallel", "recurrent", "chunkwise")


# --------------------------------------------------------------------------- validation
def _check(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | float) -> Tensor:
    """Validate shapes; return gamma as a ``(heads,)`` tensor on q's device.

    A Python float (or list) becomes float64, so that float64 inputs keep every digit of γ
    (rounding 0.9 to float32 alone costs an absolute error of ~1e-6 in the output); a tensor
    keeps its own dtype. :func:`retention` then casts γ to its working dtype.
    """
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be (batch, heads, L, d_k); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (batch, heads, L, d_v) = {tuple(q.shape[:3])} + (d_v,); "
                         f"got {tuple(v.shape)}")
    heads = q.shape[1]
    if isinstance(gamma, Tensor):
        gamma = gamma.to(q.device)
    else:
        gamma = torch.tensor(gamma, dtype=torch.float64, device=q.device)
    if gamma.dim() == 0:
        gamma = gamma.expand(heads)
    if gamma.shape != (heads,):
        raise ValueError(f"gamma must be a scalar or (heads,) = ({heads},); "
                         f"got {tuple(gamma.shape)}")
    if bool(((gamma <= 0) | (gamma > 1)).any()):
        raise ValueError(f"every decay gamma must lie in (0, 1]; got {gamma.tolist()}")
    return gamma


def default_gammas(num_heads: int) -> Tensor:
    """The paper's per-head decays γ_h = 1 − 2^(−5−h): memory spans of 32, 64, 128, ... tokens."""
    return 1 - 2.0 ** (-5 - torch.arange(num_heads, dtype=torch.float32))


def decay_mask(gamma: Tensor, length: int) -> Tensor:
    """``D`` of shape ``(heads, L, L)``: ``D[h, n, m] = γ_h^(n−m)`` for n ≥ m, else 0."""
    pos = torch.arange(length, device=gamma.device)
    distance = (pos[:, None] - pos[None, :]).to(gamma.dtype)  # (L, L), n − m
    powers = gamma[:, None, None] ** distance.clamp(min=0)
    return powers.masked_fill(distance < 0, 0.0)


# --------------------------------------------------------------------------- the three forms
def _parallel(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor) -> Tensor:
    scores = q @ k.transpose(-2, -1)  # (b, h, L, L)
    return (scores * decay_mask(gamma, q.shape[2])) @ v  # element-wise decay, then values


def retention_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, gamma: Tensor,
                   state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One recurrent step: ``S = γ S + k_tᵀ v_t``; ``out_t = q_t S``.

    q_t, k_t ``(batch, heads, d_k)``, v_t ``(batch, heads, d_v)``, gamma ``(heads,)``, state
    ``(batch, heads, d_k, d_v)`` or None (zeros). Returns ``out_t (batch, heads, d_v)`` and the
    new state.
    """
    update = k_t[..., :, None] * v_t[..., None, :]  # outer product (b, h, d_k, d_v)
    state = update if state is None else gamma[:, None, None] * state + update
    return (q_t[..., None, :] @ state).squeeze(-2), state


def _recurrent(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor) -> Tensor:
    state, outs = None, []
    # unbind, not q[:, :, t]: indexing inside a loop makes the backward pass quadratic in L
    for q_t, k_t, v_t in zip(q.unbind(2), k.unbind(2), v.unbind(2)):
        out_t, state = retention_step(q_t, k_t, v_t, gamma, state)
        outs.append(out_t)
    return torch.stack(outs, dim=2)


def _chunkwise(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor, chunk_size: int) -> Tensor:
    g = gamma[:, None, None]  # (h, 1, 1) broadcasts over (b, h, rows, cols)
    inner_decay = decay_mask(gamma, chunk_size)  # (h, B, B); a shorter last chunk uses a corner
    state = None  # R_{i-1}: (b, h, d_k, d_v)
    outs = []
    chunks = zip(q.split(chunk_size, 2), k.split(chunk_size, 2), v.split(chunk_size, 2))
    for q_c, k_c, v_c in chunks:
        size = q_c.shape[2]
        j = torch.arange(size, device=q.device, dtype=gamma.dtype)[:, None]  # (B, 1)
        out = ((q_c @ k_c.transpose(-2, -1)) * inner_decay[:, :size, :size]) @ v_c
        if state is not None:
            out = out + (q_c @ state) * g ** (j + 1)  # ξ_j = γ^(j+1): decay since the chunk began
        zeta = g ** (size - 1 - j)  # ζ_j = γ^(B−j−1): decay from position j to the chunk's end
        chunk_state = k_c.transpose(-2, -1) @ (v_c * zeta)
        state = chunk_state if state is None else chunk_state + g ** size * state
        outs.append(out)
    return torch.cat(outs, dim=2)


def retention(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | float, mode: str = "parallel",
              chunk_size: int | None = None) -> Tensor:
    """Unnormalised retention ``out_n = Σ_{m ≤ n} γ^(n−m) (q_n · k_m) v_m`` for every head.

    Args:
        q, k: ``(batch, heads, L, d_k)``; v: ``(batch, heads, L, d_v)``.
        gamma: ``(heads,)`` decays in (0, 1] (a float is used for every head).
        mode: ``"parallel"`` (O(L²), training), ``"recurrent"`` (a Python loop over tokens,
            O(1) state) or ``"chunkwise"`` (parallel inside chunks, recurrent across them).
        chunk_size: chunk length for ``"chunkwise"`` (default 64); need not divide L.

    Returns ``(batch, heads, L, d_v)`` in q's dtype. The sums run in float32 even under autocast.
    """
    gamma = _check(q, k, v, gamma)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if chunk_size is None:
        chunk_size = 64
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)  # fp16/bf16 → fp32; fp64 stays fp64
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, gamma = q.to(work), k.to(work), v.to(work), gamma.to(work)
        if mode == "parallel":
            out = _parallel(q, k, v, gamma)
        elif mode == "recurrent":
            out = _recurrent(q, k, v, gamma)
        else:
            out = _chunkwise(q, k, v, gamma, chunk_size)
    return out.to(dtype)


# --------------------------------------------------------------------------- the layer
class RetentionState(NamedTuple):
    """What :meth:`MultiScaleRetention.step` carries between tokens."""

    memory: Tensor  # (batch, heads, d_k, d_v): the recurrent state S
    position: int  # index of the next token (for the rotation)
    conv: Tensor | None = None  # (batch, k − 1, 2·d_model + heads·d_v): the short conv's window


def _rotate(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate consecutive pairs of x's last dim by ``position · frequency``.

    The paper's xPos rotation without xPos's extra length-extrapolation scaling (as in the
    authors' later code); the same rotation as RoPE, applied to interleaved pairs.

    x ``(..., L, d)`` with d even, positions ``(L,)``:
    (x₀, x₁) → (x₀ cos − x₁ sin, x₁ cos + x₀ sin)
    Rotating q_n by nθ and k_m by mθ makes q_n · k_m depend on n − m only.
    """
    angle = positions.to(inv_freq.dtype)[:, None] * inv_freq  # (L, d/2)
    cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)
    pairs = x.unflatten(-1, (-1, 2))
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + swapped * sin


class MultiScaleRetention(nn.Module):
    """Multi-scale retention (MSR): retention with a different decay per head, gated.

    ``MSR(X) = (swish(X W_G) ⊙ GroupNorm_h(Retention_h(X))) W_O`` with q and k rotated by
    position and k scaled by d_k^(−1/2). Input ``(batch, L, d_model)``, output the same.
    The paper widens the values (``value_factor=2``); the default here keeps them at d_model.
    ``short_conv=k`` (None or 0: off) adds a causal depthwise convolution of width k and a SiLU
    on q, k and v after their projections (:class:`~tfm_course.efficient.short_conv.ShortConvolution`);
    ``step`` then also carries its window of the last k − 1 projected tokens.

    ``forward(x, mode=..., chunk_size=...)`` runs any of the three retention forms (same result);
    ``step(x_t, state)`` takes one token ``(batch, d_model)`` and returns ``(y_t, new_state)``,
    which equals the forward pass token by token.
    """

    def __init__(self, d_model: int, num_heads: int, value_factor: int = 1,
                 gammas: Tensor | None = None, short_conv: int | None = None) -> None:
        super().__init__()
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model {d_model} must split into {num_heads} heads of even size")
        self.d_model, self.num_heads = d_model, num_heads
        self.d_k = d_model // num_heads
        self.d_v = value_factor * self.d_k
        width_v = num_heads * self.d_v
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, width_v, bias=False)
        self.g_proj = nn.Linear(d_model, width_v, bias=False)
        self.out_proj = nn.Linear(width_v, d_model, bias=False)
        self.group_norm = nn.GroupNorm(num_heads, width_v)  # per head, per token
        self.qkv_conv = short_convolution(2 * d_model + width_v, short_conv)  # None when off
        gammas = default_gammas(num_heads) if gammas is None else gammas
        gammas = torch.as_tensor(gammas, dtype=torch.float64)  # exact γ; cast where it is used
        if gammas.shape != (num_heads,):
            raise ValueError(f"gammas must be ({num_heads},), got {tuple(gammas.shape)}")
        self.register_buffer("gammas", gammas)
        inv_freq = 1.0 / 10000 ** torch.linspace(0, 1, self.d_k // 2)
        self.register_buffer("inv_freq", inv_freq)

    def _qkvg(self, x: Tensor, positions: Tensor, window: Tensor | None = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """x ``(batch, L, d_model)`` → q, k ``(batch, heads, L, d_k)``, v ``(batch, heads, L, d_v)``,
        the gate ``(batch, L, heads·d_v)`` and the short convolution's new window (None if off)."""
        b, length, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qkv_conv is not None:  # after the projections, before the rotation
            qkv, window = self.qkv_conv(torch.cat([q, k, v], dim=-1), window)
            q, k, v = qkv.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        q = q.view(b, length, self.num_heads, self.d_k).transpose(1, 2)
        k = k.view(b, length, self.num_heads, self.d_k).transpose(1, 2)
        v = v.view(b, length, self.num_heads, self.d_v).transpose(1, 2)
        q = _rotate(q, positions, self.inv_freq)
        k = _rotate(k, positions, self.inv_freq) / math.sqrt(self.d_k)
        return q, k, v, self.g_proj(x), window

    def _output(self, heads_out: Tensor, gate: Tensor) -> Tensor:
        """heads_out ``(batch, L, heads·d_v)`` → normalise per head, gate, project."""
        b, length, width = heads_out.shape
        normed = self.group_norm(heads_out.reshape(b * length, width)).view(b, length, width)
        return self.out_proj(F.silu(gate) * normed.to(gate.dtype))

    def forward(self, x: Tensor, mode: str = "parallel", chunk_size: int | None = None) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, L, d_model={self.d_model}), got {tuple(x.shape)}")
        positions = torch.arange(x.shape[1], device=x.device)
        q, k, v, gate, _ = self._qkvg(x, positions)
        out = retention(q, k, v, self.gammas, mode=mode, chunk_size=chunk_size)
        return self._output(out.transpose(1, 2).flatten(2), gate)

    def forward_with_state(self, x: Tensor) -> tuple[Tensor, RetentionState]:
        """The parallel form over ``x`` ``(batch, L, d_model)``, and the state :meth:`step` would
        carry after it: ``S_L = Σ_i γ^(L−1−i) k_iᵀ v_i`` per head (a prefill without a step loop)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, L, d_model={self.d_model}), got {tuple(x.shape)}")
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)
        q, k, v, gate, window = self._qkvg(x, positions)
        out = retention(q, k, v, self.gammas)
        work = torch.promote_types(q.dtype, torch.float32)  # the state stays in fp32 (or fp64)
        with torch.autocast(device_type=x.device.type, enabled=False):
            ages = torch.arange(length - 1, -1, -1, device=x.device, dtype=work)  # L − 1 − i
            weights = self.gammas.to(work)[:, None] ** ages  # (heads, L)
            memory = torch.einsum("hl,bhld,bhle->bhde", weights, k.to(work), v.to(work))
        return self._output(out.transpose(1, 2).flatten(2), gate), RetentionState(memory, length, window)

    def step(self, x_t: Tensor,
             state: RetentionState | None = None) -> tuple[Tensor, RetentionState]:
        """One token ``(batch, d_model)`` → ``(y_t (batch, d_model), new state)``."""
        if x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"x_t must be (batch, d_model={self.d_model}), got {tuple(x_t.shape)}")
        position = 0 if state is None else state.position
        memory = None if state is None else state.memory
        positions = torch.tensor([position], device=x_t.device)
        q, k, v, gate, window = self._qkvg(x_t[:, None, :], positions,
                                           None if state is None else state.conv)
        work = torch.promote_types(q.dtype, torch.float32)  # the state stays in fp32 (or fp64)
        with torch.autocast(device_type=x_t.device.type, enabled=False):
            q_t, k_t, v_t = (t[:, :, 0].to(work) for t in (q, k, v))  # (b, h, d)
            out, memory = retention_step(q_t, k_t, v_t, self.gammas.to(work), memory)
        y = self._output(out.to(v.dtype).flatten(1)[:, None, :], gate)
        return y[:, 0], RetentionState(memory, position + 1, window)
