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


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the book's ``{glue:text}`` roles (myst-nb), or, where the
    book's tools are absent, print ``name = value`` (``display=True`` shows the value instead)."""
    if _myst_glue is not None:
        _myst_glue(name, value, display=display)
    elif display:
        from IPython.display import display as show

        show(value)
    else:
        print(f"{name} = {shown(value)}")
