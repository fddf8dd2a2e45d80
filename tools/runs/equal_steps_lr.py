"""Stored learning-rate sweep for chapter 10's quality comparison (equal steps, rate per method).

    python tools/runs/equal_steps_lr.py                            # the page's grid, on the CPU
    python tools/runs/equal_steps_lr.py --smoke --out-dir /tmp/x   # seconds: what the tests run

Every attention of the comparison (softmax, sliding window, Linformer, Performer) trains
:class:`~tfm_course.models.recall_classifier.RecallClassifier` on scattered recall for the same
number of steps at each learning rate of a small grid, with every seed
(:func:`tfm_course.experiments.equal_time.lr_sweep`); the best rate per method (mean held-out
accuracy over the seeds, :func:`~tfm_course.experiments.equal_time.best_rates`) is what the page
trains with; where it is at an end of the rates tried, the tool halves or doubles beyond it (at
most twice per method) until it is inside. Writes ``tfm_course/results/equal_steps_lr_cpu.json``: command, commit, machine,
settings, every run's numbers (accuracy, steps, ms per step), and the chosen rates. A budget of
steps gives the same numbers on any machine, idle or busy; on a CPU each run uses one thread.
CPU time: about two to three minutes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tfm_course.device import get_device
from tfm_course.experiments import stored_runs
from tfm_course.experiments.equal_time import best_rates, lr_sweep, rate_beyond

ATTENTIONS = ("softmax", "window", "linformer", "performer")
MAX_EXTENSIONS = 2  # rates tried beyond a winning end of the grid, per method
SETTINGS = dict(length=256, steps=80, lrs=[3e-3, 6e-3, 1.2e-2], seeds=[0, 1], batch_size=16)
SMOKE = dict(length=40, steps=2, lrs=[3e-3, 1.2e-2], seeds=[0], batch_size=4,
             task=dict(num_records=4, num_queries=8, num_keys=8, num_values=4),
             model=dict(d_model=16, num_heads=2, k=8), test_size=16)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny grid, to check the tool runs")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    args = parser.parse_args(argv)
    device = get_device()
    settings = dict(SMOKE if args.smoke else SETTINGS)
    name = f"equal_steps_lr_{device.type}" + ("_smoke" if args.smoke else "")
    command = "python tools/runs/equal_steps_lr.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = stored_runs.new_run(name, command.strip(), settings["seeds"], device,
                              attentions=list(ATTENTIONS),
                              **{k: v for k, v in settings.items() if k != "seeds"})
    options = dict(length=settings["length"], batch_size=settings["batch_size"], device=device)
    if "task" in settings:
        options.update(task=settings["task"], test_size=settings["test_size"], **settings["model"])
    results = lr_sweep(ATTENTIONS, settings["lrs"], settings["steps"], settings["seeds"], **options)
    for _ in range(MAX_EXTENSIONS):
        extra = [(kind, lr) for kind in ATTENTIONS if (lr := _beyond(results, kind)) is not None]
        if not extra:
            break
        for kind, lr in extra:
            results += lr_sweep([kind], [lr], settings["steps"], settings["seeds"], **options)
    run["results"] = [r.as_dict() for r in results]
    run["best_lr"] = best_rates(results)
    run["steps"] = {kind: settings["steps"] for kind in ATTENTIONS}
    run["tokens_seen"] = {kind: settings["steps"] * settings["batch_size"] * settings["length"]
                          for kind in ATTENTIONS}
    for kind in ATTENTIONS:  # mean accuracy against the learning rate
        run["curves"][kind] = [[lr, sum(r.accuracy for r in results if (r.attention, r.lr) == (kind, lr))
                                / len(settings["seeds"])] for lr in _tried(results, kind)]
    out = args.out_dir or stored_runs.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = stored_runs.write_run(run, out)
    print(f"wrote {path}: best rates {run['best_lr']}")
    return path


def _tried(results, kind: str) -> list[float]:
    return sorted({r.lr for r in results if r.attention == kind})


def _beyond(results, kind: str) -> float | None:
    """Half the smallest or twice the largest rate tried for ``kind`` when the best is there."""
    return rate_beyond(_tried(results, kind), best_rates([r for r in results if r.attention == kind])[kind])


if __name__ == "__main__":
    main()
