"""The plotting helpers every chapter uses, so the whole book has one visual style, and
:func:`markdown_table`, the one way a chapter shows a table of numbers.

Chapter-specific figures are built in the chapter from these pieces; anything two chapters need
lives here.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

PALETTE = ["#1f5fa6", "#d9541e", "#2a9d55", "#8e44ad", "#c0392b", "#7f8c8d", "#b8860b", "#16a085"]
CMAP = "viridis"


def use_style() -> None:
    """Apply the book's matplotlib style (called on import)."""
    plt.rcParams.update(
        {
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": 110,
            "savefig.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.prop_cycle": plt.cycler(color=PALETTE),
            "font.size": 10,
            "axes.titlesize": 11,
            "legend.frameon": False,
            "image.cmap": CMAP,
        }
    )


use_style()

# CJK fonts a reader's system may have (free ones first), and the PyPI package that ships one
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei",
             "Droid Sans Fallback", "PingFang SC", "Microsoft YaHei")
CJK_PACKAGE = "noto-cjk-sans-otc"


def use_cjk_font() -> str | None:
    """Let figures draw Chinese: put a CJK font in ``font.family`` after the default sans-serif one
    (matplotlib falls back along that list per character, so Latin text is unchanged) and return
    its name, or None when none is available (Chinese then draws as boxes; ``pip install
    noto-cjk-sans-otc`` ships Noto Sans CJK, free under the SIL Open Font License)."""
    from matplotlib import font_manager

    try:  # the package's font, registered with matplotlib if it is installed
        import noto_cjk_sans_otc

        font_manager.fontManager.addfont(str(noto_cjk_sans_otc.FONT_PATH))
    except ImportError:
        pass
    have = {f.name for f in font_manager.fontManager.ttflist}
    name = next((f for f in CJK_FONTS if f in have), None)
    if name is not None:
        families = [f for f in _families() if f != name]
        plt.rcParams["font.family"] = [*families[:1], name, *families[1:]]
    return name


def _families() -> list[str]:
    """``font.family`` with each generic name ("sans-serif") replaced by its first installed font."""
    from matplotlib import font_manager

    out = []
    for family in plt.rcParams["font.family"]:
        for candidate in plt.rcParams.get(f"font.{family}", [family]):
            try:
                font_manager.findfont(font_manager.FontProperties(family=candidate), fallback_to_default=False)
            except ValueError:  # not installed
                continue
            out.append(candidate)
            break
    return out


def missing_glyphs(text: str) -> list[str]:
    """The characters of ``text`` that no font of ``font.family`` can draw (they would show as boxes)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    faces = [FT2Font(font_manager.findfont(font_manager.FontProperties(family=f))) for f in _families()]
    return sorted({ch for ch in text if not ch.isspace() and not any(f.get_char_index(ord(ch)) for f in faces)})


def _numpy(x: torch.Tensor | np.ndarray | Sequence) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def heatmap(
    matrix: torch.Tensor | np.ndarray,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = CMAP,
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    xlabel: str | None = None,
    ylabel: str | None = None,
) -> Axes:
    """A labelled heatmap of a 2-D matrix (e.g. attention weights: rows = queries, cols = keys).

    Cells are annotated with their values when the matrix is small (≤ 12 × 12) unless ``annotate``
    says otherwise.
    """
    m = _numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    ax = ax or plt.subplots(figsize=(0.5 * m.shape[1] + 2.5, 0.45 * m.shape[0] + 1.5))[1]
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.grid(False)
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), labels=row_labels)
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), labels=col_labels, rotation=45, ha="right")
    if annotate is None:
        annotate = m.shape[0] <= 12 and m.shape[1] <= 12
    if annotate:
        lo, hi = np.nanmin(m), np.nanmax(m)
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                dark = (m[i, j] - lo) < 0.6 * (hi - lo + 1e-12)
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    return ax


def line_plot(
    x: Sequence[float] | np.ndarray,
    series: dict[str, Sequence[float] | np.ndarray],
    ax: Axes | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    logx: bool = False,
    logy: bool = False,
    marker: str | None = "o",
) -> Axes:
    """Several named series against a shared x axis, with a legend."""
    ax = ax or plt.subplots()[1]
    for name, ys in series.items():
        ax.plot(_numpy(x), _numpy(ys), marker=marker, markersize=4, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()
    return ax


def training_curves(history, keys: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """Loss (and any recorded metrics) against step, from a :class:`tfm_course.train.History`."""
    keys = list(keys) if keys is not None else ["loss", *history.metrics]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        if key == "loss":
            ax.plot(history.steps, history.loss, color=PALETTE[0], alpha=0.35, lw=0.8)
            ax.plot(history.steps, smooth(history.loss), color=PALETTE[0], label="loss (smoothed)")
            ax.set_yscale("log")
        else:
            steps, values = zip(*history.metrics[key]) if history.metrics[key] else ((), ())
            ax.plot(steps, values, marker="o", markersize=3, color=PALETTE[1])
        ax.set_xlabel("step")
        ax.set_title(key)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def smooth(values: Sequence[float], weight: float = 0.9) -> np.ndarray:
    """Exponential moving average (bias-corrected) for noisy training curves."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * float(v)
        out.append(avg / (1 - weight**i))
    return np.asarray(out)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   headers: Sequence[str] | None = None) -> str:
    """A GitHub-style markdown table of ``rows`` (dicts) restricted to ``columns``."""
    headers = list(headers or columns)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)
