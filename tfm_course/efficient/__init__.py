"""Efficient attention variants and attention-free sequence models, one module per method.

* :mod:`~tfm_course.efficient.flash` — exact attention tile by tile (online softmax, FlashAttention);
* :mod:`~tfm_course.efficient.linformer` — keys/values projected from length n to k (low rank);
* :mod:`~tfm_course.efficient.performer` — FAVOR+ positive random features (kernel trick);
* :mod:`~tfm_course.efficient.causal_performer` — FAVOR+ with RoPE as a causal mixer that also
  steps one token at a time (fixed-size state);
* :mod:`~tfm_course.efficient.sparse` — window / global / random masks (Longformer, BigBird);
* :mod:`~tfm_course.efficient.retnet` — retention: parallel, recurrent and chunkwise forms;
* :mod:`~tfm_course.efficient.mamba` — the selective scan (S6) and the Mamba block;
* :mod:`~tfm_course.efficient.approximation` — how far Performer / Linformer are from softmax;
* :mod:`~tfm_course.efficient.attention_layers` — softmax, window, Linformer or Performer as one
  drop-in non-causal self-attention layer;
* :mod:`~tfm_course.efficient.cases` — every method's mixing step, for timing and memory sweeps.

Each module reads on its own; :mod:`tfm_course.experiments.scaling` measures them side by side.
"""

from .causal_performer import CausalPerformer
from .flash import online_softmax_step, tiled_attention
from .linformer import LinformerSelfAttention, linformer_attention
from .mamba import MambaBlock, selective_scan
from .performer import PerformerAttention, favor_attention
from .retnet import MultiScaleRetention, retention
from .sparse import bigbird_mask, longformer_mask, sliding_window_mask

__all__ = [
    "tiled_attention", "online_softmax_step",
    "linformer_attention", "LinformerSelfAttention",
    "favor_attention", "PerformerAttention", "CausalPerformer",
    "retention", "MultiScaleRetention",
    "selective_scan", "MambaBlock",
    "sliding_window_mask", "longformer_mask", "bigbird_mask",
]
