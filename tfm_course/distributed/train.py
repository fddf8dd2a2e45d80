"""One training script for 1 … N processes: DDP, ZeRO-1 and FSDP on the course's GPT (chapter 12).

    torchrun --nproc-per-node 2 -m tfm_course.distributed --mode ddp,zero,fsdp --out run.json
    python -m tfm_course.distributed --mode ddp --out run.json     # one process, no torchrun

torchrun starts N copies of this script and tells each its ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and where to meet (``MASTER_ADDR``, ``MASTER_PORT``; across machines add its
``--nnodes`` and ``--rdzv-*`` flags, the script does not change). Every rank builds the same GPT
from the same seed and reads the same *global* batch of step s, ``(global_batch, seq_len)``; rank r
trains on its contiguous ``global_batch / N`` rows, cut into ``--accumulate`` micro-batches.

* ``ddp``: every rank holds the whole model, its gradients and AdamW's two moments; backward
  all-reduces (averages) the gradients in buckets while it runs, so all ranks take the same step.
* ``zero``: DDP plus ``ZeroRedundancyOptimizer`` (ZeRO stage 1): each rank keeps the AdamW state
  of ~1/N of the parameters, updates those and broadcasts them to the others.
* ``fsdp``: FSDP2's ``fully_shard`` on every block, then on the whole model (ZeRO stage 3): each
  rank stores ~1/N of every parameter, gradient and moment (DTensors); a block's weights are
  all-gathered just before its forward and again before its backward, its gradients
  reduce-scattered.
* ``tp``: no training; the tensor-parallel MLP check of :mod:`tfm_course.distributed.tensor_parallel`.

Rank 0 also trains a plain copy of the model, alone, on each whole global batch: the reference.
Averaging N equal-sized slices' mean gradients *is* the gradient of the whole batch's mean loss,
so every mode must end with the reference's weights, up to rounding: the sums are taken in another
order (per slice, then across ranks), ~1e-7 relative per float32 operation. AdamW divides each
gradient by its own size, so a small gradient's rounding error becomes part of a full-size step:
after 5 steps the weights differ by ~2e-6 (``max_abs_diff``; ~5e-5 of a tensor's largest weight,
``max_rel_diff``), while training moved them by ~1.5e-2 (``max_weight_change``). With
``--dtype float64`` the differences shrink ~1e9-fold, the ratio of the two formats' precisions:
rounding, not a bug. Biases are off unless ``--bias``: the key bias's gradient is zero in exact
arithmetic (softmax ignores a shift shared by all keys), so in floats it is rounding noise (~1e-11)
that AdamW scales into steps of lr·g/ε, different noise for each summation order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ..models.gpt import GPT, GPTConfig
from ..train import weight_decay_groups
from .tensor_parallel import check_mlp

MODES = ("ddp", "zero", "fsdp", "tp")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Context:
    """Who this process is: ``rank`` of ``world``, its device and the collective backend."""

    rank: int
    world: int
    device: torch.device
    backend: str


def choose_device(local_rank: int = 0, local_ranks: int = 1) -> tuple[str, torch.device]:
    """``("nccl", cuda:local_rank)`` where there is a GPU for every one of the ``local_ranks``
    processes on this machine, else ``("gloo", cpu)`` (e.g. two processes on Colab's one GPU)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def setup() -> Context:
    """Join the group torchrun describes in the environment, or, started without torchrun, make a
    one-process group on an in-memory store (no port, no network), on the backend and device of
    :func:`choose_device`."""
    backend, device = choose_device(int(os.environ.get("LOCAL_RANK", 0)),
                                    int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, device_id=device if cuda else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Context(dist.get_rank(), dist.get_world_size(), device, backend)


# --------------------------------------------------------------------------- data and model
def global_batch(step: int, args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    """Step ``step``'s whole batch, ``ids`` and ``targets`` ``(global_batch, seq_len)``, the same
    on every rank and for every world size: rows of arithmetic sequences ``a + b·t (mod vocab)``,
    learnable from the context, drawn from a generator seeded by ``(seed, step)``."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    start = torch.randint(0, args.vocab, (args.global_batch, 1), generator=g)
    stride = torch.randint(1, args.vocab, (args.global_batch, 1), generator=g)
    tokens = (start + stride * torch.arange(args.seq_len + 1)) % args.vocab
    return tokens[:, :-1], tokens[:, 1:]


def micro_batches(ids: Tensor, targets: Tensor, ctx: Context, k: int) -> list[tuple[Tensor, Tensor]]:
    """Rank r's contiguous rows ``r·B/N … (r+1)·B/N`` of the global batch, as ``k`` micro-batches
    ``(B/(N·k), T)``, on this rank's device."""
    rows = ids.shape[0] // ctx.world
    mine = slice(ctx.rank * rows, (ctx.rank + 1) * rows)
    pairs = zip(ids[mine].chunk(k), targets[mine].chunk(k))
    return [(i.to(ctx.device), t.to(ctx.device)) for i, t in pairs]


def build_model(args: argparse.Namespace, device: torch.device) -> GPT:
    """The same GPT on every rank and for the reference: the initialisation depends on the seed only."""
    torch.manual_seed(args.seed)
    config = GPTConfig(vocab_size=args.vocab, max_len=args.seq_len, d_model=args.d_model,
                       n_layers=args.layers, n_heads=args.heads, bias=args.bias)
    return GPT(config).to(device, DTYPES[args.dtype])


def adamw(model: nn.Module, args: argparse.Namespace, zero: bool = False) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices only (:func:`tfm_course.train.weight_decay_groups`).
    ``zero``: sharded by ZeroRedundancyOptimizer, which builds one AdamW per rank on its share."""
    groups = weight_decay_groups(model, args.weight_decay)
    if zero:
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=args.lr)
    return torch.optim.AdamW(groups, lr=args.lr)


def wrap(mode: str, model: GPT, ctx: Context, args: argparse.Namespace
         ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model as ``mode`` trains it, and its optimiser."""
    if mode == "fsdp":
        for block in model.blocks:
            fully_shard(block)  # one all-gather / reduce-scatter unit per block ...
        fully_shard(model)      # ... and one for the rest: embeddings (tied output layer), final norm
        return model, adamw(model, args)
    ddp = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True)
    return ddp, adamw(ddp, args, zero=mode == "zero")


def sync_gradients(model: nn.Module, on: bool):
    """A context in which backward does (``on``) or does not communicate gradients: DDP's
    ``no_sync()`` keeps them in ``.grad`` to be added to by the next micro-batch."""
    if isinstance(model, DDP):
        return nullcontext() if on else model.no_sync()
    model.set_requires_gradient_sync(on)  # FSDP2
    return nullcontext()


# --------------------------------------------------------------------------- measurements
def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(tensors: Any) -> int:
    """Bytes of the tensors this rank actually stores (a DTensor: its local shard)."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def memory(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's training state in bytes: parameters, gradients, optimiser state (ZeRO: the
    local optimiser of its partition)."""
    params = list(model.parameters())
    local_optimizer = getattr(optimizer, "optim", optimizer)
    states = [v for s in local_optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {"params": nbytes(params), "grads": nbytes(p.grad for p in params if p.grad is not None),
           "optimizer": nbytes(states)}
    return {**out, "total": sum(out.values())}


def ring_bytes(mode: str, param_bytes: int, world: int, k: int) -> int:
    """Bytes each rank sends per step with ring collectives (textbook estimates): an all-reduce
    sends 2·(N−1)/N of the buffer, an all-gather or a reduce-scatter (N−1)/N. PyTorch's ZeRO keeps
    DDP's all-reduce and adds a broadcast of the updated weights; the paper's ZeRO-1 (reduce-scatter,
    then all-gather) would send what DDP sends."""
    share = (world - 1) / world * param_bytes
    if mode == "ddp":
        return round(2 * share)              # all-reduce of the gradients
    if mode == "zero":
        return round(3 * share)              # all-reduce, then each owner broadcasts its params
    return round((2 * k + 1) * share)        # fsdp: all-gather fwd + bwd per micro-batch, reduce-scatter


def time_all_reduce(numel: int, ctx: Context, warmup: int = 2, repeats: int = 7) -> dict[str, float]:
    """Median time of ``dist.all_reduce`` on a flat fp32 buffer of ``numel`` values."""
    buffer = torch.zeros(numel, device=ctx.device)
    times = []
    for _ in range(warmup + repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[warmup:])
    ring = 2 * (ctx.world - 1) / ctx.world * buffer.numel() * 4
    return {"numel": numel, "bytes": numel * 4, "ring_bytes_per_rank": round(ring),
            "seconds": seconds, "bus_gb_per_s": ring / seconds / 1e9}


def full_weights(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter whole, on the CPU, by its plain GPT name (FSDP: all-gathered, a
    collective every rank must join)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
        out[name.removeprefix("module.")] = t.cpu()
    return out


def compare(weights: dict[str, Tensor], reference: dict[str, Tensor]) -> dict[str, float]:
    """Max |w − w_ref| over all weights, and the largest per-tensor ratio
    max|w − w_ref| / max|w_ref|."""
    diffs = {n: (weights[n] - reference[n]).abs().max().item() for n in reference}
    rel = max(diffs[n] / reference[n].abs().max().clamp_min(1e-30).item() for n in reference)
    return {"max_abs_diff": max(diffs.values()), "max_rel_diff": rel}


# --------------------------------------------------------------------------- training
def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, ctx: Context,
               args: argparse.Namespace) -> Tensor:
    """One optimiser step on this rank's share of the step's global batch; returns its local
    mean loss."""
    optimizer.zero_grad(set_to_none=True)
    micro = micro_batches(*global_batch(step, args), ctx, args.accumulate)
    total = torch.zeros((), device=ctx.device, dtype=DTYPES[args.dtype])
    for i, (ids, targets) in enumerate(micro):
        with sync_gradients(model, on=i == len(micro) - 1):  # communicate on the last one only
            _, loss = model(ids, targets)
            (loss / len(micro)).backward()
        total += loss.detach() / len(micro)
    optimizer.step()
    return total


def train_reference(args: argparse.Namespace, device: torch.device
                    ) -> tuple[dict[str, Tensor], list[float]]:
    """One process, one model, the whole global batch per step: the weights every mode must reach."""
    model = build_model(args, device)
    optimizer = adamw(model, args)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        ids, targets = global_batch(step, args)
        _, loss = model(ids.to(device), targets.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return full_weights(model), losses


def train_mode(mode: str, ctx: Context, args: argparse.Namespace,
               reference: tuple[dict[str, Tensor], list[float]] | None) -> dict[str, Any]:
    """Train a fresh model with ``mode``; rank 0 gets the record, the other ranks ``{}``."""
    model = build_model(args, ctx.device)
    initial = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    model, optimizer = wrap(mode, model, ctx, args)
    losses, times = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        losses.append(train_step(model, optimizer, step, ctx, args))
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        times.append(time.perf_counter() - start)
    local_losses = torch.stack(losses)
    dist.all_reduce(local_losses)  # one collective for every step's loss: the global mean
    global_losses = (local_losses / ctx.world).tolist()
    mem = memory(model, optimizer)
    mems: list[Any] = [None] * ctx.world
    dist.all_gather_object(mems, mem)
    weights = full_weights(model)
    if ctx.rank != 0:
        return {}
    ref_weights, ref_losses = reference
    moved = max((ref_weights[n] - w).abs().max().item() for n, w in initial.items())
    record = {"mode": mode, "world_size": ctx.world, "backend": ctx.backend, "steps": args.steps,
              "accumulate": args.accumulate, "losses": global_losses, "reference_losses": ref_losses,
              "max_loss_diff": max(abs(a - b) for a, b in zip(global_losses, ref_losses)),
              **compare(weights, ref_weights),
              "max_weight_change": moved, "memory_bytes": mems,
              "ring_bytes_per_step": ring_bytes(mode, nbytes(initial.values()), ctx.world,
                                                args.accumulate),
              "step_time_s": statistics.median(times[1:] or times)}
    if isinstance(model, DDP):
        record["buckets"] = len(model.reducer._get_zeros_like_grad_buckets())
    return record


def run(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    """Every requested mode, one after another in the same processes; the record on rank 0."""
    start = time.perf_counter()
    numel = sum(p.numel() for p in build_model(args, torch.device("cpu")).parameters())
    train_modes = [m for m in args.mode if m != "tp"]
    reference = train_reference(args, ctx.device) if ctx.rank == 0 and train_modes else None
    result: dict[str, Any] = {"world_size": ctx.world, "backend": ctx.backend, "device": str(ctx.device),
                              "args": {k: v for k, v in vars(args).items() if k != "out"},
                              "n_params": numel, "all_reduce": time_all_reduce(numel, ctx), "modes": {}}
    for mode in args.mode:
        if mode == "tp":
            record = check_mlp(ctx.rank, ctx.world, ctx.device, args.d_model, args.global_batch,
                               args.seq_len, args.seed)
            record.update(mode="tp", world_size=ctx.world, backend=ctx.backend)
        else:
            record = train_mode(mode, ctx, args, reference)
        result["modes"][mode] = record
    result["seconds"] = time.perf_counter() - start
    return result


# --------------------------------------------------------------------------- command line
def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tfm_course.distributed",
                                description=__doc__.split("\n")[0])
    p.add_argument("--mode", action="append", help=f"one of {', '.join(MODES)}; repeat it or give a "
                   "comma list to run several, one after another (default: ddp)")
    p.add_argument("--steps", type=_positive, default=5)
    p.add_argument("--global-batch", type=_positive, default=8, help="rows per step, all ranks together")
    p.add_argument("--seq-len", type=_positive, default=16)
    p.add_argument("--accumulate", type=_positive, default=1, help="micro-batches per step and rank")
    p.add_argument("--d-model", type=_positive, default=32)
    p.add_argument("--layers", type=_positive, default=2)
    p.add_argument("--heads", type=_positive, default=4)
    p.add_argument("--vocab", type=_positive, default=64)
    p.add_argument("--bias", action="store_true", help="biases in the linear layers and norms")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="float64 shrinks the differences to the reference by ~1e9: rounding")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size")
    p.add_argument("--out", type=Path, help="JSON file rank 0 writes")
    args = p.parse_args(argv)
    args.mode = [m.strip() for item in (args.mode or ["ddp"]) for m in item.split(",") if m.strip()]
    for m in args.mode:
        if m not in MODES:
            p.error(f"--mode: expected one of {', '.join(MODES)}, got {m!r}")
    if len(set(args.mode)) != len(args.mode):
        p.error(f"--mode: each mode at most once, got {args.mode}")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.global_batch % (world * args.accumulate):
        p.error(f"--global-batch: expected a multiple of world size × accumulate = "
                f"{world} × {args.accumulate}, got {args.global_batch}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = setup()
    try:
        result = run(args, ctx)
        if ctx.rank == 0:
            if args.out is not None:
                args.out.write_text(json.dumps(result, indent=1))
            for mode, r in result["modes"].items():
                what, key = ("y", "max_abs_diff_output") if mode == "tp" else ("w", "max_abs_diff")
                print(f"{mode:>4}: {ctx.world} processes, max |{what} - {what}_one_process| {r[key]:.2e}")
    finally:
        dist.destroy_process_group()
    return 0
