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
