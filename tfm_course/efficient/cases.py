"""The token-mixing operations of every method, on equal footing, for timing and memory sweeps.

    cases = attention_cases(heads=4, d_head=32, device=device)
    rows = tfm_course.experiments.scaling.sweep(cases, lengths=[256, 512, 1024])

Every case maps a length n to ``run()``, the forward pass of one method on fresh inputs of that
length (inputs require grad, so a sweep can time the backward pass too). All get the same per-head
width: ``(batch, heads, n, d_head)`` queries, keys and values for the attention-like methods, and
``d_inner = heads · d_head`` channels with ``d_state`` states for Mamba's scan. Only the mixing is
measured: no projections, no feed-forward. ``tools/bench/bench_efficient.py`` prints the tables.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import fused_attention, scaled_dot_product_attention
from .flash import tiled_attention
from .linformer import linformer_attention
from .mamba import selective_scan
from .performer import draw_projection, favor_attention
from .retnet import default_gammas, retention
from .sparse import sliding_window_attention, sliding_window_mask

__all__ = ["attention_cases", "Case"]

Case = Callable[[int], Callable[[], Tensor]]  # make(n) -> run()


def attention_cases(batch: int = 1, heads: int = 4, d_head: int = 32,
                    device: torch.device | str = "cpu", num_features: int = 128,
                    linformer_k: int = 128, chunk_size: int = 64, d_state: int = 16,
                    block_size: int = 64, window: int = 64) -> dict[str, Case]:
    """name → make(n) → run(): the forward pass of one method on fresh inputs of length n.

    Inputs are drawn on the CPU from fixed seeds and moved to ``device``. ``block_size`` is the
    tile of :func:`tiled_attention`, ``window`` the half-width of the sliding window (as a dense
    mask for SDPA, and computed block by block by :func:`sliding_window_attention`).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)

    def leaf(*shape: int, scale: float = 1.0) -> Tensor:
        t = torch.randn(*shape, generator=gen) * scale
        return t.to(device).requires_grad_()

    def qkv(n: int, scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
        q = leaf(batch, heads, n, d_head, scale=scale)
        k = leaf(batch, heads, n, d_head, scale=scale)
        return q, k, leaf(batch, heads, n, d_head)

    def naive(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        return lambda: scaled_dot_product_attention(q, k, v)

    def sdpa(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        return lambda: fused_attention(q, k, v)

    def sdpa_causal(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def sdpa_window(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        mask = sliding_window_mask(n, window, device=device)
        return lambda: fused_attention(q, k, v, mask)

    def window_blocked(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        return lambda: sliding_window_attention(q, k, v, window)

    def tiled(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        return lambda: tiled_attention(q, k, v, block_size=block_size)

    def linformer(n: int) -> Callable[[], Tensor]:
        q, k, v = qkv(n)
        scale = linformer_k ** -0.5
        E, Fp = leaf(linformer_k, n, scale=scale), leaf(linformer_k, n, scale=scale)
        return lambda: linformer_attention(q, k, v, E, Fp)

    projection = draw_projection(num_features, d_head, generator=torch.Generator().manual_seed(1),
                                 device=device)

    def performer(causal: bool) -> Case:
        def make(n: int) -> Callable[[], Tensor]:
            q, k, v = qkv(n, scale=0.5)
            return lambda: favor_attention(q, k, v, num_features, causal=causal,
                                           projection=projection, chunk_size=chunk_size)
        return make

    gammas = default_gammas(heads).to(device)

    def retnet(mode: str) -> Case:
        def make(n: int) -> Callable[[], Tensor]:
            q, k, v = qkv(n, scale=d_head ** -0.25)
            return lambda: retention(q, k, v, gammas, mode=mode, chunk_size=chunk_size)
        return make

    d_inner = heads * d_head
    A = -torch.arange(1, d_state + 1, dtype=torch.float32).repeat(d_inner, 1).to(device)

    def mamba(mode: str) -> Case:
        def make(n: int) -> Callable[[], Tensor]:
            x = leaf(batch, n, d_inner)
            # Δ around softplus(−4) ≈ 0.02, inside the block's init range [1e-3, 0.1]
            raw = torch.randn(batch, n, d_inner, generator=gen) - 4
            delta = F.softplus(raw).to(device).requires_grad_()
            B, C = leaf(batch, n, d_state), leaf(batch, n, d_state)
            D = leaf(d_inner)
            return lambda: selective_scan(x, delta, A, B, C, D, mode=mode)
        return make

    return {
        "softmax (naive)": naive,
        "SDPA (fused)": sdpa,
        "SDPA (fused, causal)": sdpa_causal,
        f"SDPA + window mask w={window}": sdpa_window,
        f"window, blocked w={window}": window_blocked,
        f"tiled online softmax B={block_size}": tiled,
        f"Linformer k={linformer_k}": linformer,
        f"Performer m={num_features}": performer(False),
        f"Performer m={num_features} causal": performer(True),
        "RetNet parallel": retnet("parallel"),
        f"RetNet chunkwise B={chunk_size}": retnet("chunkwise"),
        "RetNet recurrent": retnet("recurrent"),
        "Mamba scan sequential": mamba("sequential"),
        "Mamba scan parallel": mamba("parallel"),
    }
