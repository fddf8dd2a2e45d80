"""Multi-query associative recall (MQAR) across sequence mixers at about equal parameter count.

    python tools/runs/bench_recall.py --smoke --out /tmp/x    # seconds: what the tests run
    python tools/runs/bench_recall.py --quick                 # CI size: (64, 4), one seed, 300 steps
    python tools/runs/bench_recall.py                         # full size for this device (GPU: more)
    python tools/runs/bench_recall.py --settings 64:4,128:8 --mixers attention,retnet --seeds 3 \
        --widths 32,64,128 --lrs 1e-3,3e-3,1e-2 --short-conv 0,4 --weight-decay 0.1

Trains ``tfm_course.models.mixer_lm.MixerLM`` with each mixer (attention, performer, retnet, mamba,
hybrid, ...) on MQAR at each (length, pairs) setting, width, learning rate and seed
(``tfm_course.experiments.recall.train_recall``); ``--short-conv`` widths go to the mixers that take
a short convolution on q, k, v (``SHORT_CONV_KINDS``; the others run once, without). Budgets are in
steps (training stops early only at ``--target``), never in seconds. A cell is (mixer, short conv,
width, length, pairs); as in Zoology's figures, each cell shows its best learning rate (highest
mean accuracy over seeds, then fewest steps), and every run is stored. Writes into ``--out``:

* ``NAME.json`` (``--name``, default ``bench_recall``) — a stored run
  (``tfm_course.experiments.stored_runs``: command, git commit, machine, seeds, steps, tokens,
  CPU and wall seconds, an accuracy curve per run, a fingerprint of the data) with the arguments,
  one record per run, the rows per learning rate (``by_lr``) and the best per cell (``summary``);
  rewritten after every run, so an interrupted benchmark keeps what it finished;
* ``NAME.md`` — the best rows: accuracy (mean, min–max over seeds), steps to 0.5 and 0.9
  accuracy per seed, parameters, state bytes per sequence after L tokens (KV cache or recurrent
  state, fp32), seconds (wall clock and this process's CPU time, which is what counts on a shared
  machine), steps;
* ``NAME.png`` — accuracy against state bytes (log x), one panel per setting, one colour
  per mixer, the widths joined by a line.

On a GPU the runs go to ``--workers`` processes at once (small models leave the GPU mostly idle).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tfm_course.device import describe, get_device  # noqa: E402
from tfm_course.experiments.recall import train_recall  # noqa: E402
from tfm_course.experiments.recall_report import mixer_label, recall_against_state  # noqa: E402
from tfm_course.data.recall import multi_query_recall  # noqa: E402
from tfm_course.experiments.stored_runs import _commit  # noqa: E402
from tfm_course.models.mixer_lm import MIXERS  # noqa: E402
from tfm_course.models.mixers import SHORT_CONV_KINDS  # noqa: E402

FAIR = "attention,retnet,retnet+conv0,performer,mamba2,deltanet,gated_deltanet"  # + mamba on a GPU
# The CPU default is sized for a 2-core machine (about 1.5 h with 2 workers). Without tied
# embeddings, at vocabulary 1,024 (L 32, 4 pairs, d 64, 1,500 steps) RetNet with its conv reached
# 0.08 and attention stayed on the 1/pairs plateau; with the head tied to an N(0, 0.02) embedding,
# as the references build their LMs, RetNet with its conv reached 0.98 (measured).
CPU = dict(mixers=FAIR, vocab_size=1024, widths="16,128", lrs="3e-3,1e-2", short_conv="4",
           weight_decay=0.1, tune_on_seed0=True, settings="32:4,32:8", seeds=2, steps=1000,
           batch_size=64, workers=2, tie_embeddings=True, embed_std=0.02)
GPU = dict(mixers=FAIR + ",mamba,hybrid", vocab_size=8192, widths="32,64,128,256",
           lrs="3e-4,1e-3,3e-3,1e-2", short_conv="4", weight_decay=0.1, tune_on_seed0=True,
           settings="256:8,256:16,256:32,256:64", seeds=3, steps=2000, batch_size=64,
           workers=None, tie_embeddings=True, embed_std=0.02)  # workers: one per 16 GB of GPU memory, at most 8
QUICK = dict(mixers=",".join(MIXERS), vocab_size=256, widths="64", lrs="3e-3", short_conv="0",
             weight_decay=0.0, tune_on_seed0=False, settings="64:4", seeds=1, steps=300,
             batch_size=64, workers=1, tie_embeddings=False, embed_std=None)
SMOKE = dict(mixers=",".join(MIXERS), vocab_size=16, widths="16", lrs="3e-3", short_conv="0",
             weight_decay=0.0, tune_on_seed0=False, settings="12:2", seeds=1, steps=2, batch_size=8,
             workers=1, tie_embeddings=True, embed_std=0.02)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny: seconds in all, to check the tool runs")
    p.add_argument("--quick", action="store_true", help="CI size: (64, 4), one seed, 300 steps")
    p.add_argument("--settings", help="comma-separated length:pairs, e.g. 64:4,128:8")
    p.add_argument("--mixers", help=f"subset of {','.join(MIXERS)}; name+conv<k> fixes a mixer's "
                   "short conv (retnet+conv0: the ablation)")
    p.add_argument("--seeds", type=int, help="seeds per cell and rate: 0, 1, ...")
    p.add_argument("--steps", type=int, help="the budget: optimiser steps per run")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--workers", type=int, help="runs at once (GPU)")
    p.add_argument("--lrs", help="comma-separated learning rates; each cell keeps its best")
    p.add_argument("--widths", "--d-model", dest="widths", help="comma-separated d_model values")
    p.add_argument("--short-conv", help="comma-separated short-conv widths on q, k, v for "
                   f"{','.join(SHORT_CONV_KINDS)} (0: none), e.g. 0,4 for the ablation")
    p.add_argument("--weight-decay", type=float, help="AdamW, on matrices only")
    p.add_argument("--tune-on-seed0", action="store_true", default=None,
                   help="the rate grid at seed 0 only; the other seeds at each cell's best rate")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="the head reuses the embedding matrix (as GPT-2, mamba_ssm and Zoology do)")
    p.add_argument("--embed-std", type=float, help="embedding init N(0, std^2) (those references: "
                   "0.02; default PyTorch's N(0, 1))")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=50, help="steps between test evaluations")
    p.add_argument("--target", type=float, default=0.99, help="stop early at this test accuracy")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    p.add_argument("--device", help="cpu, cuda, ... (default: the best available)")
    p.add_argument("--out", default="bench_recall", help="output folder")
    p.add_argument("--name", default="bench_recall", help="the run's name: NAME.json, NAME.md, NAME.png")
    args = p.parse_args(argv)
    device = get_device(args.device)
    defaults = SMOKE if args.smoke else QUICK if args.quick else GPU if device.type == "cuda" else CPU
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.workers is None:  # Mamba at L = 512, batch 64 saves 3.5 GiB for backward (measured)
        total_gb = torch.cuda.get_device_properties(device).total_memory / 2**30
        args.workers = max(1, min(8, int(total_gb // 16)))
    args.device = str(device)
    try:
        args.setting_list = [tuple(int(v) for v in s.split(":")) for s in args.settings.split(",")]
        args.lr_list = [float(v) for v in args.lrs.split(",")]
        args.width_list = [int(v) for v in args.widths.split(",")]
        args.conv_list = [int(v) for v in args.short_conv.split(",")]
    except ValueError as error:
        p.error(f"--settings L:pairs,..., --lrs, --widths and --short-conv are comma lists: {error}")
    if any(len(s) != 2 for s in args.setting_list) or min(args.conv_list) < 0:
        p.error(f"need length:pairs settings and short-conv widths >= 0, got {args.settings!r}, "
                f"{args.short_conv!r}")
    args.mixer_list = args.mixers.split(",")
    try:
        unknown = {name for name in args.mixer_list if mixer_convs(name, [0])[0] not in MIXERS}
    except ValueError as error:
        p.error(f"a mixer is a name or name+conv<width>, e.g. retnet+conv0: {error}")
    if unknown:
        p.error(f"unknown mixers {sorted(unknown)}; choose from {MIXERS}")
    return args


LISTS = ("setting_list", "mixer_list", "lr_list", "width_list", "conv_list")


def mixer_convs(name: str, convs: list[int]) -> tuple[str, list[int]]:
    """``"retnet"`` -> (retnet, every ``--short-conv`` width if it takes one, else [0]);
    ``"retnet+conv0"`` -> (retnet, [0]): one cell with its own width (an ablation)."""
    mixer, _, conv = name.partition("+conv")
    if conv:
        return mixer, [int(conv)]
    return mixer, sorted(set(convs)) if mixer in SHORT_CONV_KINDS else [0]


def jobs_for(args: argparse.Namespace, seeds: list[int] | None = None,
             lrs: dict[tuple, float] | None = None) -> list[dict]:
    """One ``train_recall`` call per setting, width, mixer, short conv, learning rate and seed.

    ``seeds`` (default: all) restricts the seeds; ``lrs`` maps a cell (:data:`CELL`) to the one
    rate its runs use (the cells it lacks are left out)."""
    jobs = []
    for length, pairs in args.setting_list:
        for width in args.width_list:
            for name in args.mixer_list:
                mixer, convs = mixer_convs(name, args.conv_list)
                for conv, lr, seed in itertools.product(convs, args.lr_list,
                                                        seeds if seeds is not None else range(args.seeds)):
                    if lrs is not None:
                        cell = (mixer, conv, width, length, pairs)
                        if lrs.get(cell) != lr:
                            continue
                    jobs.append(dict(mixer=mixer, seq_len=length, n_pairs=pairs, seed=seed,
                                     vocab_size=args.vocab_size, d_model=width, short_conv=conv,
                                     num_layers=args.num_layers, steps=args.steps,
                                     batch_size=args.batch_size, lr=lr,
                                     weight_decay=args.weight_decay, target=args.target,
                                     eval_every=args.eval_every, device=args.device,
                                     tie_embeddings=args.tie_embeddings, embed_std=args.embed_std,
                                     threads=args.threads))
    return jobs


def run_one(job: dict) -> dict:
    """One training run (in a worker process on a GPU); returns its record."""
    torch.set_num_threads(job.pop("threads"))
    return train_recall(**job).as_dict()


def machine(device: str, threads: int) -> str:
    """The device, the CPU threads each run used, the CPU, torch and Python versions."""
    cpu = platform.processor() or platform.machine()
    where = describe(device).split(",")[0].split(" (")[0] if device.startswith("cpu") else describe(device)
    return (f"{where}, {threads} thread{'s' if threads != 1 else ''} per run; {os.cpu_count()} CPU "
            f"cores ({cpu}); torch {torch.__version__}; Python {platform.python_version()}")


CELL = ("mixer", "short_conv", "d_model", "seq_len", "n_pairs")  # what the best rate is chosen for


label = mixer_label  # ``retnet`` or ``retnet+conv4``


def _order(row: dict) -> tuple:
    return (row["seq_len"], row["n_pairs"], MIXERS.index(row["mixer"]), row.get("short_conv", 0),
            row.get("d_model", 0), row.get("lr", 0.0))


def summarise(records: list[dict]) -> list[dict]:
    """One row per cell and learning rate: accuracy over seeds (mean, min, max), steps to 0.5 and
    0.9 per seed (None: never), and the rest."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in CELL + ("lr",)), []).append(r)
    rows = []
    for key, runs in groups.items():
        acc = [r["accuracy"] for r in runs]
        rows.append({**dict(zip(CELL + ("lr",), key)), "seeds": len(runs),
                     "accuracy": statistics.mean(acc), "accuracy_min": min(acc), "accuracy_max": max(acc),
                     "steps_to_50": [r["steps_to_50"] for r in runs],
                     "steps_to_90": [r["steps_to_90"] for r in runs],
                     "parameters": runs[0]["parameters"], "state_bytes": runs[0]["state_bytes"],
                     "seconds": statistics.mean(r["seconds"] for r in runs),
                     "cpu_seconds": statistics.mean(r.get("cpu_seconds", 0.0) for r in runs),
                     "steps": statistics.mean(r["steps"] for r in runs)})
    return sorted(rows, key=_order)


def best_per_cell(rows: list[dict], chosen: dict[tuple, float] | None = None) -> list[dict]:
    """Of the rows of :func:`summarise`, each cell's best learning rate: highest mean accuracy,
    then fewest mean steps (early stopping at the target makes faster rates take fewer).
    ``chosen`` (cell -> rate) overrides the choice: with ``--tune-on-seed0`` the rate is chosen
    on seed 0 alone, and only that rate has the other seeds."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in CELL), []).append(row)
    best = []
    for key, candidates in cells.items():
        if chosen and key in chosen:
            top = next(r for r in candidates if r["lr"] == chosen[key])
        else:
            top = max(candidates, key=lambda r: (r["accuracy"], -r["steps"]))
        best.append({**top, "lrs_tried": sorted(r["lr"] for r in candidates)})
    return sorted(best, key=_order)


def _cell(row: dict) -> tuple:
    return tuple(row[k] for k in CELL)


def _steps_list(values: list[int | None]) -> str:
    return ", ".join("–" if v is None else str(v) for v in values)


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| model | L | pairs | width | best lr (of) | accuracy (mean, min–max) | "
             "seeds | steps to 0.5 | steps to 0.9 | parameters | state bytes | seconds | "
             "CPU seconds | steps |", "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {label(r)} | {r['seq_len']} | {r['n_pairs']} | {r['d_model']} | "
                     f"{r['lr']:g} ({len(r['lrs_tried'])}) | {r['accuracy']:.3f} "
                     f"({r['accuracy_min']:.3f}–{r['accuracy_max']:.3f}) | {r['seeds']} | "
                     f"{_steps_list(r['steps_to_50'])} | {_steps_list(r['steps_to_90'])} | "
                     f"{r['parameters']:,} | {r['state_bytes']:,} | {r['seconds']:.1f} | "
                     f"{r['cpu_seconds']:.1f} | {r['steps']:.0f} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = recall_against_state(rows, title)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def data_fingerprint(settings: list[tuple[int, int]], vocab_size: int) -> str:
    """16 hex digits of the sha256 of each setting's first batch: the stored run's ``corpus``
    (MQAR is generated, so this changes only if the generator does)."""
    digest = hashlib.sha256()
    for length, pairs in settings:
        inputs, labels = multi_query_recall(8, vocab_size=vocab_size, seq_len=length, n_pairs=pairs,
                                            generator=torch.Generator().manual_seed(0))
        digest.update(inputs.numpy().tobytes() + labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def run_key(record: dict) -> str:
    """``retnet+conv4 d16 L32 pairs4 lr0.003 seed0``: one run's key in ``steps`` and ``curves``."""
    return (f"{label(record)} d{record['d_model']} L{record['seq_len']} pairs{record['n_pairs']} "
            f"lr{record['lr']:g} seed{record['seed']}")


def stored_fields(report: dict, name: str, seeds: int, device: str, threads: int,
                  settings: list[tuple[int, int]], vocab_size: int, batch_size: int) -> dict:
    """The fields every stored run has (``tfm_course.experiments.stored_runs.REQUIRED``), from the
    benchmark's report: per-run steps, tokens and accuracy curves, CPU seconds summed over runs."""
    records = report["records"]
    return {"name": name, "date": datetime.date.today().isoformat(), "seeds": list(range(seeds)),
            "machine": {"device": torch.device(device).type, "threads": threads,
                        "cpu_count": os.cpu_count(), "platform": platform.platform(),
                        "processor": platform.machine(), "description": report["machine_text"]},
            "steps": {run_key(r): r["steps"] for r in records},
            "tokens_seen": {run_key(r): r["steps"] * batch_size * r["seq_len"] for r in records},
            "curves": {run_key(r): r["curve"] for r in records},
            "cpu_seconds": sum(r.get("cpu_seconds", 0.0) for r in records),
            "wall_seconds": report["wall_s"], "corpus": data_fingerprint(settings, vocab_size),
            "checkpoints": {}}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    given = argv if argv is not None else sys.argv[1:]
    command = "python tools/runs/bench_recall.py " + " ".join(shlex.quote(a) for a in given)
    where = machine(args.device, args.threads)
    print(f"command: {command}\nmachine: {where}", flush=True)
    records: list[dict] = []
    chosen: dict[tuple, float] = {}
    start = time.perf_counter()
    commit = _commit()

    def save(record: dict) -> None:
        records.append(record)
        print(f"{label(record):>14} L={record['seq_len']:<4} pairs={record['n_pairs']:<3} "
              f"d={record['d_model']:<4} lr={record['lr']:<7g} seed={record['seed']} "
              f"accuracy={record['accuracy']:.3f} steps={record['steps']} "
              f"{record['seconds']:.1f} s ({record['cpu_seconds']:.1f} s CPU)", flush=True)
        by_lr = summarise(records)
        report = {"command": command, "commit": commit, "machine_text": where, "device": args.device,
                  "torch": torch.__version__, "python": platform.python_version(),
                  "args": {k: v for k, v in vars(args).items() if k not in LISTS},
                  "records": records, "by_lr": by_lr, "summary": best_per_cell(by_lr, chosen),
                  "chosen_lr": [dict(zip(CELL, cell), lr=lr) for cell, lr in chosen.items()],
                  "wall_s": time.perf_counter() - start}
        report.update(stored_fields(report, args.name, args.seeds, args.device, args.threads,
                                    args.setting_list, args.vocab_size, args.batch_size))
        (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")

    def run_all(jobs: list[dict]) -> None:
        if args.workers > 1:
            with mp.get_context("spawn").Pool(args.workers) as pool:
                for record in pool.imap_unordered(run_one, jobs):
                    save(record)
        else:
            for job in jobs:
                save(run_one(job))

    if args.tune_on_seed0:  # the grid at seed 0, then the other seeds at each cell's best rate
        run_all(jobs_for(args, seeds=[0]))
        chosen.update({_cell(r): r["lr"] for r in best_per_cell(summarise(records))})
        run_all(jobs_for(args, seeds=list(range(1, args.seeds)), lrs=chosen))
    else:
        run_all(jobs_for(args))
    rows = best_per_cell(summarise(records), chosen)
    header = (f"MQAR, vocabulary {args.vocab_size}, {args.num_layers} layers, {args.steps} steps, "
              f"batch {args.batch_size}, weight decay {args.weight_decay:g}; best of learning rates "
              f"{args.lrs}{' (chosen on seed 0)' if chosen else ''}; `{command}` on {where}, "
              f"commit {commit[:12]}; "
              f"total {time.perf_counter() - start:.0f} s")
    (out / f"{args.name}.md").write_text(markdown(rows, header))
    figure(rows, out / f"{args.name}.png", f"{command}\n{where}")
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
