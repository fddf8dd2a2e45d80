"""``glue(name, value)``: hand a number computed in a chapter to the prose around it.

In the built book the prose says ``{glue:text}`name:.1f``` and shows the value the code computed
(myst-nb stores it). Everywhere else (Colab, a plain Jupyter, the tests) myst-nb is not installed
and the Colab copy of the chapter shows the name, `` `name` ``, in its text; so that the reader
sees the number there too, ``glue`` prints ``name = value``.

    >>> glue("speedup", 6.81)          # book: stored for the prose; elsewhere prints speedup = 6.81

Glue numbers (and small tables or figures), not English sentences: the prose is translated, so a
verdict belongs in the prose, asserted by the code that glues the numbers it rests on.
"""

from __future__ import annotations

import numbers
from typing import Any

try:  # a book build (jupyter-book / myst-nb); never needed to run a chapter
    from myst_nb import glue as _myst_glue
except ImportError:  # Colab, Jupyter, the Colab-like CI run
    _myst_glue = None


def shown(value: Any) -> str:
    """The short text ``glue`` prints for ``value`` outside the book: floats to 4 significant digits."""
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    return str(value)


def plain(value: Any) -> Any:
    """A NumPy scalar or a one-element tensor as the Python int/float/bool it holds; else ``value``.

    myst-nb formats ``{glue:text}`name:.2f``` from the value's ``repr``, and NumPy 2 writes
    ``np.float64(0.5)``, which it cannot read back as a number (a warning, an error under ``-W``).
    """
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the book's ``{glue:text}`` roles (myst-nb), or, where the
    book's tools are absent, print ``name = value`` (``display=True`` shows the value instead).

    NumPy scalars and zero-dimensional tensors are stored as plain Python numbers (:func:`plain`)."""
    value = plain(value)
    if _myst_glue is not None:
        _myst_glue(name, value, display=display)
    elif display:
        from IPython.display import display as show

        show(value)
    else:
        print(f"{name} = {shown(value)}")
