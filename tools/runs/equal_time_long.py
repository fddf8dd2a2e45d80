"""Stored run for chapter 10's equal-time comparison, at a length above the CPU crossovers.

    python tools/runs/equal_time_long.py                            # n = 1024 on the CPU, two workers
    python tools/runs/equal_time_long.py --smoke --out-dir /tmp/x   # seconds: what the tests run

The page's quality comparison gives every attention the same number of steps at n = 256, below
the lengths where the approximations are faster. This run asks the other question: at n = 1024,
where they are, what does each attention reach in the *time* softmax attention takes for its
budget of steps? The tool first measures one training step of every attention
(:func:`tfm_course.experiments.equal_time.train_for`'s ``step_ms``: the fastest of five steps,
CPU time on one thread, measured one attention at a time before any training starts), then gives
each ``round(softmax_steps * softmax_ms / its_ms)`` steps, so the budgets are equal in measured
time and fixed in steps from then on. Seed 0 tries every learning rate of the grid, and where the
best is at an end of the grid, halves or doubles beyond it (at most twice) until it is inside;
seed 1 trains at seed 0's best rate (choosing on the reported held-out set favours that rate a
little; seed 1 is a fresh draw).

Writes ``tfm_course/results/equal_time_long_cpu.json``: the measured step times and the step
budgets they gave, every run's accuracy, steps, ms per step and CPU seconds, the chosen rates,
and, as curves, held-out accuracy against the learning rate (seed 0) for each attention.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import shlex
import sys
import time
from pathlib import Path

import torch

from tfm_course.experiments import stored_runs
from tfm_course.experiments.equal_time import rate_beyond, train_for

ATTENTIONS = ("softmax", "window", "linformer", "performer")
MAX_EXTENSIONS = 2  # grid extensions beyond a winning end, per attention
SETTINGS = dict(length=1024, softmax_steps=200, lrs=[3e-3, 6e-3, 1.2e-2], seeds=[0, 1], batch_size=16)
SMOKE = dict(length=48, softmax_steps=3, lrs=[3e-3, 1.2e-2], seeds=[0, 1], batch_size=4,
             task=dict(num_records=4, num_queries=8, num_keys=8, num_values=4),
             model=dict(d_model=16, num_heads=2, k=8), test_size=16)


def _options(settings: dict) -> dict:
    options = dict(length=settings["length"], batch_size=settings["batch_size"], device="cpu")
    if "task" in settings:
        options.update(task=settings["task"], test_size=settings["test_size"], **settings["model"])
    return options


def run_one(kind: str, steps: int, lr: float, seed: int, settings: dict) -> dict:
    """One training run (one CPU thread); its numbers, without the model."""
    torch.set_num_threads(1)
    cpu = time.process_time()
    result = train_for(kind, steps=steps, lr=lr, seed=seed, **_options(settings)).as_dict()
    return {**result, "cpu_seconds": time.process_time() - cpu}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model and budget, to check the tool")
    parser.add_argument("--workers", type=int, default=2, help="processes (0: in this process)")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = dict(SMOKE if args.smoke else SETTINGS)
    name = "equal_time_long_cpu" + ("_smoke" if args.smoke else "")
    command = shlex.join(["python", "tools/runs/equal_time_long.py", *(argv if argv is not None else sys.argv[1:])])
    run = stored_runs.new_run(name, command, settings["seeds"], "cpu", attentions=list(ATTENTIONS),
                              **{k: v for k, v in settings.items() if k != "seeds"})
    # 1. the clock: one attention at a time, nothing else running in this tool
    step_ms = {kind: train_for(kind, steps=1, lr=settings["lrs"][0], **_options(settings)).step_ms
               for kind in ATTENTIONS}
    steps = {kind: max(1, round(settings["softmax_steps"] * step_ms["softmax"] / step_ms[kind]))
             for kind in ATTENTIONS}
    run["settings"].update(measured_step_ms=step_ms, equal_time_steps=steps)
    print("measured ms per step:", {k: round(v, 1) for k, v in step_ms.items()}, "-> steps:", steps, flush=True)
    # 2. the grid on seed 0, then seed 1 at the best rate
    seed0, rest = settings["seeds"][0], settings["seeds"][1:]
    assert seed0 == 0, "the rate is chosen on seed 0"
    jobs = [(kind, steps[kind], lr, seed0, settings) for kind in ATTENTIONS for lr in settings["lrs"]]
    results = _run_all(jobs, args.workers)
    for _ in range(MAX_EXTENSIONS):  # a best rate at an end of the tried range: try one beyond it
        beyond = {kind: _beyond(results, kind) for kind in ATTENTIONS}
        extra = [(kind, steps[kind], lr, seed0, settings) for kind, lr in beyond.items() if lr is not None]
        if not extra:
            break
        results += _run_all(extra, args.workers)
    best = {kind: _best(results, kind) for kind in ATTENTIONS}
    results += _run_all([(kind, steps[kind], best[kind], seed, settings) for kind in ATTENTIONS
                         for seed in rest], args.workers)
    run["results"], run["best_lr"] = results, best
    run["steps"] = steps
    run["tokens_seen"] = {kind: steps[kind] * settings["batch_size"] * settings["length"] for kind in ATTENTIONS}
    for kind in ATTENTIONS:
        run["curves"][kind] = sorted([r["lr"], r["accuracy"]] for r in results
                                     if r["attention"] == kind and r["seed"] == seed0)
    run["child_cpu_seconds"] = sum(r["cpu_seconds"] for r in results)
    out = args.out_dir or stored_runs.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = stored_runs.write_run(run, out)
    print(f"wrote {path}: best rates {best}")
    return path


def _best(results: list[dict], kind: str) -> float:
    """Seed 0's best rate for ``kind`` (the smaller rate on a tie)."""
    mine = [r for r in results if r["attention"] == kind and r["seed"] == 0]
    return max(mine, key=lambda r: (r["accuracy"], -r["lr"]))["lr"]


def _beyond(results: list[dict], kind: str) -> float | None:
    """The next rate to try for ``kind``: half the smallest or twice the largest tried, when the
    best is there; None when the best is inside the tried range."""
    return rate_beyond([r["lr"] for r in results if r["attention"] == kind and r["seed"] == 0], _best(results, kind))


def _run_all(jobs: list[tuple], workers: int) -> list[dict]:
    if not workers:
        return [run_one(*job) for job in jobs]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
        results = list(pool.map(run_one, *zip(*jobs)))
    for r in results:
        print(f"{r['attention']:>9} lr {r['lr']:g} seed {r['seed']}: {r['accuracy']:.3f} after {r['steps']} steps "
              f"({r['cpu_seconds']:.0f} s CPU)", flush=True)
    return results


if __name__ == "__main__":
    main()
