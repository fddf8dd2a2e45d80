"""Chapter 13's stored ablation: from chapter 8's GPT to Llama and Qwen3, one change at a time.

    python tools/runs/decoder_ablation.py                     # the CPU ablation, two worker processes
    python tools/runs/decoder_ablation.py --smoke --workers 0 --out-dir /tmp/x   # seconds: the tests
    python tools/runs/decoder_ablation.py --device cuda --workers 0 --steps 4000  # the same sizes, longer
    python tools/runs/decoder_ablation.py --long      # then: the base and Qwen3's block, four times longer

Every arm is :class:`tfm_course.models.llama.Llama` trained with chapter 8's recipe
(:mod:`tfm_course.experiments.gpt_recipe`: nanoGPT's CPU configuration, BPE tokens, the same
batches per seed) for the same number of steps: the BPE steps that cost what nanoGPT's 2,000
character-model steps cost. The base arm is chapter 8's GPT (LayerNorm, tanh GELU, learned
positions, tied output layer, and, as in nanoGPT's CPU configuration, no biases); each other arm
changes one switch, and the last one all of them together (Qwen3's block). For every arm, seed 0
tries the peak rates 1e-3, 2e-3 and 4e-3 and widens by factors of 2 while the best sits at an end
(within 2.5e-4 to 1.6e-2); seeds 1 and 2 then train at seed 0's best rate. Reported: validation
bits per byte, each arm's mean and spread over seeds, its parameters and training FLOPs per
token (counted on the meta device), next to the count-based n-gram lines on the same tokens.
Each run uses one CPU thread.

``--long [ARM ...]`` (default: the base and Qwen3's block) asks whether a difference survives four
times the steps: seed 0 of each arm tries the rate the stored ablation chose and half of it (a
longer run usually wants a lower peak), widened as above while the better sits at an end, and
seeds 1 and 2 train at the best; it writes ``decoder_ablation_long_cpu.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from tfm_course.experiments import gpt_recipe as R
from tfm_course.experiments import stored_runs
from tfm_course.experiments.decoder_arms import ALL, ARMS, BASE, config, make
from tfm_course.models.llama import Llama

LADDER = (1e-3, 2e-3, 4e-3)
MIN_LR, MAX_LR = 2.5e-4, 1.6e-2
SEEDS = (0, 1, 2)


def costs(arm: str, vocab_size: int, recipe: dict = R.RECIPE) -> dict:
    """Parameters and training FLOPs per token (forward and backward, counted on the meta device)."""
    with torch.device("meta"):
        model = Llama(config(arm, vocab_size, recipe))
        x = torch.zeros(1, recipe["block"], dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            model(x, x)[1].backward()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"parameters": params, "flops_per_token": counter.get_total_flops() // recipe["block"]}


def run_one(arm: str, steps: int, lr: float, seed: int, evaluations: int, device: str = "cpu") -> dict:
    torch.set_num_threads(1)
    cpu = time.process_time()
    _, history, _ = R.train_lm(R.lm_data("BPE"), steps, lr, seed, evaluations=evaluations, progress=False,
                               make=make(arm), device=device)
    return {"arm": arm, "steps": steps, "lr": lr, "seed": seed,
            "bits_per_byte": history.last("validation bits per byte"),
            "valid": [[s + 1, v] for s, v in history.metrics["validation bits per byte"]],
            "cpu_seconds": time.process_time() - cpu}


def summary(records: list[dict], seeds: tuple[int, ...]) -> list[dict]:
    rows = []
    for arm in ARMS:
        mine = [r for r in records if r["arm"] == arm]
        if not mine:
            continue
        first = {r["lr"]: r["bits_per_byte"] for r in mine if r["seed"] == seeds[0]}
        best = min(first, key=first.get)
        scores = [r["bits_per_byte"] for r in mine if r["lr"] == best]
        rows.append({"arm": arm, "lr": best, "lrs_tried": sorted(first), "at_edge": best in (min(first), max(first)),
                     "mean": statistics.mean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                     "runs": len(scores), "scores": scores})
    return rows


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes (0: in this process)")
    parser.add_argument("--smoke", action="store_true", help="four steps, two arms, to check the tool runs")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run (default: the BPE steps of nanoGPT's 2,000 character steps)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (one run at a time: --workers 0)")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds per arm (the first chooses the rate)")
    parser.add_argument("--long", nargs="*", default=None, metavar="ARM",
                        help="four times the steps for these arms (default: the base and Qwen3's block), from the "
                             "stored ablation's rate and half of it, widened while the better sits at an end")
    args = parser.parse_args(argv)
    seeds, evaluations = ((0, 1), 2) if args.smoke else (tuple(range(args.seeds)), 10)
    size = "cpu" if args.device == "cpu" else "gpu"
    suffix = "_smoke" if args.smoke else ""
    out = args.out_dir or stored_runs.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    if args.long is None:
        arms = list(ARMS)[:2] if args.smoke else list(ARMS)
        steps = 4 if args.smoke else args.steps or R.equal_compute_steps(2000)["BPE"]
        name = f"decoder_ablation_{size}{suffix}"
        ladders = {a: LADDER[:1] if args.smoke else LADDER for a in arms}
    else:
        arms = args.long or ([BASE, "RMSNorm"] if args.smoke else [BASE, ALL])
        unknown = [a for a in arms if a not in ARMS]
        if unknown:
            raise SystemExit(f"unknown arms {unknown}; the arms are {list(ARMS)}")
        short = stored_runs.load_run(f"decoder_ablation_{size}{suffix}", folder=out)
        chosen = {row["arm"]: row["lr"] for row in short["curves"]["summary"]}
        steps = 8 if args.smoke else args.steps or 4 * short["steps"]["per_run"]
        name = f"decoder_ablation_long_{size}{suffix}"
        ladders = {a: (chosen[a] / 2, chosen[a]) for a in arms}
    command = shlex.join(["python", "tools/runs/decoder_ablation.py", *(argv if argv is not None else sys.argv[1:])])
    data = R.lm_data("BPE")  # before forking: the workers share it
    run = stored_runs.new_run(name, command, list(seeds), args.device, recipe=R.RECIPE, arms=ARMS, ladder=list(LADDER),
                              ladders={a: list(v) for a, v in ladders.items()},
                              steps=steps, costs={a: costs(a, data.vocab_size) for a in arms},
                              ngram_bits_per_byte={str(o): R.ngram_bits_per_byte(data, o) for o in (1, 2, 3, 4)})
    pool = cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("fork")) if args.workers else None
    # Finished runs are appended here as they end, so an interrupted ablation resumes where it stopped.
    partial = out / f"{name}.partial.jsonl"
    records: list[dict] = [json.loads(line) for line in partial.read_text().splitlines()] if partial.exists() else []
    records = [r for r in records if r["steps"] == steps and r["arm"] in arms]

    def batch(jobs: list[tuple]) -> None:
        done = {(r["arm"], r["lr"], r["seed"]) for r in records}
        jobs = [job for job in jobs if (job[0], job[2], job[3]) not in done]
        futures = [None] * len(jobs) if pool is None else [pool.submit(run_one, *job) for job in jobs]
        for job, future in zip(jobs, futures):
            r = run_one(*job) if pool is None else future.result()
            records.append(r)
            with partial.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{r['arm']:>28} lr {r['lr']:.0e} seed {r['seed']}: {r['bits_per_byte']:.4f} bits/byte "
                  f"({r['cpu_seconds']:.0f} s)", flush=True)

    batch([(a, steps, lr, seeds[0], evaluations, args.device) for a in arms for lr in ladders[a]])
    while True:  # widen where seed 0's best rate sits at an end; an arm whose rate is settled trains its seeds
        jobs = []
        for row in summary(records, seeds):
            lo, hi = min(row["lrs_tried"]), max(row["lrs_tried"])
            if not args.smoke and row["lr"] == lo and lo / 2 >= MIN_LR:
                jobs.append((row["arm"], steps, lo / 2, seeds[0], evaluations, args.device))
            elif not args.smoke and row["lr"] == hi and hi * 2 <= MAX_LR:
                jobs.append((row["arm"], steps, hi * 2, seeds[0], evaluations, args.device))
            else:  # in the same batch as the others' widening: no worker waits
                jobs += [(row["arm"], steps, row["lr"], s, evaluations, args.device) for s in seeds[1:]]
        done = {(r["arm"], r["lr"], r["seed"]) for r in records}
        if all((job[0], job[2], job[3]) in done for job in jobs):
            break
        batch(jobs)
    if pool is not None:
        pool.shutdown()
    run["curves"] = {"records": records, "summary": summary(records, seeds)}
    run["steps"] = {"per_run": steps}
    run["tokens_seen"] = {"per_run": steps * R.RECIPE["batch"] * R.RECIPE["block"]}
    run["checkpoints"] = {}
    stored_runs.finish_run(run)
    run["cpu_seconds"] += sum(r["cpu_seconds"] for r in records) if pool is not None else 0.0
    path = stored_runs.write_run(run, folder=out)
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    torch.set_num_threads(1)  # each run uses one thread (run_one); the record says so
    main()
