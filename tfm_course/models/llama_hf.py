"""Hugging Face's Llama and Qwen3 weights in the course's :class:`~tfm_course.models.llama.Llama`.

    model = from_hf(hf_model)                       # a LlamaForCausalLM / Qwen3ForCausalLM in memory
    model = load_pretrained(folder, sha256="…")     # config.json + model.safetensors, no transformers

The two layouts hold the same tensors under other names (:func:`hf_name`); no tensor is permuted:
Hugging Face's Llama pairs RoPE features in split halves, as :class:`RotaryEmbedding` does (Meta's
original checkpoints pair adjacent features; their conversion script permutes the query and key
rows once, so the HF files already match).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch

from .llama import Llama, LlamaConfig

__all__ = ["config_from_hf", "hf_name", "from_hf", "load_pretrained", "sha256_of"]

_LAYER = {  # ours, after "blocks.{i}." -> theirs, after "model.layers.{i}."
    "norm1.weight": "input_layernorm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "ffn.gate.weight": "mlp.gate_proj.weight",
    "ffn.up.weight": "mlp.up_proj.weight",
    "ffn.down.weight": "mlp.down_proj.weight",
}


def hf_name(ours: str) -> str:
    """Our parameter name -> Hugging Face's, e.g. ``blocks.3.ffn.gate.weight`` ->
    ``model.layers.3.mlp.gate_proj.weight``."""
    top = {"tok_embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight"}
    if ours in top:
        return top[ours]
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", ours)
    if m is None:
        raise ValueError(f"not a parameter of the Llama layout: {ours!r}")
    rest = m[2]
    if rest in _LAYER:
        return f"model.layers.{m[1]}.{_LAYER[rest]}"
    proj = re.fullmatch(r"attn\.([qkvo])_proj\.(weight|bias)", rest)
    if proj is None:
        raise ValueError(f"not a parameter of the Llama layout: {ours!r}")
    return f"model.layers.{m[1]}.self_attn.{proj[1]}_proj.{proj[2]}"


def config_from_hf(config: Mapping[str, Any] | Any) -> LlamaConfig:
    """A :class:`LlamaConfig` from a Hugging Face config (object or ``config.json`` dict) of
    ``model_type`` "llama" or "qwen3"."""
    c = dict(config) if isinstance(config, Mapping) else config.to_dict()
    kind = c.get("model_type")
    if kind not in ("llama", "qwen3"):
        raise ValueError(f"model_type must be 'llama' or 'qwen3', got {kind!r}")
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only SwiGLU (hidden_act 'silu') is supported, got {c['hidden_act']!r}")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind_of_rope = rope.get("rope_type", rope.get("type", "default"))
    if kind_of_rope not in ("default", "linear"):
        raise ValueError(f"RoPE scaling {kind_of_rope!r} is not supported (default and linear are)")
    if c.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported")
    if c.get("mlp_bias") or c.get("attention_bias"):
        raise ValueError("biases are not supported (Llama and Qwen3 have none by default)")
    sizes = dict(vocab_size=c["vocab_size"], d_model=c["hidden_size"], n_layers=c["num_hidden_layers"],
                 n_heads=c["num_attention_heads"], n_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                 head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                 d_ff=c["intermediate_size"], max_len=c.get("max_position_embeddings", 2048),
                 rope_base=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                 rope_scale=float(rope.get("factor", 1.0)) if kind_of_rope == "linear" else 1.0,
                 eps=c.get("rms_norm_eps", 1e-6))
    return replace(LlamaConfig.llama(**sizes), qk_norm=kind == "qwen3", tie=bool(c.get("tie_word_embeddings", False)))


def _load(config: LlamaConfig, state: Mapping[str, torch.Tensor]) -> Llama:
    model = Llama(config)
    ours = model.state_dict()
    missing = [hf_name(k) for k in ours if hf_name(k) not in state and not (config.tie and k == "lm_head.weight")]
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    unused = sorted(set(state) - {hf_name(k) for k in ours})
    if unused:  # a layer the configuration does not describe (biases, a second norm...): refuse, do not drop
        raise ValueError(f"the checkpoint has {len(unused)} tensors this configuration has no place for, "
                         f"e.g. {unused[:3]}")
    with torch.no_grad():
        for name, tensor in ours.items():
            theirs = state.get(hf_name(name))
            if theirs is None:  # the tied output layer: the embedding, already loaded
                continue
            if theirs.shape != tensor.shape:
                raise ValueError(f"{hf_name(name)}: expected shape {tuple(tensor.shape)}, got {tuple(theirs.shape)}")
            tensor.copy_(theirs)
    return model


def from_hf(hf_model: torch.nn.Module) -> Llama:
    """Our copy of a Hugging Face ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (fp32, on the CPU)."""
    state = {k: v.detach().float().cpu() for k, v in hf_model.state_dict().items()}
    return _load(config_from_hf(hf_model.config), state)


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_pretrained(folder: str | Path, sha256: str | None = None) -> Llama:
    """Our model from a Hugging Face checkpoint folder (``config.json``, ``model.safetensors``),
    without ``transformers``; ``sha256`` (of the weights file) is checked when given."""
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = folder / "model.safetensors"
    if not weights.exists() or not (folder / "config.json").exists():
        raise ValueError(f"{folder} must hold config.json and model.safetensors")
    if sha256 is not None and sha256_of(weights) != sha256:
        raise ValueError(f"{weights}: sha256 {sha256_of(weights)} is not the pinned {sha256}")
    config = config_from_hf(json.loads((folder / "config.json").read_text()))
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    return _load(config, state)
