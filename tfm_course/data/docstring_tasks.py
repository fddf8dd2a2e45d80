"""Classification tasks made from the offline corpus, for fine-tuning pretrained encoders.

    texts, labels = class_or_function("train")          # balanced; held-out modules in "validation"
    CLASS_OR_FUNCTION_LABELS[labels[0]]                 # "function" or "class"

**Class or function?** Is a docstring the docstring of a class or of a function (or method)? The
text often tells ("Return the ...", "Create a new ..." against "A class that ...",
"Represents ..."), but not always, which makes it a small, real task for an encoder that has read
the corpus. Module docstrings are left out.

**Labels** come from the syntax tree: the kind of definition (``class`` or ``def``) that carries
the docstring, read with :mod:`ast` from the same source files as the corpus (:func:`kinds`). The
naming convention (classes in CapWords) would be a cheaper guess, but it is wrong for about one
name in thirty (``contextlib.suppress`` is a class, ``codecs.EncodedFile`` a function).

**Splits** are the corpus's: validation docstrings come from modules that no training docstring
comes from. **Balance**: class docstrings are fewer, so each split keeps all of them and the same
number of function docstrings, drawn at random (``seed``); the commonest class is then exactly half
of each split, the baseline a classifier must beat.
"""

from __future__ import annotations

import ast
import functools
import random

from . import corpus

__all__ = ["CLASS_OR_FUNCTION_LABELS", "kinds", "class_or_function"]

CLASS_OR_FUNCTION_LABELS = ("function", "class")  # label 0, label 1


@functools.lru_cache(maxsize=1)
def kinds() -> dict[tuple[str, str], str]:
    """``(module, qualified name) -> "class" | "function"`` for every definition in the standard
    library's sources (outside test suites), named as :func:`corpus.docstrings_of` names them.

    Parses every file once per process (about a second and a half on a laptop CPU).
    """
    root = corpus.stdlib_root()
    found: dict[tuple[str, str], str] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                found.setdefault((module, prefix + child.name), kind)
                visit(child, module, f"{prefix}{child.name}.")
            elif not isinstance(child, ast.expr):  # defs nested in if / try / with blocks
                visit(child, module, prefix)

    for path in corpus.source_files(root):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            continue  # the corpus skips these files too
        visit(tree, corpus.module_name(path, root), "")
    return found


def class_or_function(split: str, balance: bool = True, seed: int = 0, with_modules: bool = False
                      ) -> tuple[list[str], list[int]] | tuple[list[str], list[int], list[str]]:
    """``(texts, labels)`` of one split (``"train"`` or ``"validation"``); label 1 = class, 0 = function.
    With ``with_modules``, ``(texts, labels, modules)``: the module each docstring comes from (to
    hold out whole modules, e.g. a dev split carved from the training split).

    With ``balance`` (the default) each split holds every class docstring and as many function
    docstrings drawn at random with ``seed``; the order is shuffled with the same seed. The result
    depends only on the corpus (so on the Python version) and on ``seed``.
    """
    if split not in corpus.SPLITS:
        raise ValueError(f"split must be one of {corpus.SPLITS}, got {split!r}")
    kind_of = kinds()
    by_label: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    for doc in corpus.documents(split):
        kind = kind_of.get((doc.module, doc.name)) if doc.name else None
        if kind is not None:
            by_label[CLASS_OR_FUNCTION_LABELS.index(kind)].append((doc.text, doc.module))
    rng = random.Random(seed)
    if balance:
        n = min(len(texts) for texts in by_label.values())
        by_label = {label: rng.sample(texts, n) for label, texts in by_label.items()}
    examples = [(text, label, module) for label, found in by_label.items() for text, module in found]
    rng.shuffle(examples)
    texts, labels = [text for text, _, _ in examples], [label for _, label, _ in examples]
    return (texts, labels, [module for *_, module in examples]) if with_modules else (texts, labels)
