"""Shared helpers of the exercise-checker tests (tests/test_exercises_chNN.py)."""

from __future__ import annotations

from typing import Callable


def verdict(checker: Callable, fn: Callable, capsys) -> tuple[bool, str]:
    """Run ``checker(fn)``; return its verdict and what it printed."""
    result = checker(fn)
    return result, capsys.readouterr().out


def stub(*args, **kwargs):
    """A learner's unfinished exercise."""
    raise NotImplementedError


def rejects(checker: Callable, fn: Callable, message: str, capsys) -> None:
    """Assert that ``checker`` rejects ``fn`` and says ``message`` while doing so."""
    ok, out = verdict(checker, fn, capsys)
    assert not ok
    assert "❌" in out and message in out, out
