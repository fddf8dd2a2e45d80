"""Tensor parallelism (Megatron-LM; Shoeybi et al., 2019): one layer's weight matrix split over N ranks.

A linear layer ``y = x Wᵀ + b`` with ``W`` ``(out, in)`` can be split two ways:

* **column parallel** (split the outputs, ``W``'s rows in PyTorch's layout): rank r computes
  ``y[..., r·out/N : (r+1)·out/N]`` from the whole ``x``; the full ``y`` is the concatenation.
* **row parallel** (split the inputs, ``W``'s columns): rank r multiplies its slice of ``x`` by
  its slice of ``W``; the full ``y`` is the *sum* of the N partial products (plus ``b``, once).

An MLP ``W2·act(W1·x)`` takes ``W1`` column parallel and ``W2`` row parallel: the activation is
elementwise, so each rank applies it to its own slice of the hidden layer and nothing is sent
between the two layers; one all-reduce sums the partial outputs. Backward mirrors it: one
all-reduce sums the gradients of the (replicated) input. Attention splits the same way, by heads.

What each kind of parallelism splits and sends (N ranks, P bytes of parameters, ring collectives:
an all-reduce sends 2·(N−1)/N of the buffer per rank, an all-gather or reduce-scatter (N−1)/N):

* **data parallel** (DDP) splits the batch; every rank holds all the weights and their state.
  Sends: an all-reduce of the gradients, 2·(N−1)/N·P per step.
* **ZeRO-1** also splits the optimiser state. Sends: a reduce-scatter of the gradients and an
  all-gather of the updated weights, the bytes of one all-reduce.
* **FSDP** (ZeRO-3) also splits the weights and gradients. Sends: an all-gather of each layer's
  weights in forward and again in backward, a reduce-scatter of its gradients: 3·(N−1)/N·P.
* **tensor parallel** splits each layer's matrices. Sends: one all-reduce of the activations
  ``(B, T, d)`` per MLP and per attention block in forward, one in backward.
* **pipeline parallel** splits the layers into p stages. Sends: activations between stages; the
  stages idle for a "bubble" of (p−1)/(m+p−1) of the time with m micro-batches.

``split_linear`` and the ``*_forward`` functions simulate the split in one process;
``ColumnParallelLinear`` / ``RowParallelLinear`` are the real thing, one shard per rank.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import FeedForward

__all__ = ["split_linear", "column_parallel_forward", "row_parallel_forward", "mlp_parallel_forward",
           "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_mlp"]


# --------------------------------------------------------------------------- in one process
def _check_split(linear: nn.Module, world: Any, dim: Any) -> None:
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"expected an nn.Linear, got {type(linear).__name__}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be an integer >= 1, got {world!r}")
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 (split outputs: column parallel) or 1 (split inputs: row "
                         f"parallel), got {dim!r}")
    size = linear.weight.shape[dim]
    if size % world:
        raise ValueError(f"{('out', 'in')[dim]}_features {size} must be divisible by world "
                         f"{world}, got remainder {size % world}")


def split_linear(linear: nn.Linear, world: int, dim: int) -> list[nn.Linear]:
    """``world`` smaller copies of ``linear`` (weight ``(out, in)``).

    ``dim=0`` (column parallel): shard r is ``(in -> out/world)``, rows of the weight and the
    matching slice of the bias. ``dim=1`` (row parallel): shard r is ``(in/world -> out)``,
    columns of the weight; only shard 0 keeps the bias, so that the sum adds it once.
    """
    _check_split(linear, world, dim)
    shards = []
    for r, w in enumerate(linear.weight.detach().chunk(world, dim=dim)):
        has_bias = linear.bias is not None and (dim == 0 or r == 0)
        shard = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            shard.weight.copy_(w)
            if has_bias:
                shard.bias.copy_(linear.bias.chunk(world)[r] if dim == 0 else linear.bias)
        shards.append(shard)
    return shards


def _check_input(x: Tensor, expected: int) -> None:
    if x.shape[-1] != expected:
        raise ValueError(f"expected input (..., {expected}), got {tuple(x.shape)}")


def column_parallel_forward(shards: list[nn.Linear], x: Tensor) -> Tensor:
    """``(..., in) -> (..., out)``: every shard reads all of ``x``; concatenate their outputs."""
    _check_input(x, shards[0].in_features)
    return torch.cat([shard(x) for shard in shards], dim=-1)


def row_parallel_forward(shards: list[nn.Linear], x: Tensor) -> Tensor:
    """``(..., in) -> (..., out)``: shard r reads slice r of ``x``'s features; sum the partial
    products."""
    _check_input(x, sum(s.in_features for s in shards))
    return sum(shard(part) for shard, part in zip(shards, x.chunk(len(shards), dim=-1)))


def mlp_parallel_forward(first: list[nn.Linear], second: list[nn.Linear], x: Tensor,
                         activation: Callable[[Tensor], Tensor] = F.gelu) -> Tensor:
    """``(..., d) -> (..., d)``: ``second(act(first(x)))`` with ``first`` split by columns and
    ``second`` by rows: each "rank" goes all the way on its own slice; one sum at the end."""
    if len(first) != len(second):
        raise ValueError(f"expected as many row shards as column shards ({len(first)}), "
                         f"got {len(second)}")
    _check_input(x, first[0].in_features)
    return sum(b(activation(a(x))) for a, b in zip(first, second))


# --------------------------------------------------------------------------- across processes
def _all_reduce(t: Tensor) -> Tensor:
    t = t.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class _CopyToShards(torch.autograd.Function):
    """Megatron's ``f``: identity forward; backward sums the input's gradient over the ranks
    (each rank's shard saw the whole input and contributes part of its gradient)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _all_reduce(grad)


class _SumOverShards(torch.autograd.Function):
    """Megatron's ``g``: forward sums the partial outputs over the ranks (all-reduce); the sum is
    replicated, so backward hands each rank the gradient unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return _all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


class ColumnParallelLinear(nn.Module):
    """This rank's output slice of ``linear``: ``(..., in) -> (..., out/world)``, input replicated."""

    def __init__(self, linear: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        self.shard = split_linear(linear, world, dim=0)[rank]

    def forward(self, x: Tensor) -> Tensor:
        return self.shard(_CopyToShards.apply(x))


class RowParallelLinear(nn.Module):
    """This rank's input slice of ``linear``: ``(..., in/world) -> (..., out)``, summed over the
    ranks by one all-reduce; the bias is added once, after the sum."""

    def __init__(self, linear: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        self.shard = split_linear(linear, world, dim=1)[rank]
        self.shard.bias = None  # not inside the sum: every rank adds its copy after it
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        out = _SumOverShards.apply(self.shard(x))
        return out if self.bias is None else out + self.bias


class ParallelMLP(nn.Module):
    """A ``FeedForward`` (``linear2(gelu(linear1(x)))``) split over the ranks:
    ``(..., d) -> (..., d)``."""

    def __init__(self, mlp: FeedForward, rank: int, world: int) -> None:
        super().__init__()
        self.linear1 = ColumnParallelLinear(mlp.linear1, rank, world)
        self.linear2 = RowParallelLinear(mlp.linear2, rank, world)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.gelu(self.linear1(x)))


def check_mlp(rank: int, world: int, device: torch.device, d_model: int, batch: int, seq_len: int,
              seed: int = 0) -> dict[str, Any]:
    """Run one ``FeedForward(d_model, 4·d_model)`` whole and tensor-parallel, forward and backward,
    on every rank of the current process group; max differences over all ranks."""
    torch.manual_seed(seed)
    mlp = FeedForward(d_model, 4 * d_model, activation="gelu").to(device)
    x = torch.randn(batch, seq_len, d_model, device=device, requires_grad=True)
    weight = torch.randn(batch, seq_len, d_model, device=device)  # loss = Σ weight · y
    (mlp(x) * weight).sum().backward()
    parallel = ParallelMLP(mlp, rank, world)
    x_tp = x.detach().clone().requires_grad_()
    y_tp = parallel(x_tp)
    (y_tp * weight).sum().backward()
    full_grad = mlp.linear1.weight.grad.chunk(world, dim=0)[rank]
    diffs = torch.tensor([(y_tp - mlp(x)).abs().max().item(),
                          (x_tp.grad - x.grad).abs().max().item(),
                          (parallel.linear1.shard.weight.grad - full_grad).abs().max().item()],
                         device=device)
    if dist.is_initialized():
        dist.all_reduce(diffs, op=dist.ReduceOp.MAX)
    activation_bytes = batch * seq_len * d_model * x.element_size()
    return {"max_abs_diff_output": diffs[0].item(), "max_abs_diff_input_grad": diffs[1].item(),
            "max_abs_diff_weight_grad": diffs[2].item(),
            "weight_bytes_per_rank": sum(p.numel() * p.element_size() for p in parallel.parameters()),
            "all_reduce_bytes_forward": activation_bytes, "all_reduce_bytes_backward": activation_bytes}
