"""Hugging Face's GPT-2 in our :class:`~tfm_course.models.gpt.GPT`: its settings, its weights, its files.

:meth:`GPT.from_hf <tfm_course.models.gpt.GPT.from_hf>` and
:meth:`GPT.from_pretrained <tfm_course.models.gpt.GPT.from_pretrained>` use these. Two details
decide whether a copy is exact:

* Hugging Face's GPT-2 uses ``Conv1D`` layers, whose weight is ``(in, out)``: the transpose of
  ``nn.Linear``'s ``(out, in)``;
* its ``c_attn`` packs the query, key and value projections side by side, ``(d, 3·d)``, in that
  order, exactly as our ``CausalSelfAttention.qkv`` (transposed).

``transformers`` is imported only to load a folder, never by the rest of the package.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["config_from_hf", "copy_hf_weights", "load_hf_gpt2"]

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def config_from_hf(c: Any) -> dict[str, Any]:
    """``GPTConfig`` keyword arguments for a Hugging Face ``GPT2Config``; ``ValueError`` for a
    setting our model does not have."""
    if c.activation_function not in _ACTIVATIONS:
        raise ValueError(f"unsupported activation_function {c.activation_function!r}")
    unsupported = {"n_inner": c.n_inner not in (None, 4 * c.n_embd),
                   "layer_norm_epsilon": c.layer_norm_epsilon != 1e-5,
                   "scale_attn_weights": not c.scale_attn_weights,
                   "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx,
                   "add_cross_attention": c.add_cross_attention,
                   # one dropout rate here (embeddings, attention weights, residual branches)
                   "embd_pdrop/attn_pdrop/resid_pdrop": len({c.embd_pdrop, c.attn_pdrop, c.resid_pdrop}) > 1}
    if any(unsupported.values()):
        raise ValueError(f"GPT2Config settings without a counterpart here: "
                         f"{[k for k, bad in unsupported.items() if bad]}")
    return dict(vocab_size=c.vocab_size, max_len=c.n_positions, d_model=c.n_embd, n_layers=c.n_layer,
                n_heads=c.n_head, dropout=c.resid_pdrop, activation=_ACTIVATIONS[c.activation_function])


@torch.no_grad()
def copy_hf_weights(ours: nn.Module, hf_model: nn.Module) -> None:
    """Copy a ``GPT2LMHeadModel``'s weights into ``ours``, a ``GPT`` of the same configuration."""
    hf = hf_model.transformer
    if hf_model.lm_head.weight.data_ptr() != hf.wte.weight.data_ptr():
        raise ValueError("the Hugging Face model's output layer is not tied to its embedding")
    pairs = [(ours.norm, hf.ln_f)]
    ours.tok_embed.weight.copy_(hf.wte.weight)
    ours.pos_embed.weight.copy_(hf.wpe.weight)
    for block, h in zip(ours.blocks, hf.h):
        pairs += [(block.norm1, h.ln_1), (block.norm2, h.ln_2)]
        for layer, conv in ((block.attn.qkv, h.attn.c_attn), (block.attn.out_proj, h.attn.c_proj),
                            (block.ffn.linear1, h.mlp.c_fc), (block.ffn.linear2, h.mlp.c_proj)):
            layer.weight.copy_(conv.weight.t())  # Conv1D (in, out) -> Linear (out, in)
            layer.bias.copy_(conv.bias)
    for norm, theirs in pairs:
        norm.weight.copy_(theirs.weight)
        norm.bias.copy_(theirs.bias)


def load_hf_gpt2(name_or_folder: str | Path = "gpt2", sha256: str | None = None,
                 revision: str | None = None) -> nn.Module:
    """A Hugging Face ``GPT2LMHeadModel`` (eval mode) from a ``save_pretrained`` folder, or from
    the Hub (downloaded at ``revision``; the tokenizer's ``vocab.json`` and ``merges.txt`` come
    along). With ``sha256``, ``model.safetensors`` must have that hash, else ``ValueError``."""
    from transformers import GPT2LMHeadModel  # optional dependency: only loading needs it

    folder = Path(name_or_folder)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download
        folder = Path(snapshot_download(str(name_or_folder), revision=revision, allow_patterns=[
            "config.json", "model.safetensors", "vocab.json", "merges.txt"]))
    if sha256 is not None:
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        if digest != sha256.lower():
            raise ValueError(f"{folder / 'model.safetensors'} has sha256 {digest}, expected {sha256}")
    return GPT2LMHeadModel.from_pretrained(folder).eval()
