"""Hugging Face's names for T5's weights, and reading a ``save_pretrained`` folder without ``transformers``.

Hugging Face nests each block's sub-layers in a list (``encoder.block.3.layer.0`` is the
self-attention, ``layer.1`` the feed-forward block; in the decoder ``layer.1`` is the
cross-attention and ``layer.2`` the feed-forward block). :func:`hf_key` maps each name to
:class:`~tfm_course.models.t5.T5`'s, which :meth:`T5.from_hf <tfm_course.models.t5.T5.from_hf>`
and :meth:`T5.from_pretrained <tfm_course.models.t5.T5.from_pretrained>` use.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["hf_key", "hf_state_to_ours", "read_hf_folder"]

_HF_NAMES = {  # (stack, index in block.N.layer) -> which sub-layer it is
    ("encoder", 0): "self", ("encoder", 1): "ffn",
    ("decoder", 0): "self", ("decoder", 1): "cross", ("decoder", 2): "ffn",
}
_HF_PARTS = {
    "self": [("SelfAttention.relative_attention_bias.", "relative_bias.embedding."),
             ("SelfAttention.", "self_attn."), ("layer_norm.", "norm_self.")],
    "cross": [("EncDecAttention.", "cross_attn."), ("layer_norm.", "norm_cross.")],
    "ffn": [("DenseReluDense.wi.", "ffn.linear1."), ("DenseReluDense.wo.", "ffn.linear2."),
            ("layer_norm.", "norm_ffn.")],
    "gated ffn": [("DenseReluDense.wi_0.", "ffn.gate."), ("DenseReluDense.wi_1.", "ffn.up."),
                  ("DenseReluDense.wo.", "ffn.down."), ("layer_norm.", "norm_ffn.")],
}


def hf_key(key: str, gated: bool = False) -> str:
    """``decoder.block.3.layer.1.EncDecAttention.q.weight`` -> ``decoder.blocks.3.cross_attn.q.weight``.

    ``gated``: the feed-forward blocks are gated-GELU ones (``wi_0``, ``wi_1``, ``wo``).
    """
    match = re.fullmatch(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)", key)
    if match is None:
        return key.replace("final_layer_norm.", "final_norm.")
    stack, block, sub, rest = match.groups()
    part = _HF_NAMES.get((stack, int(sub)))
    if part == "ffn" and gated:
        part = "gated ffn"
    for theirs, ours in _HF_PARTS.get(part, []):
        if rest.startswith(theirs):
            return f"{stack}.blocks.{block}.{ours}{rest[len(theirs):]}"
    return key


def hf_state_to_ours(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a Hugging Face T5 state dict; drop the aliases of ``shared.weight`` (``embed_tokens``)
    and the cross-attention bias table some old checkpoints carry but never use."""
    gated = any(".DenseReluDense.wi_0." in key for key in state)
    return {hf_key(key, gated): value for key, value in state.items()
            if not key.endswith("embed_tokens.weight")
            and "EncDecAttention.relative_attention_bias" not in key}


def read_hf_folder(folder: str | Path, sha256: str | None = None) -> tuple[dict, dict[str, Tensor]]:
    """``(config.json as a dict, state dict)`` of a ``save_pretrained`` folder, on the CPU.

    Reads ``model.safetensors`` (needs the ``safetensors`` package, which comes with
    ``transformers``) or else ``pytorch_model.bin`` (``torch.load(weights_only=True)``). With
    ``sha256``, the weights file must have that digest, or a ``ValueError`` says which it has.
    """
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ValueError(f"{folder} has no config.json: is it a save_pretrained folder?")
    config = json.loads((folder / "config.json").read_text())
    weights = next((folder / name for name in ("model.safetensors", "pytorch_model.bin")
                    if (folder / name).exists()), None)
    if weights is None:
        raise ValueError(f"{folder} holds neither model.safetensors nor pytorch_model.bin")
    if sha256 is not None:
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()
        if digest != sha256.lower():
            raise ValueError(f"sha256 of {weights} is {digest}, expected {sha256}")
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return config, load_file(str(weights))
    return config, torch.load(weights, map_location="cpu", weights_only=True)
