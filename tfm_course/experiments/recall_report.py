"""How the recall benchmark is shown: one figure of accuracy against state size, shared by
``tools/runs/bench_recall.py`` (which writes it next to its JSON) and chapter 11 (which draws it
from the stored run).

    rows = load_result("bench_recall_fair_cpu")["summary"]    # best learning rate per cell
    fig = recall_against_state(rows, title="stored run ...")
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ..models.mixer_lm import MIXERS

__all__ = ["mixer_label", "recall_against_state"]


def mixer_label(row: Mapping) -> str:
    """``"retnet"``, or ``"retnet+conv4"`` for a row with a short convolution of width 4."""
    return row["mixer"] + (f"+conv{row['short_conv']}" if row.get("short_conv") else "")


def _label_order(name: str) -> tuple:
    mixer, _, conv = name.partition("+conv")
    return MIXERS.index(mixer), -int(conv or 0)


def recall_against_state(rows: Sequence[Mapping], title: str = "") -> Figure:
    """Accuracy (mean over seeds, bars: min to max) against state bytes per sequence after L
    tokens (log x; attention at its KV-cache size), one panel per (length, pairs) setting, one
    colour per mixer, its widths joined by a line; dashed: 1 / pairs, the score of a model that
    knows the answer is one of the sequence's values but not which.

    ``rows``: dicts with ``mixer``, ``short_conv``, ``seq_len``, ``n_pairs``, ``state_bytes``,
    ``accuracy``, ``accuracy_min``, ``accuracy_max`` (the benchmark's ``summary``)."""
    if not rows:
        raise ValueError("recall_against_state needs at least one row, got none")
    settings = sorted({(r["seq_len"], r["n_pairs"]) for r in rows})
    labels = sorted({mixer_label(r) for r in rows}, key=_label_order)
    colours = {name: f"C{i % 10}" for i, name in enumerate(labels)}
    fig, axes = plt.subplots(1, len(settings), figsize=(4.6 * len(settings) + 1.2, 4), squeeze=False,
                             sharey=True)
    for ax, (length, pairs) in zip(axes[0], settings):
        for name in labels:
            mine = sorted((r for r in rows if mixer_label(r) == name and (r["seq_len"], r["n_pairs"])
                           == (length, pairs)), key=lambda r: r["state_bytes"])
            if not mine:
                continue
            err = [[r["accuracy"] - r["accuracy_min"] for r in mine],
                   [r["accuracy_max"] - r["accuracy"] for r in mine]]
            ax.errorbar([r["state_bytes"] for r in mine], [r["accuracy"] for r in mine], yerr=err,
                        marker="o", capsize=3, color=colours[name], label=name,
                        linestyle="--" if name.endswith("+conv0") else "-")
        ax.axhline(1 / pairs, color="k", linestyle=":", linewidth=1)
        ax.set(xscale="log", xlabel="state per sequence after L tokens (bytes, fp32)",
               ylim=(-0.02, 1.02), title=f"L = {length}, {pairs} pairs")
    axes[0][0].set_ylabel("test accuracy (best learning rate)")
    handles = {}  # every mixer once, whichever panel it appears in
    for ax in axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(name, handle)
    ordered = sorted(handles, key=_label_order)
    axes[0][-1].legend([handles[n] for n in ordered], ordered, fontsize=8, loc="center left",
                       bbox_to_anchor=(1.0, 0.5))
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return fig
