"""Let ``pytest --nbval`` execute the chapters as a Colab reader gets them.

nbval collects the generated Colab copies ``chapters/NN-slug.ipynb`` (the files the book's Colab
button opens; ``tools/book/colab_notebooks.py`` writes them from the ``.md`` sources, and a test fails
when one is stale). The ``.md`` sources are not collected, so each chapter runs once.

A Colab copy stores no outputs, so nbval only checks that its cells run. Cells marked
``# NBVAL_CHECK_OUTPUT`` get their reviewed outputs from ``tests/expected_outputs/`` (see
``tools/book/expected_outputs.py``) when nbval reads the notebook, and nbval compares those.

At the end of a run with notebooks, a table gives each chapter's execution time (the sum of its
cells), the figure the 90-second budget is about.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
from pathlib import Path

import pytest

# With pytest-xdist (`-n 2`), each worker and every notebook kernel it starts would otherwise use
# all cores: two workers x two threads on a 2-core machine made small training loops up to 10x
# slower. One thread per worker keeps the workers from fighting (kernels inherit the variable).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).parent
CHAPTERS = ROOT / "chapters"
BUDGET_S = 90.0


def _nbval_enabled(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if any(part.startswith(".") or part == "_build" for part in collection_path.relative_to(ROOT).parts):
        return True
    return None


@functools.cache
def _expected_outputs():
    """tools/book/expected_outputs.py, loaded once (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("expected_outputs", ROOT / "tools" / "book" / "expected_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _ReaderWithRecords:
    """nbformat, except that reading a chapter's Colab copy attaches its recorded outputs."""

    def __init__(self, nbformat):
        self._nbformat = nbformat

    def __getattr__(self, name):
        return getattr(self._nbformat, name)

    def read(self, path, as_version=4, **kwargs):
        notebook = self._nbformat.read(path, as_version=as_version, **kwargs)
        path = Path(str(path)).resolve()
        if path.parent == CHAPTERS.resolve():
            _expected_outputs().attach(notebook, path.with_suffix(".md"))
        return notebook


def pytest_configure(config: pytest.Config) -> None:
    if not _nbval_enabled(config):
        return
    import nbval.plugin

    if not isinstance(nbval.plugin.nbformat, _ReaderWithRecords):
        nbval.plugin.nbformat = _ReaderWithRecords(nbval.plugin.nbformat)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Glued values are display data for the book's prose (myst-nb): nbval does not compare them."""
    for notebook in {item.parent for item in items if hasattr(item.parent, "skip_compare")}:
        notebook.skip_compare = tuple(notebook.skip_compare) + _expected_outputs().GLUE_MIMES


_chapter_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid.startswith("chapters/") and report.when == "call":
        _chapter_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seconds = _chapter_seconds
    if not seconds:
        return
    terminalreporter.section("chapter execution times (sum of cells)")
    for chapter, total in sorted(seconds.items()):
        flag = "  OVER BUDGET" if total > BUDGET_S else ""
        terminalreporter.write_line(f"{total:7.1f} s  {chapter}{flag}")
