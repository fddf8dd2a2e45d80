"""Where a training step's memory goes: the training state, and the activations saved for backward.

    training_state_bytes(model, "adamw", "fp32")      # parameters + gradients + optimizer state
    measured_state_bytes(model, optimizer)            # the same, summed from the real tensors
    saved_activation_bytes(lambda: model(ids, targets)[1]).total   # what autograd keeps
    gpt_activation_bytes(config, batch, seq_len)      # the same, counted by a formula
    gpt_training_memory(config, batch, seq_len, "autocast"); memory_table(batch=8)

A step holds two kinds of memory. The **training state** grows with the number of parameters N
and not with the batch: the weights, their gradients and the optimizer's state (AdamW: two
moments per weight). The **activations** are the tensors the forward pass saves for backward;
they grow with batch × sequence length and are usually the larger part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..models.gpt import GPTConfig

__all__ = ["OPTIMIZERS", "PRECISIONS", "training_state_bytes", "measured_state_bytes",
           "SavedActivations", "saved_activation_bytes", "gpt_n_params", "gpt_activation_bytes",
           "gpt_training_memory", "memory_table"]

OPTIMIZERS = {"adamw": 2, "sgd": 0, "sgd_momentum": 1}  # fp32 state tensors per parameter
# bytes per parameter: (parameter, gradient, fp32 master copy); optimizer states are fp32 in all
PRECISIONS = {"fp32": (4, 4, 0), "autocast": (4, 4, 0), "mixed": (2, 2, 4)}
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _choice(name: str, value: Any, options: Any) -> None:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name}: expected one of {tuple(options)}, got {value!r}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


# --------------------------------------------------------------------------- the training state
def training_state_bytes(model_or_n_params: nn.Module | int, optimizer: str = "adamw",
                         precision: str = "fp32") -> dict[str, int]:
    """Bytes of the training state of N parameters: keys ``parameters``, ``gradients``,
    ``optimizer``, ``master_weights``, ``total`` and ``bytes_per_parameter``.

    ======================  =========  ========  ===========  ================  =======
    precision               parameter  gradient  fp32 master  AdamW (m and v)   total
    ======================  =========  ========  ===========  ================  =======
    ``"fp32"``              4          4         0            4 + 4             16
    ``"mixed"`` (ZeRO)      2          2         4            4 + 4             16
    ``"autocast"``          4          4         0            4 + 4             16
    ======================  =========  ========  ===========  ================  =======

    ``"mixed"`` is mixed precision as the ZeRO paper counts it (Rajbhandari et al., 2020, §3.1):
    fp16/bf16 parameters and gradients, plus an fp32 master copy of the weights and fp32 Adam
    states, 2 + 2 + 4 + 8 = 16 bytes, exactly what fp32 training needs. ``"autocast"`` is
    PyTorch's ``torch.autocast``: parameters, gradients and optimizer state all stay fp32
    (16 bytes); it only adds *transient* low-precision copies of the weights, made in the forward
    pass (they count with the activations, :func:`saved_activation_bytes`). So mixed precision does
    **not** halve the training state; what it halves is the activations. SGD keeps no state,
    SGD with momentum one buffer (4 bytes). A module's frozen parameters (``requires_grad=False``)
    count as parameters only; ``bytes_per_parameter`` is that of a trained one.
    """
    if isinstance(model_or_n_params, nn.Module):
        params = list(model_or_n_params.parameters())  # a tied weight is listed once
        n_all = sum(p.numel() for p in params)
        n = sum(p.numel() for p in params if p.requires_grad)
    elif isinstance(model_or_n_params, int) and not isinstance(model_or_n_params, bool) \
            and model_or_n_params >= 0:
        n_all = n = model_or_n_params
    else:
        raise ValueError(f"model_or_n_params: expected an nn.Module or an int >= 0, "
                         f"got {model_or_n_params!r}")
    _choice("optimizer", optimizer, OPTIMIZERS)
    _choice("precision", precision, PRECISIONS)
    p_bytes, g_bytes, master_bytes = PRECISIONS[precision]
    out = {"parameters": p_bytes * n_all, "gradients": g_bytes * n,
           "optimizer": 4 * OPTIMIZERS[optimizer] * n, "master_weights": master_bytes * n}
    out["total"] = sum(out.values())
    out["bytes_per_parameter"] = p_bytes + g_bytes + master_bytes + 4 * OPTIMIZERS[optimizer]
    return out


def measured_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes of the real tensors: ``parameters``, their ``.grad`` (``gradients``), the tensors
    in ``optimizer.state`` (``optimizer``) and ``step_counters``, ``total``.

    Measure after ``loss.backward(); optimizer.step()`` and before ``zero_grad()`` (which sets
    the gradients to ``None``): AdamW creates its state at the first step. AdamW also keeps a
    one-number ``step`` tensor per parameter tensor (4 bytes each): that is ``step_counters``,
    left out of ``optimizer`` and ``total``, so that ``total`` equals
    :func:`training_state_bytes`'s exactly. Each storage is counted once.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer: expected a torch.optim.Optimizer, "
                         f"got {type(optimizer).__name__}")
    seen: set[tuple[torch.device, int]] = set()
    out = dict.fromkeys(("parameters", "gradients", "optimizer", "step_counters"), 0)

    def add(kind: str, t: Any) -> None:
        if isinstance(t, Tensor) and _key(t) not in seen:  # a storage counts once
            seen.add(_key(t))
            out[kind] += t.untyped_storage().nbytes()

    params = list(model.parameters())
    for p in params:
        add("parameters", p)
    for p in params:
        add("gradients", p.grad)
    for state in optimizer.state.values():
        for name, value in state.items():
            add("step_counters" if name == "step" else "optimizer", value)
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer"]
    return out


# --------------------------------------------------------------------------- activations, measured
@dataclass
class SavedActivations:
    """What :func:`saved_activation_bytes` found. ``total``: bytes of the distinct storages saved
    for backward, parameters and weight copies left out; ``by_op``: the same bytes by the forward
    op that saved them (autograd's node name without ``Backward0``; a storage saved by several ops
    counts for the first; ``"unreached"`` for those not reachable from ``fn``'s output);
    ``weight_copies``: bytes of saved low-precision copies of parameters (autocast's casts);
    ``parameters``: bytes of the parameters saved (not activations: they exist anyway);
    ``output``: what ``fn`` returned, so that ``output.backward()`` still works."""

    total: int
    by_op: dict[str, int]
    weight_copies: int
    parameters: int
    output: Any = field(default=None, repr=False)


def _key(t: Tensor) -> tuple[torch.device, int]:
    """One key per storage: views of a tensor share its storage, so they share the key."""
    return t.device, t.untyped_storage().data_ptr()


def _is_weight_copy(t: Tensor) -> bool:
    """A tensor made by casting a parameter (``param.to(bf16)``, as autocast does), or its view."""
    node = t.grad_fn
    if node is None or type(node).__name__ != "ToCopyBackward0":
        return False
    source = node.next_functions[0][0]
    return isinstance(getattr(source, "variable", None), nn.Parameter)


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in _tensors(v)] if isinstance(value, (tuple, list)) else []


def _saver_by_storage(outputs: list[Tensor]) -> dict[tuple[torch.device, int], str]:
    """Walk the graph behind ``outputs``: the name of the first-created node saving each storage."""
    first: dict[tuple[torch.device, int], tuple[int, str]] = {}
    stack, seen = [t.grad_fn for t in outputs if t.grad_fn is not None], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
        name = re.sub(r"Backward\d*$", "", type(node).__name__)  # "AddmmBackward0" -> "Addmm"
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except RuntimeError:  # already freed by a backward pass
                    continue
                for t in _tensors(value):
                    order = (node._sequence_nr(), name)
                    first[_key(t)] = min(first.get(_key(t), order), order)
    return {key: name for key, (_, name) in first.items()}


def saved_activation_bytes(fn: Callable[[], Any]) -> SavedActivations:
    """Run ``fn()`` (a forward pass that builds a graph, e.g. ``lambda: model(ids, targets)[1]``)
    and measure the tensors autograd saves for backward, with ``saved_tensors_hooks``.

    Every saved tensor goes through the hook; it is de-duplicated by storage (q, k and v are views
    of one qkv output, log-softmax's result is saved by the NLL loss too), and a storage that is
    an ``nn.Parameter``'s is left out: a linear layer saves its weight, but the weight is training
    state, not an activation. The hook returns each tensor unchanged (backward works as usual).
    Saved integer tensors (token ids, targets, positions) do count: the graph holds them.
    """
    saved: dict[tuple[torch.device, int], Tensor] = {}  # holding them keeps addresses unique
    params: dict[tuple[torch.device, int], int] = {}

    def pack(t: Tensor) -> Tensor:
        base = t if t._base is None else t._base
        if isinstance(base, nn.Parameter):
            params[_key(t)] = t.untyped_storage().nbytes()
        else:
            saved.setdefault(_key(t), base)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = fn()
    saver = _saver_by_storage(_tensors(output))
    total = copies = 0
    by_op: dict[str, int] = {}
    for key, t in saved.items():
        if key in params:
            continue
        nbytes = t.untyped_storage().nbytes()
        if _is_weight_copy(t):
            copies += nbytes
            continue
        total += nbytes
        op = saver.get(key, "unreached")
        by_op[op] = by_op.get(op, 0) + nbytes
    return SavedActivations(total, by_op, copies, sum(params.values()), output)


# --------------------------------------------------------------------------- activations, counted
def gpt_n_params(config: GPTConfig) -> int:
    """Parameters of our GPT: V·d + max_len·d (embeddings; the head is tied) + L·12·d² + biases
    and norms (per block 13·d with ``bias``, else 2·d; the final norm 2·d or d)."""
    d, bias = config.d_model, config.bias
    per_block = 12 * d * d + (13 * d if bias else 2 * d)
    embeddings = (config.vocab_size + config.max_len) * d
    return embeddings + config.n_layers * per_block + (2 if bias else 1) * d


def gpt_activation_bytes(config: GPTConfig, batch: int, seq_len: int,
                         dtype: torch.dtype = torch.float32,
                         autocast_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes our GPT's forward saves for backward on the CPU, counted: keys ``block`` (one block),
    ``blocks``, ``embeddings``, ``final_norm``, ``head``, ``loss``, ``total`` and
    ``weight_copies`` (autocast's saved weight casts, not in ``total``).

    ``dtype`` is the parameters' dtype, ``autocast_dtype`` that of ``torch.autocast`` (fp32
    parameters only). With N = batch·seq_len tokens, d = d_model, a = n_heads, V = vocab_size and
    itemsizes r = ``dtype`` (the residual stream, layer norms), c = the autocast dtype, else r
    (linear layers' inputs, attention, GELU), l = max(c, 4) (attention's logsumexp is kept in at
    least fp32), f = 4 under autocast (cross-entropy runs in fp32), else r::

        block      = (2·r + 14·c)·N·d + 4·r·N + l·a·N
                     2 norms' inputs (the residual stream), their mean and 1/std (N numbers each);
                     qkv's input 1, q, k, v 3 (views of one output), attention's output 1
                     (out_proj's input is a view of it), its logsumexp (a per token);
                     linear1's input 1, GELU's input 4, linear2's input 4  -> 14 in units of N·d
        embeddings = 8·N + 8·seq_len        the int64 token ids and positions
        final_norm = r·N·d + 2·r·N;  head = c·N·d (the tied output layer's input)
        loss       = f·N·V + 8·N + f        log-softmax's result, the targets, the total weight
        total      = L·block + embeddings + final_norm + head + loss
        weight_copies = c·(12·d²·L + V·d)   under autocast (the cast of each matrix), else 0

    In fp32 a block saves 64·N·d + 16·N + 4·a·N bytes; under bf16 autocast 36·N·d + 16·N + 4·a·N.
    Korthikanti et al. (2022) count 34·s·b·h + 5·a·s²·b bytes per layer (16-bit activations): ours
    has no dropout (−2: their two 1-byte masks), keeps the layer norms' inputs in fp32 (+4), and
    its fused attention saves a logsumexp (4·a·s·b) instead of the softmax, its dropout mask and
    output (5·a·s²·b) — the quadratic term is gone. A model held in bf16 (``dtype=bfloat16``, the
    ``"mixed"`` row) saves 32·N·d + 8·N + 4·a·N. Not checked on a GPU: there the attention kernels
    may save a few small tensors of other sizes (a padded logsumexp, random-number state) and a
    bf16 model's layer norms keep fp32 statistics. ``logits``, returned, are not counted.
    """
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config: expected a GPTConfig, got {type(config).__name__}")
    _positive_int("batch", batch)
    _positive_int("seq_len", seq_len)
    if seq_len > config.max_len:
        raise ValueError(f"seq_len: expected at most max_len={config.max_len}, got {seq_len}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {_DTYPES}, got {dtype!r}")
    if autocast_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"autocast_dtype: expected None, torch.bfloat16 or torch.float16, "
                         f"got {autocast_dtype!r}")
    if autocast_dtype is not None and dtype != torch.float32:
        raise ValueError(f"dtype: autocast casts fp32 weights, expected torch.float32, got {dtype}")
    if config.dropout != 0.0:
        raise ValueError(f"config.dropout: dropout masks are not counted, expected 0.0, "
                         f"got {config.dropout}")
    N, d, a, V, L = (batch * seq_len, config.d_model, config.n_heads, config.vocab_size,
                     config.n_layers)
    r = dtype.itemsize
    c = r if autocast_dtype is None else autocast_dtype.itemsize
    l, f = max(c, 4), r if autocast_dtype is None else 4
    out = {"block": (2 * r + 14 * c) * N * d + 4 * r * N + l * a * N}
    out["blocks"] = L * out["block"]
    out["embeddings"] = 8 * N + 8 * seq_len
    out["final_norm"] = r * N * d + 2 * r * N
    out["head"] = c * N * d
    out["loss"] = f * N * V + 8 * N + f
    out["total"] = sum(out[k] for k in ("blocks", "embeddings", "final_norm", "head", "loss"))
    out["weight_copies"] = 0 if autocast_dtype is None else c * (12 * d * d * L + V * d)
    return out


def gpt_training_memory(config: GPTConfig, batch: int, seq_len: int, precision: str = "fp32",
                        optimizer: str = "adamw", n_params: int | None = None) -> dict[str, int]:
    """Training state plus activations of one step: :func:`training_state_bytes`'s keys (as
    ``state``), ``activations``, ``weight_copies`` and ``total``. ``precision``: ``"fp32"``;
    ``"autocast"`` (fp32 state, bf16 autocast activations); ``"mixed"`` (a bf16 model with fp32
    master weights: bf16 activations). ``n_params`` overrides :func:`gpt_n_params`."""
    _choice("precision", precision, PRECISIONS)
    n = gpt_n_params(config) if n_params is None else n_params
    state = training_state_bytes(n, optimizer, precision)
    dtype = torch.bfloat16 if precision == "mixed" else torch.float32
    acts = gpt_activation_bytes(config, batch, seq_len, dtype,
                                torch.bfloat16 if precision == "autocast" else None)
    out = {"n_params": n, "state": state["total"], "activations": acts["total"],
           "weight_copies": acts["weight_copies"]}
    out["total"] = out["state"] + out["activations"] + out["weight_copies"]
    return out


def memory_table(batch: int = 8, ours: GPTConfig | None = None) -> list[dict[str, Any]]:
    """Rows for chapter 12: our GPT (default: d 128, 4 layers, vocab 512, context 128), GPT-2 small
    and a 7B Llama-like model, each at its full context and ``batch`` sequences, with the
    training state (AdamW) in fp32 and ``"mixed"`` and the activations in fp32 and bf16 autocast.

    The Llama row counts its own parameters (32 blocks of 4·d² attention + 3·d·11008 SwiGLU + 2·d
    norms, untied 32000-token embedding and head: 6.74 B), but its activations with our GPT-2
    layout formula (4·d GELU FFN, LayerNorm, learned positions): an approximation.
    """
    _positive_int("batch", batch)
    ours = ours or GPTConfig(vocab_size=512, max_len=128, d_model=128, n_layers=4, n_heads=4)
    d = 4096
    models = [("our GPT", ours, None, ""),
              ("GPT-2 small", GPTConfig(50257, 1024, 768, 12, 12), None, ""),
              ("Llama-like 7B", GPTConfig(32000, 4096, d, 32, 32, bias=False),
               32 * (4 * d * d + 3 * d * 11008 + 2 * d) + 2 * 32000 * d + d,
               "activations: GPT-2-layout formula, an approximation for Llama")]
    rows = []
    for name, config, n_params, note in models:
        n = gpt_n_params(config) if n_params is None else n_params
        fp32, bf16 = (gpt_activation_bytes(config, batch, config.max_len, autocast_dtype=autocast)
                      for autocast in (None, torch.bfloat16))
        rows.append({"model": name, "n_params": n, "batch": batch, "seq_len": config.max_len,
                     "state_fp32": training_state_bytes(n, "adamw", "fp32")["total"],
                     "state_mixed": training_state_bytes(n, "adamw", "mixed")["total"],
                     "activations_fp32": fp32["total"], "activations_bf16": bf16["total"],
                     "note": note})
    return rows
