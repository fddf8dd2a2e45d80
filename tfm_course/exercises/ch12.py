"""Checkers for chapter 12, "Training in practice".

>>> from tfm_course.exercises import ch12
>>> ch12.check_accumulation(my_accumulate)          # fn(model, micro_batches) -> None (fills .grad)
>>> ch12.check_state_bytes(my_state_bytes)          # fn(model, optimizer_name) -> bytes
>>> ch12.check_checkpointed_block(my_checkpointed)  # fn(block, x) -> block(x), checkpointed

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..experiments.memory import saved_activation_bytes
from ..models.gpt import GPT, Block, GPTConfig
from ._checking import Failed, attempt, close, max_error, run_checks

__all__ = ["check_accumulation", "check_state_bytes", "check_checkpointed_block"]

IGNORE_INDEX = -100


def _gpt(seed: int = 0, vocab: int = 29, layers: int = 2) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, max_len=12, d_model=16, n_layers=layers, n_heads=2)).double()


def _grads(model: nn.Module) -> Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in model.parameters()])


# --------------------------------------------------------------------------- accumulation
def _ragged(lengths: list[int], seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 29, (len(lengths), 12), generator=g)
    targets = torch.randint(0, 29, (len(lengths), 12), generator=g)
    for row, n in enumerate(lengths):
        targets[row, n:] = IGNORE_INDEX
    return ids, targets


def _sum_loss(model: GPT, ids: Tensor, targets: Tensor) -> Tensor:
    logits = model(ids)[0]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def _variant(model: GPT, micro: list[tuple[Tensor, Tensor]], how: str) -> Tensor:
    """The gradients of one way of accumulating: "right", or one of the typical mistakes."""
    model.zero_grad()
    total = sum(int((t != IGNORE_INDEX).sum()) for _, t in micro)
    with_padding = sum(t.numel() for _, t in micro)
    for ids, targets in micro:
        n = max(int((targets != IGNORE_INDEX).sum()), 1)
        scale = {"right": total, "mean of means": n * len(micro), "sum": 1, "mean only": n,
                 "padding counted": with_padding}[how]
        (_sum_loss(model, ids, targets) / scale).backward()
    return _grads(model)


def check_accumulation(fn: Callable[[nn.Module, list[tuple[Tensor, Tensor]]], Any]) -> bool:
    """``fn(model, micro_batches)``: backward through every ``(ids, targets)`` micro-batch so that
    ``model``'s ``.grad`` ends up equal to the gradient of the whole batch's mean loss over its
    target tokens (targets equal to -100 are padding and do not count). Do not zero the gradients
    or step an optimiser inside ``fn``; ``model(ids)`` returns ``(logits, None)``."""

    def case(lengths: list[int], size: int, seed: int) -> Callable[[], None]:
        def check() -> None:
            model = _gpt(seed)
            ids, targets = _ragged(lengths, seed)
            micro = list(zip(ids.split(size), targets.split(size)))
            want = _variant(model, micro, "right")
            wrong = {how: _variant(model, micro, how) for how in ("mean of means", "sum", "mean only",
                                                                    "padding counted")}
            model.zero_grad()
            attempt(fn, model, [(i.clone(), t.clone()) for i, t in micro])
            got = _grads(model)
            if not got.abs().sum() > 0:
                raise Failed("the gradients are all zero: call .backward() on each micro-batch's loss")
            if close(got, want, atol=1e-9, rtol=1e-7):
                return
            messages = {
                "mean of means": "you averaged the micro-batches' mean losses (loss / k): a token of a "
                                 "short micro-batch then weighs more than a token of a long one. Divide "
                                 "each micro-batch's *sum* of token losses by the number of targets in "
                                 "*all* micro-batches, counted before the first backward",
                "sum": "the gradients are summed, not averaged: divide the summed token losses by the "
                       "total number of targets",
                "mean only": "each micro-batch is divided by its own token count only: the gradients "
                             "add up k means; divide by the total count over all micro-batches",
                "padding counted": "the count includes padding: count only targets != -100",
            }
            for how, grads in wrong.items():
                if close(got, grads, atol=1e-9, rtol=1e-7):
                    raise Failed(messages[how])
            raise Failed(f"the gradients differ from the whole batch's by up to {max_error(got, want):.3g}")
        return check

    return run_checks("token-normalised accumulation", [
        (f"lengths {lengths} in micro-batches of {size}", case(lengths, size, seed))
        for lengths, size, seed in (([12, 11, 3, 2, 9, 1], 2, 0), ([12, 4, 7, 12], 1, 1),
                                    ([5, 12, 2], 3, 2))])


# --------------------------------------------------------------------------- state bytes
_STATES = {"adamw": 2, "sgd": 0, "sgd_momentum": 1}


def check_state_bytes(fn: Callable[[nn.Module, str], int]) -> bool:
    """``fn(model, optimizer)``: the bytes of the fp32 training state — parameters, gradients and
    the optimiser's states (``"adamw"``: two per parameter, ``"sgd_momentum"``: one, ``"sgd"``:
    none) — for ``model`` (a tied weight is one tensor, counted once)."""

    def case(optimizer: str, layers: int) -> Callable[[], None]:
        def check() -> None:
            model = _gpt(0, vocab=31, layers=layers).float()
            n = sum(p.numel() for p in model.parameters())
            want = 4 * n * (2 + _STATES[optimizer])
            got = attempt(fn, model, optimizer)
            if isinstance(got, Tensor):
                got = got.item()
            if not isinstance(got, (int, float)):
                raise Failed(f"return a number of bytes, got {type(got).__name__}")
            if got == want:
                return
            tied = model.tok_embed.weight.numel()
            mistakes = [
                (4 * (n + tied) * (2 + _STATES[optimizer]), "you counted the tied embedding twice: "
                 "model.parameters() yields a shared tensor once (state_dict() lists it twice)"),
                (4 * n * (1 + _STATES[optimizer]), "you left out the gradients (one fp32 number per "
                 "parameter, filled by backward)" + (", or counted only one of AdamW's two states (the "
                 "running means of the gradient and of its square)" if optimizer == "adamw" else "")),
                (4 * n * 2, f"you left out the optimiser's states: {optimizer} keeps "
                 f"{_STATES[optimizer]} per parameter"),
                (32 * n * (2 + _STATES[optimizer]), "that is bits, not bytes: an fp32 number is 4 bytes"),
                (n * (2 + _STATES[optimizer]), "you counted numbers, not bytes: multiply by 4 (fp32)"),
                (4 * n, "that is the parameters alone"),
            ]
            for value, message in mistakes:
                if got == value:
                    raise Failed(message)
            raise Failed(f"got {got:,} bytes, expected {want:,} for {n:,} parameters with {optimizer}")
        return check

    return run_checks("training-state bytes", [(f"{opt}, {layers} layers", case(opt, layers))
                                               for opt, layers in (("adamw", 2), ("sgd", 1),
                                                                   ("sgd_momentum", 3))])


# --------------------------------------------------------------------------- checkpointing
def check_checkpointed_block(fn: Callable[[nn.Module, Tensor], Tensor]) -> bool:
    """``fn(block, x)``: chapter 8's GPT ``block`` applied to ``x (B, T, d)``, checkpointed: the
    same output and gradients as ``block(x)``, but the block's internal activations are not kept
    for backward (use ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``)."""

    def check() -> None:
        torch.manual_seed(0)
        block = Block(GPTConfig(vocab_size=8, max_len=16, d_model=32, n_layers=2, n_heads=4)).double()
        x = torch.randn(3, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        params = list(block.parameters())
        plain_x = x.clone().requires_grad_()
        plain = saved_activation_bytes(lambda: block(plain_x))  # parameters are not counted
        plain_saved, want = plain.total, plain.output
        want.square().sum().backward()
        want_grads = [plain_x.grad] + [p.grad.clone() for p in params]
        block.zero_grad()
        their_x = x.clone().requires_grad_()
        theirs = saved_activation_bytes(lambda: attempt(fn, block, their_x))
        saved, got = theirs.total, theirs.output
        if not isinstance(got, Tensor) or got.shape != want.shape:
            raise Failed(f"return the block's output, a tensor of shape {tuple(want.shape)}")
        if not close(got, want, atol=1e-10, rtol=1e-8):
            raise Failed(f"the output differs from block(x) by up to {max_error(got, want):.3g}")
        if not got.requires_grad:
            raise Failed("the output has no gradient: did you run the block under torch.no_grad()? "
                         "checkpoint() discards the activations itself and recomputes them in backward")
        got.square().sum().backward()
        if their_x.grad is None:
            raise Failed("no gradient reached x: do not detach the input")
        grads = [their_x.grad] + [p.grad for p in params]
        if any(g is None or not close(g, w, atol=1e-10, rtol=1e-8) for g, w in zip(grads, want_grads)):
            raise Failed("the gradients differ from those of block(x)")
        if saved > plain_saved / 2:
            raise Failed(f"the graph still saves {saved:,} bytes for backward against {plain_saved:,} "
                         "without checkpointing: wrap the block's call in "
                         "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")

    return run_checks("checkpointed block", [("output, gradients and saved activations", check)])
