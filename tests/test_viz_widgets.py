import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from tfm_course import viz, widgets
from tfm_course.train import History


def test_heatmap_labels_and_annotations():
    ax = viz.heatmap(torch.eye(3), row_labels=list("abc"), col_labels=list("xyz"), title="t")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("abc")
    assert len(ax.texts) == 9
    plt.close("all")


def test_heatmap_rejects_non_matrices():
    with pytest.raises(ValueError, match="2-D"):
        viz.heatmap(torch.zeros(2, 2, 2))


def test_line_plot_and_training_curves():
    ax = viz.line_plot([1, 2, 4], {"a": [1, 2, 3], "b": [3, 2, 1]}, logx=True)
    assert len(ax.lines) == 2 and ax.get_legend() is not None
    h = History(steps=[0, 1, 2], loss=[3.0, 2.0, 1.0], lr=[1, 1, 1], metrics={"acc": [(2, 0.5)]})
    fig = viz.training_curves(h)
    assert len(fig.axes) == 2
    plt.close("all")


def test_smooth_is_bias_corrected():
    assert np.allclose(viz.smooth([5.0, 5.0, 5.0]), 5.0)


def test_explore_falls_back_to_a_static_grid_outside_a_live_kernel():
    calls = []

    def plot(ax, scale, offset):
        calls.append((scale, offset))
        ax.plot([0, 1], [offset, scale])

    assert not widgets.interactive_available()
    fig = widgets.explore(plot, "scale", [1, 2, 3, 4, 5], fixed={"offset": 0})
    assert len(fig.axes) == 3
    assert calls == [(1, 0), (3, 0), (5, 0)]
    plt.close("all")


@pytest.mark.hf
def test_hugging_face_loading_bars_are_off_where_nobody_watches(tmp_path):
    """Saved as notebook widgets, they would make a built page load scripts from a CDN."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    code = ("import tfm_course, transformers\n"
            "print(transformers.utils.logging.is_progress_bar_enabled())")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    quiet = subprocess.run([sys.executable, "-c", code], env={**env, "CI": "true"},
                           capture_output=True, text=True, check=True, cwd=tmp_path)
    assert quiet.stdout.strip() == "False"
    watched = {k: v for k, v in env.items() if k != "CI"}
    shown = subprocess.run([sys.executable, "-c", code], env={**watched, "COLAB_RELEASE_TAG": "x"},
                           capture_output=True, text=True, check=True, cwd=tmp_path)
    assert shown.stdout.strip() == "True"
