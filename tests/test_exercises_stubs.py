"""Every checker of every chapter reports an unfinished exercise as "not attempted yet".

The checkers are found from each ``tfm_course.exercises.chNN.__all__``, so a new checker is
covered without a new test.
"""

import importlib
import pkgutil

import pytest

import tfm_course.exercises as exercises
from checker_helpers import stub, verdict

CHECKERS = [
    getattr(module, name)
    for info in pkgutil.iter_modules(exercises.__path__) if info.name.startswith("ch")
    for module in [importlib.import_module(f"tfm_course.exercises.{info.name}")]
    for name in module.__all__ if name.startswith("check_")
]


def test_every_chapter_has_checkers():
    from pathlib import Path

    with_checkers = {c.__module__.rsplit(".", 1)[-1] for c in CHECKERS}
    chapters = {f"ch{p.name[:2]}" for p in (Path(__file__).resolve().parent.parent / "chapters").glob("[0-9][0-9]-*.md")}
    assert chapters <= with_checkers, f"chapters without checkers: {sorted(chapters - with_checkers)}"


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_a_stub_is_reported_as_not_attempted(checker, capsys):
    ok, out = verdict(checker, stub, capsys)
    assert ok is False and "not attempted yet" in out, out
