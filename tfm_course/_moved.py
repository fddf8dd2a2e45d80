"""Old module paths that moved: importing one raises an error that names where it went.

The experiment harnesses used to sit at the package root beside the ideas; they live in
:mod:`tfm_course.experiments` now. ``import tfm_course.bench`` (or ``from tfm_course import
bench``) raises ``ModuleNotFoundError`` saying which module holds each of its names.
"""

from __future__ import annotations

import importlib.abc
import sys

MOVED = {
    "tfm_course.bench": "tfm_course.experiments.measure (time_fn, synchronize, saved_tensor_bytes, "
                        "peak_tensor_bytes, cuda_peak_bytes, count_flops), "
                        "tfm_course.experiments.scaling (sweep, loglog_slope, crossover) and "
                        "tfm_course.viz (markdown_table)",
    "tfm_course.efficient_bench": "tfm_course.experiments.equal_time (train_for, quality_at_equal_time, "
                                  "quality_table, TASK, flush_denormals) and "
                                  "tfm_course.experiments.scaling (metric_table, crossover_table)",
    "tfm_course.recall_bench": "tfm_course.experiments.recall",
    "tfm_course.generation_bench": "tfm_course.experiments.generation",
    "tfm_course.objectives": "tfm_course.experiments.objectives",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers only for the names in :data:`MOVED`; every other import goes on as usual."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001
        if fullname in MOVED:
            # name=None on purpose: `from tfm_course import bench` would otherwise swallow this
            # error (its module name matches) and raise a bare "cannot import name 'bench'".
            raise ModuleNotFoundError(f"{fullname} moved to {MOVED[fullname]}", name=None)
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
