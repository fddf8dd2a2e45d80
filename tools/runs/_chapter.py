"""Run a chapter's own code up to a marker, so that a stored-run tool reuses the page's definitions.

    namespace = chapter_namespace(ROOT / "chapters" / "08-gpt.md", "head_share = {")
    namespace["train_one"]("bpe", seed, steps)            # a function the page defined

The chapter (a MyST-Markdown notebook) is read with jupytext, a build tool, which is why this
lives in ``tools/`` and not in the package. Its code cells run in order, in one namespace, with
matplotlib's non-interactive backend and the cells' printing silenced (errors still raise).
``stop="in_cell"`` stops inside the cell that contains ``marker``, before the marker's text (the
definitions above it run, the runs after it do not); ``stop="after_cell"`` runs that whole cell.
``cpu_only=True`` refuses a page that picked another device (the stored result is the CPU
experiment). :func:`cpu_machine` and :func:`write_report` are the rest a sweep over a page shares.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
from pathlib import Path


def chapter_namespace(chapter: Path, marker: str, stop: str = "after_cell", cpu_only: bool = False) -> dict:
    """The globals of ``chapter``'s code cells run up to ``marker`` (see the module docstring)."""
    if stop not in ("in_cell", "after_cell"):
        raise ValueError(f"stop must be 'in_cell' or 'after_cell', got {stop!r}")
    import jupytext

    os.environ.setdefault("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__main__"}
    cells = [c.source for c in jupytext.read(chapter).cells if c.cell_type == "code"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for source in cells:
            last = marker in source
            if last and stop == "in_cell":
                source = source.split(marker)[0]
            exec(compile(source, str(chapter), "exec"), namespace)
            if last:
                break
        else:
            raise RuntimeError(f"no code cell containing {marker!r} in {chapter}")
    if cpu_only and namespace["device"].type != "cpu":
        raise SystemExit("run this on the CPU (the stored result is the CPU experiment)")
    return namespace


def cpu_machine() -> str:
    """What a stored CPU run records as its machine: one thread, the cores, torch and Python."""
    import torch

    return (f"cpu, 1 thread; {os.cpu_count()} CPU cores ({platform.machine()}); "
            f"torch {torch.__version__}; Python {platform.python_version()}")


def write_report(path: Path, report: dict) -> None:
    """Write ``report`` as indented JSON to ``path`` and say so."""
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
