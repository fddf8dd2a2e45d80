"""Stored run of chapter 9: T5's objectives on one fixed encoder-decoder, past the start-up phase,
then transfer to "class or function?" with few labels.

    python tools/runs/t5_objectives.py                           # the CPU sizes, 2 worker processes
    python tools/runs/t5_objectives.py --workers 1               # the same, one process
    python tools/runs/t5_objectives.py --smoke --out-dir /tmp/x  # seconds: what the tests run
    python tools/runs/t5_objectives.py --long "span corruption" --steps 8000 --lr 4e-3   # one arm, longer
    python tools/runs/t5_objectives.py --long "span corruption, 50 % noise" --steps 20000 --lr 4e-3  # an ablation
    python tools/runs/t5_objectives.py --transfer-of t5_objectives_long_span_corruption_8000_cpu --lr 1e-3

1. **Learning rates.** Each objective (span corruption, BERT-style, prefix LM, causal LM:
   :mod:`tfm_course.experiments.encdec_objectives`) is trained at seed 0 at peak rates 2e-3 and 4e-3,
   widened by factors of 2 (within [1e-3, 1.6e-2]) while the best rate, by the objective's own
   validation loss, is at an edge of those tried.
2. **Seeds and ablations.** Seeds 1 and 2 at each objective's best rate; span corruption also with
   15 % -> 50 % corruption and mean span 3 -> 10 (T5 Tables 6-7), seed 0.
3. **Questions.** Every run is evaluated every ``steps / 8`` steps: its own validation loss, the
   loss with the input blanked (:func:`blank_gap`), and the two context questions of
   :mod:`tfm_course.experiments.context_questions` (next token after 16 tokens; the token between
   16 and 16), next to the count-based references on the same questions.
4. **Transfer.** Every pretrained model (3 seeds) and a random start with the same initial weights
   is fine-tuned text-to-text on 32, 128 and all labels (:func:`fine_tune_kind`), the fine-tuning
   rate chosen per start at 128 labels, seed 0, from 3e-4, 1e-3, 3e-3; the baselines use the same
   labelled examples (:func:`kind_baselines`).

Writes ``tfm_course/results/t5_objectives_<size>.json`` and the seed-0 checkpoint of every
objective and ablation (fp16, ``...-<arm>.pt``). About 75 minutes of CPU time at the CPU sizes.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import resource
import shlex
import shutil
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from tfm_course.data import corpus
from tfm_course.device import get_device
from tfm_course.experiments import stored_runs
from tfm_course.experiments.context_questions import (answer_questions, context_questions, count_references,
                                                      split_documents)
from tfm_course.experiments.encdec_objectives import (ENCDEC_OBJECTIVES, ENCDEC_SIZES, blank_gap,
                                                      encdec_model, objective_batch, pretrain_objective)
from tfm_course.experiments.objectives import Specials, random_windows, token_stream
from tfm_course.experiments.t5_transfer import fine_tune_kind, kind_baselines, kind_task
from tfm_course.models.t5 import T5
from tfm_course.tokenizers import default_tokenizer

SIZES = {"cpu": dict(ENCDEC_SIZES, vocab=1024, steps=2000, questions=2048, left=16, right=16, valid_windows=256,
                     lrs=(2e-3, 4e-3), lr_range=(1e-3, 1.6e-2), seeds=(0, 1, 2), labels=(32, 128, None),
                     ft_steps=300, ft_lrs=(3e-4, 1e-3, 3e-3)),
         "gpu": dict(ENCDEC_SIZES, vocab=1024, d_model=256, d_ff=1024, batch=64, length=128, steps=20000,
                     questions=8192, left=16, right=16, valid_windows=1024, lrs=(1e-3, 2e-3),
                     lr_range=(2.5e-4, 8e-3), seeds=(0, 1, 2), labels=(32, 128, None), ft_steps=1000,
                     ft_lrs=(3e-4, 1e-3, 3e-3))}
SMOKE = dict(steps=4, questions=64, valid_windows=16, lrs=(2e-3,), seeds=(0,), labels=(32,), ft_steps=3,
             ft_lrs=(1e-3,), batch=4, length=32, lr_range=(2e-3, 2e-3),
             documents=300)
ABLATIONS = {"span corruption, 50 % noise": dict(noise_density=0.5),
             "span corruption, mean span 10": dict(mean_span_length=10.0)}


@functools.lru_cache(maxsize=None)
def setting(size_key: tuple) -> dict[str, Any]:
    """Tokenizer, streams, questions and the kind task, built once per process."""
    sizes = dict(size_key)
    device = get_device()
    tok = default_tokenizer(4096).truncated(sizes["vocab"])
    specials = Specials.after(tok.vocab_size, eos=tok.special_ids["<|endoftext|>"], n_sentinels=16)
    limit = sizes.get("documents")  # None: all (the smoke test reads a few hundred)
    streams = {split: token_stream(tok, [d.text for d in corpus.documents(split)[:limit]], specials.eos).to(device)
               for split in ("train", "validation")}
    g = torch.Generator(device=device).manual_seed(1)
    questions = context_questions(streams["validation"], sizes["questions"], sizes["left"], sizes["right"], g,
                                  eos=specials.eos)
    windows = random_windows(streams["validation"], sizes["valid_windows"], sizes["length"], g)
    return dict(tok=tok, specials=specials, streams=streams, questions=questions, windows=windows,
                task=kind_task(tok, specials, device=device), device=device)


def corruption(arm: str) -> dict[str, float]:
    return ABLATIONS.get(arm, {})


def objective_of(arm: str) -> str:
    return "span corruption" if arm in ABLATIONS else arm


def pretrain_job(size_key: tuple, arm: str, lr: float, seed: int, folder: str) -> dict[str, Any]:
    """Train one arm at one rate and seed; evaluate it along the way; save its checkpoint (fp16)."""
    torch.set_num_threads(1)
    sizes, s = dict(size_key), setting(size_key)
    objective, specials = objective_of(arm), s["specials"]
    valid = objective_batch(objective, s["windows"], specials, torch.Generator(device=s["device"]).manual_seed(9),
                            **corruption(arm))

    def evaluate(model: T5) -> dict[str, float]:
        gap = blank_gap(model, valid, specials)
        answers = answer_questions(objective, model, s["questions"], specials)
        return {"valid loss": gap["loss"], "blank gap": gap["gap"],
                **{f"{q} {m}": v for q, r in answers.items() for m, v in r.items()}}

    model, history = pretrain_objective(objective, specials, s["streams"]["train"], sizes["steps"], lr, seed,
                                        sizes, eval_fn=evaluate,
                                        eval_every=max(2, sizes["steps"] // sizes.get("eval_times", 8)),
                                        progress=False, **corruption(arm))
    stem = f"{arm}-lr{lr:g}-seed{seed}".replace(" ", "_").replace(",", "").replace("%", "pct")
    torch.save({k: v.half() for k, v in model.state_dict().items()}, Path(folder) / f"{stem}.pt")
    every = max(1, sizes["steps"] // 100)
    return {"arm": arm, "lr": lr, "seed": seed, "file": f"{stem}.pt", "seconds": history.seconds,
            "curves": {**{k: [[st + 1, v] for st, v in vals] for k, vals in history.metrics.items()},
                       "train loss": [[i + every, sum(history.loss[i:i + every]) / every]
                                      for i in range(0, len(history.loss) - every + 1, every)]},
            "final": {k: vals[-1][1] for k, vals in history.metrics.items()}}


def load_start(size_key: tuple, file: str | None, seed: int, folder: str) -> T5:
    """A pretrained model from ``folder/file`` (fp16 -> fp32), or with ``file=None`` the random start
    of ``seed`` (the initial weights every pretraining of that seed began from)."""
    sizes, s = dict(size_key), setting(size_key)
    torch.manual_seed(seed)
    model = encdec_model(s["specials"], sizes)
    if file is not None:
        state = torch.load(Path(folder) / file, weights_only=True)
        model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(s["device"])


def transfer_job(size_key: tuple, arm: str, file: str | None, seed: int, n_labels: int | None, lr: float,
                 folder: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    sizes, s = dict(size_key), setting(size_key)
    result = fine_tune_kind(load_start(size_key, file, seed, folder), s["task"], n_labels, seed,
                            sizes["ft_steps"], lr, copy_model=False)
    return {"arm": arm, "seed": seed, "n_labels": result["n_train"], "lr": lr,
            **{k: result[k] for k in ("validation", "sentinel prior before", "sentinel prior after", "seconds")},
            "final train loss": sum(result["loss"][-20:]) / len(result["loss"][-20:])}


def next_rate(tried: dict[float, float], low: float, high: float) -> float | None:
    """The rate to try next (x2 past the best if it is at an edge of those tried), or None."""
    best = min(tried, key=tried.get)
    if best == min(tried) and best / 2 >= low * 0.999 and best / 2 not in tried:
        return best / 2
    if best == max(tried) and best * 2 <= high * 1.001 and best * 2 not in tried:
        return best * 2
    return None


class Runner:
    """Runs jobs in a process pool (or inline with one worker) and calls back on completion."""

    def __init__(self, workers: int):
        ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx) if workers > 1 else None
        self.pending: list[tuple[Future | Any, Any]] = []
        self.children_before = self.children_cpu()

    @staticmethod
    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def submit(self, fn, args: tuple, then) -> None:
        if self.pool is None:
            then(fn(*args))
        else:
            self.pending.append((self.pool.submit(fn, *args), then))

    def drain(self) -> None:
        while self.pending:
            for item in list(self.pending):
                future, then = item
                if future.done():
                    self.pending.remove(item)
                    then(future.result())
            if self.pending:
                time.sleep(0.5)

    def close(self) -> float:
        """Shut the pool down; the CPU seconds its workers used (0 when the jobs ran inline)."""
        if self.pool is None:
            return 0.0
        self.pool.shutdown(wait=True)  # the workers are reaped, so RUSAGE_CHILDREN includes them
        return self.children_cpu() - self.children_before


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default: gpu on an accelerator")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check the tool runs")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    parser.add_argument("--long", choices=[*ENCDEC_OBJECTIVES, *ABLATIONS], default=None,
                        help="only this objective (or span-corruption ablation), for --steps at --lr, seed 0: "
                             "how its curves go on")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="the --long run's seed")
    parser.add_argument("--transfer-of", default=None,
                        help="a stored --long run: fine-tune its checkpoint on 32/128/all labels x 3 seeds at --lr")
    args = parser.parse_args(argv)
    if args.long is not None:
        return long_run(args, argv)
    if args.transfer_of is not None:
        return transfer_of(args, argv)
    device = get_device()
    size = args.size or ("cpu" if device.type == "cpu" else "gpu")
    sizes = dict(SIZES[size], **(SMOKE if args.smoke else {}))
    workers = 1 if device.type != "cpu" else args.workers
    name = f"t5_objectives_{size}" + ("_smoke" if args.smoke else "")
    out = args.out_dir or stored_runs.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / f"_{name}_checkpoints"
    scratch.mkdir(exist_ok=True)
    key = tuple(sorted((k, v) for k, v in sizes.items()))
    command = "python tools/runs/t5_objectives.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = stored_runs.new_run(name, command, list(sizes["seeds"]), device, size=size,
                              sizes={k: v for k, v in sizes.items()}, ablations=ABLATIONS)
    s = setting(key)
    docs = split_documents(s["streams"]["train"].cpu(), s["specials"].eos)
    run["references"] = count_references(docs, s["questions"], s["tok"].vocab_size)
    run["settings"]["questions"] = len(s["questions"])
    runs: dict[str, dict[str, Any]] = {}  # "arm|lr|seed" -> pretrain_job's result
    ladder: dict[str, dict[float, float]] = {arm: {} for arm in ENCDEC_OBJECTIVES}
    transfer: list[dict[str, Any]] = []
    ft_rates: dict[str, dict[float, float]] = {}
    runner = Runner(workers)
    low, high = sizes["lr_range"]
    arms = ["scratch", *ENCDEC_OBJECTIVES]

    def pretrain(arm: str, lr: float, seed: int, then) -> None:
        runner.submit(pretrain_job, (key, arm, lr, seed, str(scratch)), then)

    def record(result: dict[str, Any]) -> None:
        runs[f"{result['arm']}|lr={result['lr']:g}|seed={result['seed']}"] = result
        print(f"{result['arm']} lr {result['lr']:g} seed {result['seed']}: "
              + ", ".join(f"{k} {v:.3f}" for k, v in result["final"].items()), flush=True)

    def ladder_done(result: dict[str, Any]) -> None:
        record(result)
        arm = result["arm"]
        ladder[arm][result["lr"]] = result["final"]["valid loss"]
        if len(ladder[arm]) < len(sizes["lrs"]):
            return
        nxt = next_rate(ladder[arm], low, high)
        if nxt is not None:
            pretrain(arm, nxt, 0, ladder_done)
            return
        best = min(ladder[arm], key=ladder[arm].get)
        for seed in sizes["seeds"][1:]:
            pretrain(arm, best, seed, record)
        if arm == "span corruption":
            for ablation in ABLATIONS:
                pretrain(ablation, best, 0, record)

    for arm in ENCDEC_OBJECTIVES:
        for lr in sizes["lrs"]:
            pretrain(arm, lr, 0, ladder_done)
    runner.drain()
    best_lr = {arm: min(ladder[arm], key=ladder[arm].get) for arm in ENCDEC_OBJECTIVES}

    def start_file(arm: str, seed: int) -> str | None:
        return None if arm == "scratch" else runs[f"{arm}|lr={best_lr[arm]:g}|seed={seed}"]["file"]

    def rate_done(result: dict[str, Any]) -> None:
        ft_rates.setdefault(result["arm"], {})[result["lr"]] = result["validation"]["accuracy"]
        transfer.append(result | {"ladder": True})

    tune_labels = 128 if 128 in sizes["labels"] else sizes["labels"][0]
    for arm in arms:
        for lr in sizes["ft_lrs"]:
            runner.submit(transfer_job, (key, arm, start_file(arm, 0), 0, tune_labels, lr, str(scratch)), rate_done)
    runner.drain()
    ft_lr = {arm: max(rates, key=rates.get) for arm, rates in ft_rates.items()}
    for arm in arms:
        for seed in sizes["seeds"]:
            for n_labels in sizes["labels"]:
                if seed == 0 and n_labels == tune_labels:
                    continue  # the rate's own run, already in `transfer`
                runner.submit(transfer_job, (key, arm, start_file(arm, seed), seed, n_labels, ft_lr[arm],
                                             str(scratch)), transfer.append)
    runner.drain()
    run["child_cpu_seconds"] = runner.close()  # cpu_seconds counts this process only
    run["baselines"] = [{"n_labels": n, "seed": seed, **kind_baselines(s["task"], n, seed, s["tok"].vocab_size)}
                        for n in sizes["labels"] for seed in sizes["seeds"]]
    run["ladder"] = {arm: {f"{lr:g}": v for lr, v in sorted(t.items())} for arm, t in ladder.items()}
    run["best_lr"], run["fine_tune_lr"] = best_lr, ft_lr
    run["fine_tune_ladder"] = {arm: {f"{lr:g}": v for lr, v in sorted(t.items())} for arm, t in ft_rates.items()}
    run["transfer"] = transfer
    run["final"] = {k: r["final"] for k, r in runs.items()}
    run["seconds"] = {k: r["seconds"] for k, r in runs.items()}
    for k, r in runs.items():
        run["curves"][k] = r["curves"]
        run["steps"][k] = sizes["steps"]
        run["tokens_seen"][k] = sizes["steps"] * sizes["batch"] * sizes["length"]
    for arm in [*ENCDEC_OBJECTIVES, *ABLATIONS]:  # the seed-0 checkpoint of every arm, at its rate
        k = f"{arm}|lr={best_lr[objective_of(arm)]:g}|seed=0"
        if k in runs:
            state = torch.load(scratch / runs[k]["file"], weights_only=True)
            run["checkpoints"][arm] = stored_runs.save_checkpoint(state, f"{name}-{runs[k]['file'][:-3]}",
                                                                  dtype=torch.float16, folder=out)
    shutil.rmtree(scratch)
    path = stored_runs.write_run(run, folder=out)
    print(f"wrote {path}")
    return path


def long_run(args: argparse.Namespace, argv: list[str] | None) -> Path:
    """One objective for longer (``--seed``, default 0), evaluated 16 times: curves and final checkpoint.
    Seed 0 is ``t5_objectives_long_<objective>_<steps>_<size>``; another seed adds ``_seed<k>``."""
    if args.steps is None or args.lr is None:
        raise ValueError(f"--long needs --steps and --lr, got steps={args.steps}, lr={args.lr}")
    device = get_device()
    size = args.size or ("cpu" if device.type == "cpu" else "gpu")
    sizes = dict(SIZES[size], **(SMOKE if args.smoke else {}))
    sizes["steps"], sizes["eval_times"] = args.steps, 16
    slug = args.long.replace(" ", "_").replace("-", "_").replace(",", "").replace("%", "pct")
    seed = args.seed
    name = (f"t5_objectives_long_{slug}_{args.steps}_{size}" + (f"_seed{seed}" if seed else "")
            + ("_smoke" if args.smoke else ""))
    out = args.out_dir or stored_runs.RESULTS_DIR
    scratch = out / f"_{name}_checkpoints"
    scratch.mkdir(parents=True, exist_ok=True)
    key = tuple(sorted(sizes.items()))
    command = "python tools/runs/t5_objectives.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = stored_runs.new_run(name, command, [seed], device, size=size, sizes=sizes, objective=args.long, lr=args.lr)
    result = pretrain_job(key, args.long, args.lr, seed, str(scratch))
    k = f"seed{seed}"
    run["curves"][k], run["final"] = result["curves"], result["final"]
    run["steps"][k] = args.steps
    run["tokens_seen"][k] = args.steps * sizes["batch"] * sizes["length"]
    state = torch.load(scratch / result["file"], weights_only=True)
    run["checkpoints"][k] = stored_runs.save_checkpoint(state, f"{name}-{k}", dtype=torch.float16, folder=out)
    shutil.rmtree(scratch)
    path = stored_runs.write_run(run, folder=out)
    print(f"wrote {path}")
    return path


def transfer_of(args: argparse.Namespace, argv: list[str] | None) -> Path:
    """Add to a stored --long run the transfer results of its checkpoint (as in the main run)."""
    if args.lr is None:
        raise ValueError("--transfer-of needs --lr (the fine-tuning rate)")
    out = args.out_dir or stored_runs.RESULTS_DIR
    run = stored_runs.load_run(args.transfer_of, out)
    sizes = dict(run["settings"]["sizes"])
    sizes = {k: tuple(v) if isinstance(v, list) else v for k, v in sizes.items()}
    key = tuple(sorted(sizes.items()))
    folder = out / f"_{args.transfer_of}_transfer"
    folder.mkdir(exist_ok=True)
    torch.save(stored_runs.load_checkpoint(run, f"seed{run['seeds'][0]}", out), folder / "start.pt")
    results = [transfer_job(key, run["settings"]["objective"], "start.pt", seed, n, args.lr, str(folder))
               for seed in sizes["seeds"] for n in sizes["labels"]]
    shutil.rmtree(folder)
    run["transfer"] = results
    run["transfer_command"] = "python tools/runs/t5_objectives.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    path = out / f"{args.transfer_of}.json"
    path.write_text(json.dumps(run, indent=1) + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
