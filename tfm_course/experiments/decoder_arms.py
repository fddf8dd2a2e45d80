"""Chapter 13's ablation arms: chapter 8's GPT with one of Llama's or Qwen3's changes switched on.

    build = make("SwiGLU")                 # build(vocab_size, seed) -> Llama, for gpt_recipe.train_lm(make=...)
    config("RoPE", vocab_size=1024)        # the arm's LlamaConfig at chapter 8's CPU sizes

The base arm is chapter 8's GPT as nanoGPT's CPU configuration trains it: LayerNorm, tanh GELU,
learned positions, tied output layer, no biases. "biases" therefore *adds* them; the last arm
switches on every change that differs from the base (Qwen3's block). ``tools/runs/decoder_ablation.py``
trains them; the chapter reads the arms from here so that its live run is the stored one's.
"""

from __future__ import annotations

import dataclasses

import torch

from ..models.llama import Llama, LlamaConfig
from . import gpt_recipe as R

__all__ = ["ARMS", "BASE", "ALL", "config", "make"]

BASE, ALL = "GPT-2 (chapter 8)", "all (Qwen3's block)"
ARMS: dict[str, dict] = {
    BASE: {},
    "RMSNorm": {"norm": "rms"},
    "SwiGLU": {"ffn": "swiglu"},
    "RoPE": {"positions": "rope"},
    "GQA, 2 K/V heads": {"n_kv_heads": 2},
    "biases": {"bias": True},
    "QK-norm": {"qk_norm": True},
    "untied output layer": {"tie": False},
    ALL: {"norm": "rms", "ffn": "swiglu", "positions": "rope", "n_kv_heads": 2, "qk_norm": True, "tie": False},
}


def config(arm: str, vocab_size: int, recipe: dict = R.RECIPE) -> LlamaConfig:
    """The arm's configuration at the recipe's sizes (chapter 8's CPU model by default)."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {list(ARMS)}, got {arm!r}")
    base = LlamaConfig.gpt2(vocab_size=vocab_size, d_model=recipe["d_model"], n_layers=recipe["n_layers"],
                            n_heads=recipe["n_heads"], max_len=recipe["block"], bias=False,
                            dropout=recipe["dropout"])
    return dataclasses.replace(base, **ARMS[arm])


def make(arm: str, recipe: dict = R.RECIPE):
    """``build(vocab_size, seed) -> Llama``: the arm's model, seeded, for ``gpt_recipe.train_lm(make=...)``."""
    config(arm, 1, recipe)  # fail now on a wrong arm, not in a worker

    def build(vocab_size: int, seed: int) -> Llama:
        torch.manual_seed(seed)
        return Llama(config(arm, vocab_size, recipe))
    return build
