"""Interactive explorers (ipywidgets) with a static fallback for the HTML book.

A notebook on Colab or Jupyter gets sliders; the built HTML book, which has no running kernel,
gets a grid of the same plot at a few fixed settings, so a reader sees what the sliders would show.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from . import _FRONT_ENDS

PlotFn = Callable[..., None]  # plot_fn(ax=..., **params) draws one panel


def interactive_available() -> bool:
    """True in a live Jupyter / Colab kernel with ipywidgets; False while building or testing."""
    if os.environ.get("TFM_STATIC_WIDGETS") or os.environ.get("CI"):
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    # jupyter-book / nbval execute through nbclient, which leaves no front end to talk to.
    return any(name in os.environ for name in _FRONT_ENDS)  # Jupyter, Colab, VS Code


def static_grid(plot_fn: PlotFn, name: str, values: Sequence[Any], fixed: dict[str, Any] | None = None,
                panel_size: tuple[float, float] = (3.4, 3.0)) -> Figure:
    """One panel per value of parameter ``name``: the fallback picture of a slider."""
    fig, axes = plt.subplots(1, len(values), figsize=(panel_size[0] * len(values), panel_size[1]),
                             squeeze=False)
    for ax, value in zip(axes[0], values):
        plot_fn(ax=ax, **{**(fixed or {}), name: value})
        ax.set_title(f"{name} = {value:g}" if isinstance(value, (int, float)) else f"{name} = {value}")
    fig.tight_layout()
    return fig


def explore(plot_fn: PlotFn, name: str, values: Sequence[Any], fixed: dict[str, Any] | None = None,
            static_values: Sequence[Any] | None = None) -> Figure | None:
    """Sliders over ``values`` for parameter ``name`` when a live kernel is present, else a static grid.

    ``plot_fn(ax=ax, **params)`` draws one panel. ``static_values`` (default: first, middle and last
    of ``values``) are the settings shown in the static grid.
    """
    if not interactive_available():
        static_values = static_values or [values[0], values[len(values) // 2], values[-1]]
        return static_grid(plot_fn, name, static_values, fixed)
    import ipywidgets as widgets
    from IPython.display import display

    slider = widgets.SelectionSlider(options=list(values), value=values[len(values) // 2],
                                     description=name, continuous_update=False)
    out = widgets.Output()

    def redraw(change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(4.5, 3.8))
            plot_fn(ax=ax, **{**(fixed or {}), name: slider.value})
            plt.show()

    slider.observe(redraw, names="value")
    display(widgets.VBox([slider, out]))
    redraw()
    return None


def draw_on(ax: Axes | None) -> Axes:
    """The given axes, or a fresh one (for plot functions that may be called outside a grid)."""
    return ax if ax is not None else plt.subplots()[1]
