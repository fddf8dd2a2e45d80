"""Reading chapter 9's stored run (``tools/runs/t5_objectives.py``): curves over seeds, the crossed
table of objectives and questions, and the transfer results, as the chapter shows them.

    run = load_run("t5_objectives_cpu")
    steps, values = seed_curves(run, "causal LM", "next token loss")   # values (seeds, evaluations)
    mean, sd = final(run, "BERT-style", "blank gap")                   # over the seeds
    print(crossed_table(run, extra=[("span corruption, longer", long_run)]))
    starts, baselines = transfer_results(run)                          # {name: {n_labels: [acc per seed]}}
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

import numpy as np

from ..viz import markdown_table

__all__ = ["run_key", "seed_curves", "final", "crossed_table", "kind_accuracies", "transfer_results"]

_METRICS = (("blank gap", "blank gap", 2), ("next token loss", "next token: loss", 2),
            ("next token accuracy", "next token: accuracy", 3), ("infill loss", "infilling: loss", 2),
            ("infill accuracy", "infilling: accuracy", 3))


def run_key(run: Mapping[str, Any], arm: str, seed: int, lr_of: str | None = None) -> str:
    """The key of one training run: ``"arm|lr=<best rate of lr_of or arm>|seed=<seed>"``."""
    return f"{arm}|lr={run['best_lr'][lr_of or arm]:g}|seed={seed}"


def _spread(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_curves(run: Mapping[str, Any], arm: str, metric: str) -> tuple[list[int], np.ndarray]:
    """Evaluation steps and ``(seeds, evaluations)`` values of ``metric`` at the arm's best rate."""
    keys = [run_key(run, arm, s) for s in run["seeds"]]
    if metric not in run["curves"][keys[0]]:
        raise ValueError(f"metric must be one of {sorted(run['curves'][keys[0]])}, got {metric!r}")
    steps = [s for s, _ in run["curves"][keys[0]][metric]]
    return steps, np.array([[v for _, v in run["curves"][k][metric]] for k in keys])


def final(run: Mapping[str, Any], arm: str, metric: str) -> tuple[float, float]:
    """Mean and standard deviation over the seeds of the last evaluation of ``metric``."""
    return _spread([run["final"][run_key(run, arm, s)][metric] for s in run["seeds"]])


def kind_accuracies(records: Sequence[Mapping[str, Any]]) -> dict[int, list[float]]:
    """``{n_labels: [validation accuracy, ...]}`` of transfer records (a ``--transfer-of`` run's)."""
    out: dict[int, list[float]] = {}
    for r in records:
        out.setdefault(r["n_labels"], []).append(r["validation"]["accuracy"])
    return out


def _kind_cells(by_n: Mapping[int, Sequence[float]] | None, labels: Sequence[int | None],
                everything: int) -> dict[str, str]:
    """The kind columns of one row: mean ± sd of accuracy at each label count (None: all)."""
    cells = {}
    for n in labels:
        values = (by_n or {}).get(everything if n is None else n)
        cells[f"kind, {'all' if n is None else n} labels"] = "{:.3f} ± {:.3f}".format(*_spread(values)) if values else ""
    return cells


def crossed_table(run: Mapping[str, Any], objectives: Sequence[str],
                  extra: Sequence[tuple] = (), kind_labels: Sequence[int | None] = (32, None)) -> str:
    """Markdown: one row per objective (mean ± sd over seeds), the count-based references, the
    ablations (seed 0) and ``extra`` single runs ``(label, final metrics[, transfer records])``.

    The kind columns are the third task, "class or function?" fine-tuned text-to-text from each
    start (:func:`transfer_results`; mean ± sd over seeds or label draws) at ``kind_labels`` labels
    (None: all), next to the random start and the classification baselines on the same labels."""
    starts, baselines = transfer_results(run) if run.get("transfer") else ({}, {})
    everything = max((n for by_n in starts.values() for n in by_n), default=0)
    rows = []
    for arm in objectives:
        row = {"model": arm, "peak lr": f"{run['best_lr'][arm]:g}"}
        for metric, column, digits in _METRICS:
            row[column] = "{:.{d}f} ± {:.{d}f}".format(*final(run, arm, metric), d=digits)
        rows.append(row | _kind_cells(starts.get(arm), kind_labels, everything))
    refs = run["references"]
    for name, nxt, inf in (("unigram", "next token: unigram", None),
                           ("KN bigram; infilling: two-sided bigram", "next token: KN bigram",
                            "infill: KN two-sided bigram"),
                           ("KN 4-gram", "next token: KN 4-gram", None)):
        rows.append({"model": f"counts: {name}", "peak lr": "", "blank gap": "",
                     "next token: loss": f"{refs[nxt]['loss']:.2f}",
                     "next token: accuracy": f"{refs[nxt]['accuracy']:.3f}",
                     "infilling: loss": f"{refs[inf]['loss']:.2f}" if inf else "",
                     "infilling: accuracy": f"{refs[inf]['accuracy']:.3f}" if inf else ""})
    blank = {column: "" for _, column, _ in _METRICS}
    if starts:
        rows.append({"model": "random start, fine-tuned", "peak lr": "", **blank,
                     **_kind_cells(starts.get("scratch"), kind_labels, everything)})
        for name, by_n in baselines.items():
            rows.append({"model": f"kind: {name}", "peak lr": "", **blank, **_kind_cells(by_n, kind_labels, everything)})
    singles = [(f"{arm} (seed 0)", run["final"][run_key(run, arm, 0, lr_of="span corruption")])
               for arm in run["settings"]["ablations"]] + list(extra)
    for label, metrics, *transfer in singles:
        kind = kind_accuracies(transfer[0]) if transfer and transfer[0] else None
        rows.append({"model": label, "peak lr": "", **{column: f"{metrics[m]:.{d}f}" for m, column, d in _METRICS},
                     **_kind_cells(kind, kind_labels, everything)})
    return markdown_table(rows, list(dict.fromkeys(k for row in rows for k in row)))


def transfer_results(run: Mapping[str, Any]) -> tuple[dict[str, dict[int, list[float]]],
                                                      dict[str, dict[int, list[float]]]]:
    """Validation accuracy per seed: ``{start: {n_labels: [...]}}`` (the fine-tuning rate each start
    kept; "scratch" is the random start) and ``{baseline: {n_labels: [...]}}`` on the same labels."""
    starts: dict[str, dict[int, list[float]]] = {}
    for r in run["transfer"]:
        if r.get("ladder") and r["lr"] != run["fine_tune_lr"][r["arm"]]:
            continue  # a rate the ladder tried and did not keep
        starts.setdefault(r["arm"], {}).setdefault(r["n_labels"], []).append(r["validation"]["accuracy"])
    everything = max(n for by_n in starts.values() for n in by_n)  # "all": the whole training split
    baselines: dict[str, dict[int, list[float]]] = {}
    for r in run["baselines"]:
        for name in ("majority", "first-word rule", "bag of tokens"):
            baselines.setdefault(name, {}).setdefault(r["n_labels"] or everything, []).append(r[name])
    return starts, baselines
