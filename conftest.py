"""Let ``pytest --nbval`` execute the chapters straight from their MyST-Markdown sources.

nbval only collects ``.ipynb`` files. Here the ``.md`` chapters (jupytext notebooks) are collected
by a subclass of nbval's ``IPyNbFile`` that reads the notebook through jupytext; the generated
``chapters/*.ipynb`` Colab copies are skipped, so each chapter runs exactly once.

A ``.md`` notebook stores no outputs, so nbval would only check that its cells run. Cells marked
``# NBVAL_CHECK_OUTPUT`` get their reviewed outputs from ``tests/expected_outputs/`` (see
``tools/expected_outputs.py``), and nbval compares those.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import types
from pathlib import Path
from unittest import mock

import pytest

# With pytest-xdist (`-n 2`), each worker and every notebook kernel it starts would otherwise use
# all cores: two workers x two threads on a 2-core machine made small training loops up to 10x
# slower. One thread per worker keeps the workers from fighting (kernels inherit the variable).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).parent
CHAPTERS = ROOT / "chapters"


def _nbval_enabled(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix == ".ipynb" and collection_path.parent == CHAPTERS:
        return True  # generated Colab copy of a .md chapter
    if any(part.startswith(".") or part == "_build" for part in collection_path.relative_to(ROOT).parts):
        return True
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".md" and file_path.parent == CHAPTERS and _nbval_enabled(parent.config):
        return MarkdownNotebook.from_parent(parent, path=file_path)
    return None


@functools.cache
def _expected_outputs():
    """tools/expected_outputs.py, loaded once (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("expected_outputs", ROOT / "tools" / "expected_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _jupytext_read(path: str, as_version: int = 4):
    import jupytext

    return _expected_outputs().attach(jupytext.read(path), Path(path))


try:
    from nbval.plugin import IPyNbFile
except ImportError:  # nbval missing: plain `pytest` still runs the unit tests
    IPyNbFile = None

if IPyNbFile is not None:

    class MarkdownNotebook(IPyNbFile):
        """nbval's notebook collector, fed a jupytext-parsed ``.md`` notebook."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.skip_compare = self.skip_compare + _expected_outputs().GLUE_MIMES

        def collect(self):
            import nbval.plugin

            reader = types.SimpleNamespace(read=_jupytext_read)
            with mock.patch.object(nbval.plugin, "nbformat", reader):
                yield from super().collect()
