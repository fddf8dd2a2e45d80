"""The package's layout (DESIGN.md): dependencies flow one way, no import cycle, and what runs
experiments lives in tfm_course/experiments/, not beside the ideas.

The imports are read from the source (``ast``), not by importing: every ``import`` and
``from ... import`` anywhere in a module counts, including those inside functions and under
``if TYPE_CHECKING:``, with relative imports resolved against the module's package.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import tfm_course
from tfm_course._moved import MOVED

PACKAGE = Path(tfm_course.__file__).resolve().parent
# Everything that is not lab equipment or the checkers on top: none of it may reach experiments.
ON_TOP = ("tfm_course.experiments", "tfm_course.exercises", "tfm_course.distributed")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` (the module in ``path``) imports."""
    is_package = path.name == "__init__.py"
    top = name.split(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import sub` imports the module pkg.sub when there is one, else pkg
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != top:
                continue
            while target not in known and "." in target:  # `import a.b.name`: the module a.b
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# --------------------------------------------------------------------------- the checks themselves
def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_graph_resolves_relative_from_and_type_checking_imports(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .sub import b\nfrom . import c\n",
        "pkg/c.py": "import os\nfrom pkg.sub.b import thing\n",
        "pkg/sub/__init__.py": "from .b import thing\n",
        "pkg/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
                        "def f():\n    from .. import c\n",
    })
    graph = import_graph(pkg)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b", "pkg.c"}, "pkg.c": {"pkg.sub.b"},
                     "pkg.sub": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a", "pkg.c"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and {"pkg.a", "pkg.sub.b"} <= set(cycle)


def test_a_package_without_cycles_has_none(tmp_path):
    pkg = _write(tmp_path, {"pkg/__init__.py": "from . import a\n", "pkg/a.py": "from . import b\n",
                            "pkg/b.py": "import pkg.c\n", "pkg/c.py": ""})
    graph = import_graph(pkg)
    assert find_cycle(graph) is None and reachable(graph, "pkg.a") == {"pkg.b", "pkg.c"}


# --------------------------------------------------------------------------- the package
def test_tfm_course_has_no_import_cycle():
    graph = import_graph()
    assert "tfm_course.models.t5" in graph and graph["tfm_course.models.t5"]  # the parse saw it
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_below_the_experiments_imports_them():
    graph = import_graph()
    below = [m for m in graph if m != "tfm_course" and not m.startswith(ON_TOP)]
    for core in ("attention", "positional", "layers", "models.gpt", "efficient", "tokenizers", "data",
                 "decoding", "train", "device"):
        assert f"tfm_course.{core}" in below
    offenders = {m: sorted(r for r in reachable(graph, m) if r.startswith("tfm_course.experiments"))
                 for m in below}
    offenders = {m: r for m, r in offenders.items() if r}
    assert not offenders, f"core modules that reach tfm_course.experiments: {offenders}"


def test_no_experiment_harness_sits_at_the_package_root():
    root_modules = {p.stem for p in PACKAGE.glob("*.py")}
    old = {name.rsplit(".", 1)[1] for name in MOVED}
    assert old == {"bench", "efficient_bench", "recall_bench", "generation_bench", "objectives"}
    assert not root_modules & old, f"loose harnesses at tfm_course/: {sorted(root_modules & old)}"
    assert not [m for m in root_modules if "bench" in m]
    assert (PACKAGE / "experiments" / "__init__.py").is_file()


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_names_its_new_home(old):
    with pytest.raises(ModuleNotFoundError, match=f"{old} moved to tfm_course.experiments"):
        importlib.import_module(old)
    parent, leaf = old.rsplit(".", 1)
    with pytest.raises(ModuleNotFoundError, match="moved to tfm_course.experiments"):
        exec(f"from {parent} import {leaf}", {})
    for new in {w.strip("(),") for w in MOVED[old].split() if w.startswith("tfm_course.")}:
        importlib.import_module(new)  # every module the message names exists


def test_other_imports_are_untouched_by_the_finder():
    with pytest.raises(ModuleNotFoundError, match="No module named 'tfm_course.no_such_module'"):
        importlib.import_module("tfm_course.no_such_module")
    assert importlib.import_module("tfm_course.experiments.measure").time_fn


def test_every_token_mixer_lives_in_efficient_and_models_only_assemble():
    from tfm_course.models.mixers import make_mixer

    for kind, module in [("performer", "tfm_course.efficient."), ("retnet", "tfm_course.efficient."),
                         ("mamba", "tfm_course.efficient.")]:
        assert type(make_mixer(kind, 16, 2)).__module__.startswith(module), kind
