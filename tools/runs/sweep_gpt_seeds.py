"""Chapter 8's characters-vs-BPE comparison at the chapter's own compute, for several seeds.

    python tools/runs/sweep_gpt_seeds.py --seeds 0 1 2 3 4 --out tfm_course/results/gpt_tokenizer_seeds_cpu.json

The chapter can afford one full run per tokenizer on the CPU. This script runs the chapter's own
code (``chapters/08-gpt.md``, read with jupytext) up to the cell that defines ``train_one`` and
the equal-compute step counts, then trains every seed of both tokenizers for the whole run, on
one CPU thread, and writes validation bits per byte and CPU seconds per run as JSON (stored in
:mod:`tfm_course.results`, which the chapter loads). Seed 0 is the chapter's own run. Not run by
the tests; a few minutes of CPU time per seed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _chapter import chapter_namespace, cpu_machine, write_report  # noqa: E402

CHAPTER = ROOT / "chapters" / "08-gpt.md"
LAST_CELL = "head_share = {"  # the cell that ends with the step counts and the head share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    ns = chapter_namespace(CHAPTER, LAST_CELL, stop="after_cell", cpu_only=True)
    records = []
    with ns["one_cpu_thread"](ns["device"]), contextlib.redirect_stderr(io.StringIO()):
        for name in ns["tokenizers"]:
            for seed in args.seeds:
                cpu = time.process_time()
                with contextlib.redirect_stdout(io.StringIO()):
                    _, history, _ = ns["train_one"](name, seed, ns["steps"][name])
                records.append({"tokenizer": name, "seed": seed, "steps": ns["steps"][name],
                                "bits_per_byte": history.last("validation bits per byte"),
                                "cpu_seconds": time.process_time() - cpu})
                print(records[-1], flush=True)
    report = {
        "command": "python tools/runs/sweep_gpt_seeds.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "run": {k: v for k, v in ns["RUN"].items() if k not in ("seeds", "spread_seeds")},
        "eval_chars": len(ns["eval_text"]),
        "unigram_bits_per_byte": ns["unigram"],
        "records": records,
        "wall_s": time.perf_counter() - start,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
