"""Chapter 8's stored compute sweep: characters against BPE at 1x, 4x, 10x and 16x the page's
compute, with a learning rate tuned per tokenizer and budget, several seeds, and the n-gram lines.

    python tools/runs/gpt_compute_sweep.py                      # the CPU sweep, two worker processes
    python tools/runs/gpt_compute_sweep.py --smoke --out-dir /tmp/x --workers 0   # seconds: the tests
    python tools/runs/gpt_compute_sweep.py --extend             # add what a newer version stores

The recipe is :mod:`tfm_course.experiments.gpt_recipe` (nanoGPT's CPU configuration and
optimiser). A budget is a number of character-model steps (200 is the page's, 2,000 nanoGPT's whole
CPU run); the BPE model gets the steps of equal FLOPs. For every tokenizer and budget, seed 0 tries
the peak learning rates 1e-3 and 2e-3 (nanoGPT's and twice it), then doubles or halves beyond
whichever end wins until the best is inside the tried range (1/4 to 4 times the ladder at most);
seeds 1 and 2 then train at seed 0's best rate. Choosing the rate on the validation text that is
also reported favours the chosen rate by a little; the seeds after it are fresh draws.

Writes ``tfm_course/results/gpt_compute_sweep_cpu.json``: every run's curves (validation bits per
byte at ten points, the training loss in bits per byte in 100 bins), the n-gram lines of orders
1-4 on the same validation tokens, FLOPs per token, and checkpoints (fp16) of seed 0's model at
the largest budget and its best rate, one per tokenizer (keys ``characters`` and ``BPE``), and of
the BPE model at the smallest budget (key ``BPE-200``: chapter 8's short model, retrained after the
sweep with the same recipe, seed and batches, and checked against its record), each with its bits
per byte on the whole validation split. Each run uses one CPU thread; the whole sweep took about an
hour and a half of CPU time on the development machine.

``--extend`` reads a finished sweep and adds only what it lacks (the small checkpoints, the
whole-split scores), recording the command, commit, machine and CPU seconds under ``addenda``.
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

from tfm_course.experiments import gpt_recipe as R
from tfm_course.experiments import stored_runs

BUDGETS = (200, 800, 2000, 3200)  # character-model steps: 1x, 4x, nanoGPT's 2,000, 16x
LADDER = (1e-3, 2e-3)
SEEDS = (0, 1, 2)
MIN_LR, MAX_LR = 2.5e-4, 8e-3
SMALL_CHECKPOINTS = ("BPE",)  # also kept at the smallest budget: chapter 8's short model


def run_one(name: str, steps: int, lr: float, seed: int, keep: bool, evaluations: int = 10) -> dict:
    """Train one model; return its record (and its fp16 state dict when ``keep``)."""
    torch.set_num_threads(1)
    cpu = time.process_time()
    model, history, train_bpb = R.train_lm(R.lm_data(name), steps, lr, seed, evaluations=evaluations,
                                           progress=False)
    every = max(1, steps // 100)
    record = {"tokenizer": name, "steps": steps, "lr": lr, "seed": seed,
              "bits_per_byte": history.last("validation bits per byte"),
              "valid": [[s + 1, v] for s, v in history.metrics["validation bits per byte"]],
              "train": [[i + every, sum(train_bpb[i:i + every]) / len(train_bpb[i:i + every])]
                        for i in range(0, steps, every)],
              "cpu_seconds": time.process_time() - cpu}
    if keep:  # fp16, the tied embedding / output matrix once (one tensor under both names)
        halves: dict[int, torch.Tensor] = {}
        record["state"] = {k: halves.setdefault(v.data_ptr(), v.half()) for k, v in model.state_dict().items()}
    return record


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes (0: in this process)")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets, to check the tool runs")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    parser.add_argument("--extend", action="store_true", help="add what a finished sweep lacks")
    args = parser.parse_args(argv)
    budgets, seeds, evaluations = ((4,), (0, 1), 2) if args.smoke else (BUDGETS, SEEDS, 10)
    name = "gpt_compute_sweep_cpu" + ("_smoke" if args.smoke else "")
    command = shlex.join(["python", "tools/runs/gpt_compute_sweep.py", *(argv if argv is not None else sys.argv[1:])])
    out = args.out_dir or stored_runs.RESULTS_DIR
    if args.extend:
        return extend(stored_runs.load_run(name, out), command, out, evaluations,
                      whole_chars=2_000 if args.smoke else None)
    run = stored_runs.new_run(name, command, list(seeds), "cpu", recipe=R.RECIPE, budgets=list(budgets),
                              ladder=list(LADDER))
    out.mkdir(parents=True, exist_ok=True)
    data = {n: R.lm_data(n) for n in R.TOKENIZERS}  # before forking: the workers share it
    steps = {b: R.equal_compute_steps(b) for b in budgets}
    flops = {n: R.flops_per_token(n) for n in R.TOKENIZERS}
    run["settings"].update(
        flops_per_token=flops, steps_per_budget={str(b): s for b, s in steps.items()},
        valid_tokens={n: len(d.valid) for n, d in data.items()},
        train_tokens={n: len(d.train) for n, d in data.items()},
        ngram_bits_per_byte={n: {str(o): R.ngram_bits_per_byte(d, o) for o in (1, 2, 3, 4)}
                             for n, d in data.items()})
    records: list[dict] = []
    largest = max(budgets)
    pool = (cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("fork"))
            if args.workers else None)
    pending: dict = {}
    states: dict = {}

    def submit(n: str, b: int, lr: float, seed: int) -> None:
        job = (n, steps[b][n], lr, seed, b == largest and seed == seeds[0], evaluations)
        if pool is None:
            pending[(n, b, lr, seed)] = job
        else:
            pending[pool.submit(run_one, *job)] = (n, b, lr, seed)

    def tried(n: str, b: int) -> dict[float, float]:
        return {r["lr"]: r["bits_per_byte"] for r in records
                if r["tokenizer"] == n and r["budget"] == b and r["seed"] == seeds[0]}

    def next_jobs(n: str, b: int) -> None:
        """After a seed-0 run: try a further rate beyond a winning end, or start the other seeds."""
        done = tried(n, b)
        if any(key[:2] == (n, b) for key in _keys(pending, pool)):
            return  # wait for the rest of this budget's ladder
        best = min(done, key=done.get)
        if best == min(done) and best / 2 >= MIN_LR:
            submit(n, b, best / 2, seeds[0])
        elif best == max(done) and best * 2 <= MAX_LR:
            submit(n, b, best * 2, seeds[0])
        else:
            for seed in seeds[1:]:
                submit(n, b, best, seed)

    for b in sorted(budgets):  # the cheap budgets first
        for n in R.TOKENIZERS:
            for lr in LADDER:
                submit(n, b, lr, seeds[0])
    while pending:
        if pool is None:
            key, job = next(iter(pending.items()))
            del pending[key]
            finished = [(run_one(*job), key)]
        else:
            done, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
            finished = [(f.result(), pending.pop(f)) for f in done]
        for record, (n, b, lr, seed) in finished:
            record["budget"] = b
            state = record.pop("state", None)
            if state is not None:  # seed 0 at the largest budget: kept until its best rate is known
                states[n, lr] = state
            records.append(record)
            print(f"{n:>10} budget {b:>4} ({record['steps']} steps) lr {lr:g} seed {seed}: "
                  f"{record['bits_per_byte']:.4f} bits per byte, {record['cpu_seconds']:.0f} s CPU", flush=True)
            if seed == seeds[0]:
                next_jobs(n, b)
        _write(run, records, out, partial=bool(pending))
    if pool is not None:
        pool.shutdown()
    for n in R.TOKENIZERS:  # the checkpoint of each tokenizer's best model at the largest budget
        done = tried(n, largest)
        best = min(done, key=done.get)
        run["checkpoints"][n] = stored_runs.save_checkpoint(states[n, best], f"{name}-{n}", folder=out)
        run["settings"].setdefault("checkpoint_runs", {})[n] = {"tokenizer": n, "budget": largest, "lr": best,
                                                                "seed": seeds[0]}
    add_small_checkpoints(run, records, out, evaluations)
    score_whole_split(run, out, whole_chars=2_000 if args.smoke else None)
    path = _write(run, records, out, partial=False)
    print(f"wrote {path}")
    return path


def add_small_checkpoints(run: dict, records: list[dict], out: Path, evaluations: int) -> None:
    """Retrain seed 0 at the smallest budget and its best rate for each of :data:`SMALL_CHECKPOINTS`
    and store its checkpoint (key ``NAME-BUDGET``). Same recipe, seed and batches as the record:
    the retrain must land on it (1 thread; another CPU's kernels round a little differently)."""
    small, seed = min(run["settings"]["budgets"]), run["seeds"][0]
    for n in SMALL_CHECKPOINTS:
        key = f"{n}-{small}"
        if key in run["checkpoints"]:
            continue
        record = min((r for r in records if r["tokenizer"] == n and r["budget"] == small and r["seed"] == seed),
                     key=lambda r: r["bits_per_byte"])
        again = run_one(n, record["steps"], record["lr"], seed, keep=True, evaluations=evaluations)
        gap = abs(again["bits_per_byte"] - record["bits_per_byte"])
        if gap > 0.01:
            raise RuntimeError(f"{key}: the retrain scores {again['bits_per_byte']:.4f} bits per byte, the "
                               f"record {record['bits_per_byte']:.4f}; expected them within 0.01")
        run["checkpoints"][key] = stored_runs.save_checkpoint(again["state"], f"{run['name']}-{key}", folder=out)
        run["settings"].setdefault("checkpoint_runs", {})[key] = {
            "tokenizer": n, "budget": small, "lr": record["lr"], "seed": seed,
            "retrained_bits_per_byte": again["bits_per_byte"]}
        print(f"{key}: retrained, {again['bits_per_byte']:.4f} bits per byte (record "
              f"{record['bits_per_byte']:.4f})", flush=True)


def score_whole_split(run: dict, out: Path, whole_chars: int | None = None) -> None:
    """Bits per byte of every checkpoint (its fp16 weights) on the whole validation split (the first
    ``whole_chars`` characters in smoke mode), stored with the checkpoint's run."""
    for key, where in run["settings"]["checkpoint_runs"].items():
        if "whole_validation_bits_per_byte" in where:
            continue
        data = R.lm_data(where.setdefault("tokenizer", key), whole_chars)
        model = R.make_model(data.vocab_size)
        model.load_state_dict({k: v.float() for k, v in stored_runs.load_checkpoint(run, key, out).items()})
        where["whole_validation_bits_per_byte"] = R.bits_per_byte(model, data)
        where["whole_validation_chars"] = whole_chars


def extend(run: dict, command: str, out: Path, evaluations: int, whole_chars: int | None) -> Path:
    """Add to a finished sweep what it lacks, and an ``addenda`` entry saying who added it."""
    if run["settings"].get("partial"):
        raise ValueError(f"{run['name']} is a partial sweep: finish it before extending it")
    before = stored_runs.new_run(run["name"], command, run["seeds"], "cpu")
    add_small_checkpoints(run, run["records"], out, evaluations)
    score_whole_split(run, out, whole_chars)
    stored_runs.finish_run(before)
    run.setdefault("addenda", []).append({k: before[k] for k in ("command", "commit", "date", "python", "torch",
                                                                 "machine", "cpu_seconds", "wall_seconds")})
    path = stored_runs.write_run(run, folder=out)
    print(f"extended {path}")
    return path


def _keys(pending: dict, pool) -> list:
    return list(pending) if pool is None else list(pending.values())


def _write(run: dict, records: list[dict], out: Path, partial: bool) -> Path:
    """Write the run so far (a partial run says so: an interrupted sweep keeps what it measured)."""
    import copy

    snapshot = copy.deepcopy({k: v for k, v in run.items() if k != "_clock"})
    snapshot["_clock"] = run["_clock"]
    snapshot["settings"]["partial"] = partial
    snapshot["curves"] = {f"{r['tokenizer']}-{r['budget']}-lr{r['lr']:g}-seed{r['seed']}":
                          {"valid": r["valid"], "train": r["train"]} for r in records}
    snapshot["records"] = [{k: v for k, v in r.items() if k not in ("valid", "train")} for r in records]
    for r in records:
        key = f"{r['tokenizer']}-{r['budget']}-lr{r['lr']:g}-seed{r['seed']}"
        snapshot["steps"][key] = r["steps"]
        snapshot["tokens_seen"][key] = r["steps"] * R.RECIPE["batch"] * R.RECIPE["block"]
    snapshot["child_cpu_seconds"] = sum(r["cpu_seconds"] for r in records)
    return stored_runs.write_run(snapshot, folder=out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
