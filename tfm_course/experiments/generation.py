"""What generating one more token costs as the context grows, and how Mamba's two scans compare.

    rows = generation_profile(model, contexts=[64, 256, 1024])   # per context: bytes and s/token
    rows = scan_timings(lengths=[64, 256, 1024])                  # sequential vs parallel scan

A model with a KV cache (attention) carries a state that grows by a key and a value per token and
layer, and each new token reads all of it; a recurrent model (RetNet, Mamba, a linear-attention
Performer) carries a state of fixed size and does the same work at every step. These functions
measure both on whatever device the model lives on.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from ..efficient.mamba import selective_scan
from ..models.mixers import tensor_bytes
from .measure import synchronize, time_fn

__all__ = ["generation_profile", "scan_timings"]


@torch.no_grad()
def generation_profile(model: torch.nn.Module, contexts: Sequence[int], batch: int = 1,
                       repeats: int = 20, stat: str = "min", seed: int = 0,
                       timer: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Memory and time of generation steps after each context length in ``contexts``.

    ``model`` is a :class:`~tfm_course.models.mixer_lm.MixerLM` (any object with ``prefill(tokens
    (batch, L)) -> (logits, state)``, ``step(token (batch,), state) -> (logits, state)`` and an
    ``embed`` table), whose prefill runs the parallel forms of attention, RetNet and Mamba, or
    chapter 8's :class:`~tfm_course.models.gpt.GPT`, whose KV cache is filled by one parallel pass
    over the prompt. Random tokens; at each context n the row holds:

    * ``state_bytes`` — bytes of the tensors in the state after n tokens, per sequence;
    * ``s_per_token`` — seconds of one step, the fastest (``stat="min"``, steady on a busy
      machine) or the median of the ``repeats`` consecutive steps that follow (synchronised on a
      GPU). They are real generation steps: a KV cache grows by one token at each of them.

    ``timer`` reads the clock: wall-clock ``time.perf_counter`` by default (what a GPU needs);
    on a CPU shared with other jobs, ``time.process_time`` with one thread counts only this
    process's work, so it is less sensitive to other programs than the wall clock (not immune:
    they still evict its caches and slow its memory traffic).
    """
    contexts = sorted(set(contexts))
    if not contexts or contexts[0] < 1:
        raise ValueError(f"contexts must be positive token counts, got {list(contexts)}")
    if stat not in ("min", "median"):
        raise ValueError(f"stat must be 'min' or 'median', got {stat!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be positive, got {repeats}")
    device = next(model.parameters()).device
    vocab_size = model.config.vocab_size if hasattr(model, "config") else model.embed.num_embeddings
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab_size, (batch, contexts[-1] + repeats), generator=gen).to(device)
    was_training = model.training
    model.eval()
    rows = []

    def timed(step: Callable[[int], None], n: int) -> float:
        times = []
        for t in range(n, n + repeats):
            synchronize(device)
            start = timer()
            step(t)
            synchronize(device)
            times.append(timer() - start)
        return min(times) if stat == "min" else statistics.median(times)

    if hasattr(model, "stepper"):  # chapter 8's GPT: one parallel prefill into its KV cache
        for n in contexts:
            cache = model.stepper(use_cache=True)
            cache(tokens[:, :n])
            row = {"context": n, "state_bytes": cache.nbytes() // batch}
            row["s_per_token"] = timed(lambda t: cache(tokens[:, :t + 1]), n)
            rows.append(row)
        model.train(was_training)
        return rows
    for n in contexts:
        with torch.no_grad():  # prefill to exactly n tokens (the parallel forms where they exist)
            _, state = model.prefill(tokens[:, :n])
        branch = [state]  # step() never changes a state in place: the timed steps branch off it

        def step(t: int) -> None:
            _, branch[0] = model.step(tokens[:, t], branch[0])

        rows.append({"context": n, "state_bytes": tensor_bytes(state) // batch,
                     "s_per_token": timed(step, n)})
    model.train(was_training)
    return rows


def scan_timings(lengths: Sequence[int], batch: int = 2, d_inner: int = 128, d_state: int = 16,
                 repeats: int = 3, device: torch.device | str | None = None,
                 backward: bool = True, seed: int = 0) -> list[dict]:
    """Seconds of :func:`~tfm_course.efficient.mamba.selective_scan` in its two modes, per length.

    Inputs ``(batch, L, d_inner)`` with ``d_state`` states per channel, as inside a Mamba block.
    ``backward=True`` times forward + backward (a training step's scan), else the forward only.
    Each row: ``{"length", "sequential_s", "parallel_s"}`` (fastest of ``repeats``).
    """
    device = torch.device(device or "cpu")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        def leaf(*shape: int, positive: bool = False) -> torch.Tensor:
            t = torch.rand(*shape, generator=gen) if positive else torch.randn(*shape, generator=gen)
            return t.to(device).requires_grad_(backward)

        x, delta = leaf(batch, length, d_inner), leaf(batch, length, d_inner, positive=True)
        A = -torch.arange(1, d_state + 1, dtype=torch.float32, device=device).repeat(d_inner, 1)
        B, C = leaf(batch, length, d_state), leaf(batch, length, d_state)
        row = {"length": length}
        for mode in ("sequential", "parallel"):
            def run() -> None:
                y = selective_scan(x, delta * 0.1, A, B, C, mode=mode)
                if backward:
                    y.sum().backward()

            context = torch.enable_grad() if backward else torch.no_grad()
            with context:
                row[f"{mode}_s"] = time_fn(run, repeats=repeats, warmup=1, device=device, stat="min")
        rows.append(row)
    return rows
