"""tools/runs/_chapter.py: a stored-run tool runs its chapter's code cells up to a marker."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("_chapter", ROOT / "tools" / "runs" / "_chapter.py")
_chapter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_chapter)

PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A page

```{code-cell} ipython3
steps = [1]
print("setup")
```

Prose with `marker = 2` in it, which is not code.

```{code-cell} ipython3
def train():
    return "trained"
marker = 2
steps.append(marker)
```

```{code-cell} ipython3
steps.append(3)
```
"""


@pytest.fixture
def page(tmp_path):
    path = tmp_path / "01-page.md"
    path.write_text(PAGE)
    return path


def test_after_cell_runs_the_whole_cell_with_the_marker_and_stops(page, capsys):
    ns = _chapter.chapter_namespace(page, "marker = 2")
    assert ns["steps"] == [1, 2] and ns["train"]() == "trained"
    assert capsys.readouterr().out == ""  # the cells' printing is silenced


def test_in_cell_stops_before_the_marker_inside_its_cell(page):
    ns = _chapter.chapter_namespace(page, "marker = 2", stop="in_cell")
    assert ns["steps"] == [1] and "train" in ns and "marker" not in ns


def test_a_missing_marker_or_a_bad_stop_is_an_error(page):
    with pytest.raises(RuntimeError, match="no code cell containing 'nowhere'"):
        _chapter.chapter_namespace(page, "nowhere")
    with pytest.raises(ValueError, match="'in_cell' or 'after_cell', got 'before'"):
        _chapter.chapter_namespace(page, "marker = 2", stop="before")


@pytest.mark.parametrize("tool, chapter_name, marker", [("sweep_gpt_seeds", "08-gpt.md", "LAST_CELL")])
def test_the_sweeps_markers_are_in_their_chapters_code(tool, chapter_name, marker):
    import jupytext

    spec = importlib.util.spec_from_file_location(tool, ROOT / "tools" / "runs" / f"{tool}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CHAPTER == ROOT / "chapters" / chapter_name
    code = [c.source for c in jupytext.read(module.CHAPTER).cells if c.cell_type == "code"]
    assert sum(getattr(module, marker) in source for source in code) == 1


def test_cpu_only_refuses_a_page_that_picked_another_device(tmp_path):
    path = tmp_path / "02-gpu.md"
    path.write_text(PAGE.replace("steps = [1]", "import types\ndevice = types.SimpleNamespace(type='cuda')\n"
                                 "steps = [1]"))
    with pytest.raises(SystemExit, match="run this on the CPU"):
        _chapter.chapter_namespace(path, "marker = 2", cpu_only=True)
    cpu = tmp_path / "03-cpu.md"
    cpu.write_text(PAGE.replace("steps = [1]", "import torch\ndevice = torch.device('cpu')\nsteps = [1]"))
    assert _chapter.chapter_namespace(cpu, "marker = 2", cpu_only=True)["steps"] == [1, 2]


def test_the_report_is_written_as_json_and_names_the_machine(tmp_path, capsys):
    import json

    out = tmp_path / "run.json"
    _chapter.write_report(out, {"machine": _chapter.cpu_machine(), "records": [1]})
    report = json.loads(out.read_text())
    assert report["records"] == [1] and report["machine"].startswith("cpu, 1 thread;")
    assert "torch" in report["machine"] and f"wrote {out}" in capsys.readouterr().out
