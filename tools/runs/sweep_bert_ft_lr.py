"""Chapter 7's fine-tuning comparison (pretrained vs from scratch) at several learning rates.

    python tools/runs/sweep_bert_ft_lr.py --lrs 1e-3 3e-4 1e-4 --seeds 0 1 2 --out tfm_course/results/bert_ft_lr_cpu.json

The chapter fine-tunes both starts at one learning rate. A pretrained start may prefer a smaller
one, so this script runs the chapter's own code (``chapters/07-bert.md``, read with jupytext: the
cells up to the fine-tuning definitions, which pretrain the chapter's model) and then fine-tunes
both starts at each rate, same seeds, steps and batches as the chapter, and writes the final
validation accuracies as JSON (stored in :mod:`tfm_course.results`, which the chapter loads). The
chapter's own rate reproduces its table. Not run by the tests; about two minutes of CPU time.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _chapter import chapter_namespace, cpu_machine, write_report  # noqa: E402

CHAPTER = ROOT / "chapters" / "07-bert.md"
STOP = "ft_start = time.process_time()"  # in the fine-tuning cell: definitions before, runs after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-4, 1e-4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    ns = chapter_namespace(CHAPTER, STOP, stop="in_cell", cpu_only=True)
    records = []
    for lr in args.lrs:
        ns["C"]["ft_lr"] = lr
        for seed in args.seeds:
            for start_from in ("pretrained", "from scratch"):
                encoder = (copy.deepcopy(ns["bert_mlm"].bert) if start_from == "pretrained"
                           else ns["fresh_bert"](1000 + seed))
                cpu = time.process_time()
                history = ns["fine_tune"](encoder, seed)
                records.append({"start": start_from, "lr": lr, "seed": seed,
                                "accuracy": history.last("accuracy"),
                                "cpu_seconds": time.process_time() - cpu})
                print(records[-1], flush=True)
    report = {
        "command": "python tools/runs/sweep_bert_ft_lr.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "run": {k: v for k, v in ns["C"].items() if k != "ft_lr"},
        "records": records,
        "wall_s": time.perf_counter() - start,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
