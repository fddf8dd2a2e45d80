"""Two KV caches for :class:`tfm_course.models.llama.Llama` (chapter 13), one interface.

    cache = KVCache(config, batch, max_len)       # allocated once, written in place
    k_all, v_all = cache.update(layer, k, v)      # (B, kv_heads, t, d_head) -> (B, kv_heads, length + t, d_head)
    cache.length += t                             # the model advances it after its last layer

:class:`ConcatCache` is chapter 8's way (``torch.cat`` per step), kept to time one against the other.
"""

from __future__ import annotations

import torch
from torch import Tensor

# ``config`` below is a tfm_course.models.llama.LlamaConfig (not imported: llama imports this module)

__all__ = ["KVCache", "ConcatCache"]


class KVCache:
    """Preallocated keys and values of every layer, ``(layers, B, kv_heads, max_len, d_head)``,
    filled in place: a decoding step writes one position instead of copying the whole cache as
    ``torch.cat`` does (chapter 8's cache). ``length`` positions are filled."""

    def __init__(self, config: "LlamaConfig", batch: int, max_len: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.max_len = max_len or config.max_len
        shape = (config.n_layers, batch, config.kv_heads, self.max_len, config.d_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' ``k``, ``v`` ``(B, kv_heads, t, d_head)`` of ``layer``; return
        that layer's keys and values of every position so far, ``(B, kv_heads, length + t, d_head)``."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {end} requested")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the batch (beam search)."""
        self.k, self.v = self.k[:, index], self.v[:, index]

    def rewind(self, length: int) -> None:
        """Forget every position from ``length`` on (a rejected draft, or to decode again from a
        prompt's cache); the next update writes there."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be between 0 and the {self.length} positions cached, got {length}")
        self.length = length

    def nbytes(self) -> int:
        """Bytes of the filled positions: 2 · layers · B · kv_heads · d_head · length · element size."""
        return 2 * self.k[:, :, :, : self.length].numel() * self.k.element_size()


class ConcatCache(KVCache):
    """Chapter 8's way, for comparison: each step concatenates the new keys and values onto a
    copy of the old ones (``torch.cat``), so a step costs a copy of the whole cache."""

    def __init__(self, config: "LlamaConfig", batch: int, max_len: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.max_len = max_len or config.max_len
        self.kv: list[tuple[Tensor, Tensor] | None] = [None] * config.n_layers
        self.length = 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.length + k.shape[2] > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {self.length + k.shape[2]} requested")
        past = self.kv[layer]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v

    def reorder(self, index: Tensor) -> None:
        self.kv = [None if kv is None else (kv[0][index], kv[1][index]) for kv in self.kv]

    def rewind(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be between 0 and the {self.length} positions cached, got {length}")
        self.kv = [None if kv is None or length == 0 else (kv[0][:, :, :length], kv[1][:, :, :length])
                   for kv in self.kv]
        self.length = length

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for kv in self.kv if kv is not None for t in kv)
