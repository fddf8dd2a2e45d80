"""Hugging Face's GPT-2 in our :class:`~tfm_course.models.gpt.GPT`: its settings, its weights, its files.

:meth:`GPT.from_hf <tfm_course.models.gpt.GPT.from_hf>` and
:meth:`GPT.from_pretrained <tfm_course.models.gpt.GPT.from_pretrained>` use these. Two details
decide whether a copy is exact:

* Hugging Face's GPT-2 uses ``Conv1D`` layers, whose weight is ``(in, out)``: the transpose of
  ``nn.Linear``'s ``(out, in)``;
* its ``c_attn`` packs the query, key and value projections side by side, ``(d, 3·d)``, in that
  order, exactly as our ``CausalSelfAttention.qkv`` (transposed).

:func:`to_hf_gpt2` goes the other way: a ``GPT2LMHeadModel`` holding our weights, for timing or
checking ours against Hugging Face's implementation. ``transformers`` is imported only inside
:func:`load_hf_gpt2` and :func:`to_hf_gpt2`, never by the rest of the package.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["config_from_hf", "copy_hf_weights", "load_hf_gpt2", "to_hf_gpt2"]

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu"}  # ours -> GPT-2's name for it


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


def _matching_layers(ours: nn.Module, hf_model: nn.Module) -> tuple[list, list]:
    """Our linear layers beside their ``Conv1D`` counterparts, and our norms beside theirs."""
    hf = hf_model.transformer
    linears, norms = [], [(ours.norm, hf.ln_f)]
    for block, h in zip(ours.blocks, hf.h):
        norms += [(block.norm1, h.ln_1), (block.norm2, h.ln_2)]
        linears += [(block.attn.qkv, h.attn.c_attn), (block.attn.out_proj, h.attn.c_proj),
                    (block.ffn.linear1, h.mlp.c_fc), (block.ffn.linear2, h.mlp.c_proj)]
    return linears, norms


@torch.no_grad()
def copy_hf_weights(ours: nn.Module, hf_model: nn.Module) -> None:
    """Copy a ``GPT2LMHeadModel``'s weights into ``ours``, a ``GPT`` of the same configuration."""
    hf = hf_model.transformer
    if hf_model.lm_head.weight.data_ptr() != hf.wte.weight.data_ptr():
        raise ValueError("the Hugging Face model's output layer is not tied to its embedding")
    ours.tok_embed.weight.copy_(hf.wte.weight)
    ours.pos_embed.weight.copy_(hf.wpe.weight)
    linears, norms = _matching_layers(ours, hf_model)
    for layer, conv in linears:
        layer.weight.copy_(conv.weight.t())  # Conv1D (in, out) -> Linear (out, in)
        layer.bias.copy_(conv.bias)
    for norm, theirs in norms:
        norm.weight.copy_(theirs.weight)
        norm.bias.copy_(theirs.bias)


def to_hf_gpt2(model: nn.Module) -> nn.Module:
    """A Hugging Face ``GPT2LMHeadModel`` holding the weights of ``model``, a
    :class:`~tfm_course.models.gpt.GPT`: the same logits ``(B, T, vocab)``, on the same device and
    dtype, in the same training / eval mode.

    Its ``GPT2Config`` has our sizes (``n_embd``, ``n_layer``, ``n_head``, ``n_positions`` =
    ``max_len``, ``vocab_size``), ``activation_function`` ``"gelu_new"`` for our ``"gelu_tanh"``
    and ``"gelu"`` for the exact GELU, our dropout rate for all three of its dropouts,
    ``layer_norm_epsilon`` 1e-5 and no special tokens (ours has none). Each ``Conv1D`` gets the
    transpose of our ``nn.Linear`` weight. GPT-2 always has biases: a ``bias=False`` model's become
    zeros there (still added, and still given gradients: a little extra work for Hugging Face's).
    """
    # duck-typed: gpt.py imports this module, so importing GPT here would make an import cycle
    if not all(hasattr(model, name) for name in ("config", "tok_embed", "pos_embed", "blocks", "norm")):
        raise ValueError(f"expected a tfm_course GPT, got {type(model).__name__}")
    from transformers import GPT2Config, GPT2LMHeadModel  # optional dependency

    c = model.config
    hf_config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model,
                           n_layer=c.n_layers, n_head=c.n_heads, n_inner=None,
                           activation_function=_HF_ACTIVATION[c.activation],
                           resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
                           layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None)
    weight = model.tok_embed.weight
    hf_model = GPT2LMHeadModel(hf_config).to(device=weight.device, dtype=weight.dtype)
    hf_model.loss_type = "ForCausalLM"  # the loss it falls back on anyway, without a warning
    hf = hf_model.transformer
    with torch.no_grad():
        hf.wte.weight.copy_(model.tok_embed.weight)  # the output layer shares this tensor
        hf.wpe.weight.copy_(model.pos_embed.weight)
        linears, norms = _matching_layers(model, hf_model)
        for layer, conv in linears:
            conv.weight.copy_(layer.weight.t())  # Linear (out, in) -> Conv1D (in, out)
        for ours, theirs in linears + norms:
            if ours.bias is None:
                theirs.bias.zero_()
            else:
                theirs.bias.copy_(ours.bias)
        for ours, theirs in norms:
            theirs.weight.copy_(ours.weight)
    return hf_model.train(model.training)


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
