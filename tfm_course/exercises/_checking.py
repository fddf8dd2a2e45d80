"""Shared machinery of the exercise checkers: call safely, compare tensors, report in words."""

from __future__ import annotations

import traceback
from typing import Any, Callable

import torch


class NotAttempted(Exception):
    """The function under test raised NotImplementedError."""


class Failed(Exception):
    """A check failed; the message says why, in words."""


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's ``fn``; turn its exceptions into :class:`NotAttempted` / :class:`Failed`."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted() from None
    except Exception as error:  # the learner's bug, reported in words
        where = traceback.extract_tb(error.__traceback__)[-1]
        raise Failed(
            f"your function raised {type(error).__name__}: {error} "
            f"(line {where.lineno}: {where.line})"
        ) from None


def expect_tensor(got: Any, want: torch.Tensor, what: str = "the output") -> torch.Tensor:
    """Fail unless ``got`` is a tensor with ``want``'s shape (dtype is checked by the caller if it matters)."""
    if not isinstance(got, torch.Tensor):
        raise Failed(f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise Failed(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    return got


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute difference, computed in fp64 on the CPU; NaN counts as infinite."""
    diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs()
    return float("inf") if torch.isnan(diff).any() else float(diff.max()) if diff.numel() else 0.0


def close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """``torch.allclose`` in fp64 on the CPU (NaN never matches)."""
    return bool(torch.allclose(got.detach().double().cpu(), want.detach().double().cpu(), atol=atol, rtol=rtol))


def seeded(seed: int = 0) -> torch.Generator:
    """A CPU generator with this seed: every checker draws its test inputs from one."""
    return torch.Generator().manual_seed(seed)


Mistakes = list[tuple[Callable[[], torch.Tensor], str]]


def compare_with_mistakes(got: Any, want: torch.Tensor, mistakes: Mistakes, what: str,
                          atol: float = 1e-5) -> None:
    """Pass if ``got`` ≈ ``want``; otherwise name the first known mistake that ``got`` reproduces.

    ``mistakes`` pairs a function that computes a typical wrong answer with the message that
    explains it; a mistake that does not apply to these inputs (it raises) is skipped. With no
    match, the message says whether ``got`` holds inf/NaN, or how far it is from ``want``.
    """
    got = expect_tensor(got, want, what).detach().cpu()
    if close(got, want, atol=atol, rtol=atol):
        return
    for make_wrong, message in mistakes:
        try:
            wrong = make_wrong()
        except (RuntimeError, IndexError):  # a mistake that does not apply to these inputs
            continue
        if wrong.shape == got.shape and close(got, wrong, atol=atol, rtol=atol):
            raise Failed(message)
    if not bool(torch.isfinite(got.double()).all()):
        raise Failed(f"{what} contains inf or NaN")
    raise Failed(f"{what} differs from the expected values by up to {max_error(got, want):.3g}")


def run_checks(title: str, checks: list[tuple[str, Callable[[], None]]]) -> bool:
    """Run named checks in order, stop at the first problem, print a verdict; return True if all pass.

    Each check is a function that returns normally on success and raises :class:`Failed` (with a
    message in words) or :class:`NotAttempted` otherwise.
    """
    for name, check in checks:
        try:
            check()
        except NotAttempted:
            print(f"⏳ {title}: not attempted yet — replace the `raise NotImplementedError` with your code.")
            return False
        except Failed as problem:
            print(f"❌ {title} — {name}: {problem}")
            return False
    print(f"✅ {title}: all {len(checks)} checks passed.")
    return True
