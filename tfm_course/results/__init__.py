"""Benchmark results measured once by a tool and stored with the package, so that a chapter can
plot a run that is too long to repeat every time the book is built.

    report = load_result("bench_recall_fair_cpu")   # the JSON written by tools/runs/bench_recall.py

Each file is the tool's own output, unchanged: it names the command that produced it and the
machine it ran on, and the chapter that shows it prints both on the figure.
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["available", "load_result"]


def available() -> list[str]:
    """Names of the stored results (file names without ``.json``)."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load_result(name: str) -> dict:
    """The stored result ``name`` (e.g. ``"bench_recall_fair_cpu"``) as a dict."""
    if name not in available():
        raise ValueError(f"no stored result {name!r}; available: {available()}")
    return json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text())
