"""Multi-query associative recall (MQAR) across sequence mixers at about equal parameter count.

    python tools/runs/bench_recall.py --quick                 # CI size: (64, 4), one seed, seconds per run
    python tools/runs/bench_recall.py                         # full size for this device (GPU: more)
    python tools/runs/bench_recall.py --settings 64:4,128:8 --mixers attention,mamba --seeds 3

Trains ``tfm_course.models.mixer_lm.MixerLM`` with each mixer (attention, performer, retnet, mamba,
hybrid) on MQAR at each (length, pairs) setting and seed (``tfm_course.experiments.recall.train_recall``),
and writes into ``--out``:

* ``bench_recall.json`` — the command, the machine and one record per run (rewritten after every
  run, so an interrupted benchmark keeps what it finished);
* ``bench_recall.md`` — model × setting: accuracy (mean, min–max over seeds), parameters, state
  bytes per sequence after L tokens (KV cache or recurrent state, fp32), seconds (wall clock and
  this process's CPU time, which is what counts on a shared machine), steps;
* ``bench_recall.png`` — accuracy vs number of pairs, and accuracy vs state bytes.

On a GPU the runs go to ``--workers`` processes at once (small models leave the GPU mostly idle).
"""

from __future__ import annotations

import argparse
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
from tfm_course.models.mixer_lm import MIXERS  # noqa: E402
from tfm_course.experiments.recall import train_recall  # noqa: E402

CPU = dict(settings="64:4,128:8,256:16", seeds=2, steps=1500, batch_size=64, time_limit_s=120.0,
           workers=1)
GPU = dict(settings="64:4,128:8,256:16,512:32", seeds=3, steps=10000, batch_size=64,
           time_limit_s=900.0, workers=None)  # workers: one per 16 GB of GPU memory, at most 8
QUICK = dict(settings="64:4", seeds=1, steps=300, batch_size=64, time_limit_s=8.0, workers=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI size: (64, 4), one seed, 8 s per run")
    p.add_argument("--settings", help="comma-separated length:pairs, e.g. 64:4,128:8")
    p.add_argument("--mixers", default=",".join(MIXERS), help=f"subset of {','.join(MIXERS)}")
    p.add_argument("--seeds", type=int, help="seeds per (mixer, setting): 0, 1, ...")
    p.add_argument("--steps", type=int, help="maximum optimiser steps per run")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--time-limit-s", type=float, help="stop a run after this many seconds")
    p.add_argument("--workers", type=int, help="runs at once (GPU)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--target", type=float, default=0.99, help="stop early at this test accuracy")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    p.add_argument("--device", help="cpu, cuda, ... (default: the best available)")
    p.add_argument("--out", default="bench_recall", help="output folder")
    args = p.parse_args(argv)
    device = get_device(args.device)
    defaults = QUICK if args.quick else GPU if device.type == "cuda" else CPU
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.workers is None:  # Mamba at L = 512, batch 64 saves 3.5 GiB for backward (measured)
        total_gb = torch.cuda.get_device_properties(device).total_memory / 2**30
        args.workers = max(1, min(8, int(total_gb // 16)))
    args.device = str(device)
    args.setting_list = [tuple(int(v) for v in s.split(":")) for s in args.settings.split(",")]
    args.mixer_list = args.mixers.split(",")
    unknown = set(args.mixer_list) - set(MIXERS)
    if unknown:
        p.error(f"unknown mixers {sorted(unknown)}; choose from {MIXERS}")
    return args


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


def summarise(records: list[dict]) -> list[dict]:
    """One row per (mixer, seq_len, n_pairs): accuracy over seeds and the rest."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["mixer"], r["seq_len"], r["n_pairs"]), []).append(r)
    rows = []
    order = sorted(groups.items(), key=lambda kv: (kv[0][1], MIXERS.index(kv[0][0])))
    for (mixer, length, pairs), runs in order:
        acc = [r["accuracy"] for r in runs]
        rows.append({"mixer": mixer, "seq_len": length, "n_pairs": pairs, "seeds": len(runs),
                     "accuracy": statistics.mean(acc), "accuracy_min": min(acc), "accuracy_max": max(acc),
                     "parameters": runs[0]["parameters"], "state_bytes": runs[0]["state_bytes"],
                     "seconds": statistics.mean(r["seconds"] for r in runs),
                     "cpu_seconds": statistics.mean(r.get("cpu_seconds", 0.0) for r in runs),
                     "steps": statistics.mean(r["steps"] for r in runs)})
    return rows


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| model | L | pairs | accuracy (mean, min–max) | seeds | parameters | "
             "state bytes | seconds | CPU seconds | steps |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mixer']} | {r['seq_len']} | {r['n_pairs']} | {r['accuracy']:.3f} "
                     f"({r['accuracy_min']:.3f}–{r['accuracy_max']:.3f}) | {r['seeds']} | "
                     f"{r['parameters']:,} | {r['state_bytes']:,} | {r['seconds']:.1f} | "
                     f"{r['cpu_seconds']:.1f} | {r['steps']:.0f} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mixer in MIXERS:
        mine = [r for r in rows if r["mixer"] == mixer]
        if not mine:
            continue
        pairs = [r["n_pairs"] for r in mine]
        acc = [r["accuracy"] for r in mine]
        err = [[r["accuracy"] - r["accuracy_min"] for r in mine],
               [r["accuracy_max"] - r["accuracy"] for r in mine]]
        left.errorbar(pairs, acc, yerr=err, marker="o", capsize=3, label=mixer)
        right.scatter([r["state_bytes"] for r in mine], acc, label=mixer)
    left.set(xscale="log", xlabel="key-value pairs", ylabel="test accuracy",
             ylim=(-0.02, 1.02), title="recall vs number of pairs")
    right.set(xscale="log", xlabel="generation state per sequence after L tokens (bytes, fp32)",
              ylabel="test accuracy", ylim=(-0.02, 1.02), title="recall vs state size")
    left.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    given = argv if argv is not None else sys.argv[1:]
    command = "python tools/runs/bench_recall.py " + " ".join(shlex.quote(a) for a in given)
    where = machine(args.device, args.threads)
    print(f"command: {command}\nmachine: {where}", flush=True)
    jobs = [dict(mixer=m, seq_len=length, n_pairs=pairs, seed=seed, vocab_size=args.vocab_size,
                 d_model=args.d_model, num_layers=args.num_layers, steps=args.steps,
                 batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                 target=args.target,
                 time_limit_s=args.time_limit_s, device=args.device, threads=args.threads)
            for length, pairs in args.setting_list for seed in range(args.seeds) for m in args.mixer_list]
    records: list[dict] = []
    start = time.perf_counter()

    def save(record: dict) -> None:
        records.append(record)
        print(f"{record['mixer']:>9} L={record['seq_len']:<4} pairs={record['n_pairs']:<3} "
              f"seed={record['seed']} accuracy={record['accuracy']:.3f} steps={record['steps']} "
              f"{record['seconds']:.1f} s ({record['cpu_seconds']:.1f} s CPU)", flush=True)
        report = {"command": command, "machine": where, "args": {k: v for k, v in vars(args).items()
                  if k not in ("setting_list", "mixer_list")}, "records": records,
                  "summary": summarise(records), "wall_s": time.perf_counter() - start}
        (out / "bench_recall.json").write_text(json.dumps(report, indent=1))

    if args.workers > 1:
        with mp.get_context("spawn").Pool(args.workers) as pool:
            for record in pool.imap_unordered(run_one, jobs):
                save(record)
    else:
        for job in jobs:
            save(run_one(job))
    rows = summarise(records)
    header = (f"MQAR, vocabulary {args.vocab_size}, width {args.d_model}, {args.num_layers} layers; "
              f"`{command}` on {where}; total {time.perf_counter() - start:.0f} s")
    (out / "bench_recall.md").write_text(markdown(rows, header))
    figure(rows, out / "bench_recall.png", f"{command}\n{where}")
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
