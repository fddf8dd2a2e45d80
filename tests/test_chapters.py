"""Static checks on the chapter sources: front matter, the shared setup cell, Colab copies, the TOC."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jupytext
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"]

# The first code cell of every chapter, word for word (the URL comes from _config.yml).
SETUP_CELL = '''\
# Setup (the same in every chapter): on Colab, install tfm_course; everywhere, seed and pick the device.
import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "tfm_course @ git+{url}"], check=True)

from tfm_course.device import describe, get_device, seed_everything

device = get_device()
seed_everything(0)
print("running on", describe(device))'''


def _code_cells(path: Path) -> list:
    return [c for c in jupytext.read(path).cells if c.cell_type == "code"]


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/*.md found"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_is_a_jupytext_notebook(path: Path):
    head = path.read_text(encoding="utf-8")[:2000]
    assert head.startswith("---\n") and "kernelspec:" in head and "format_name: myst" in head
    assert re.match(r"\d\d-[a-z0-9-]+\.md$", path.name), "chapters are named NN-slug.md"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_setup_cell_installs_from_configured_repository(path: Path):
    first = _code_cells(path)[0]
    assert first.source.strip() == SETUP_CELL.format(url=REPO_URL), (
        f"{path.name}: the first code cell must be the shared setup cell (see tests/test_chapters.py)"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_checked_exercises_and_citations(path: Path):
    text = path.read_text(encoding="utf-8")
    assert len(set(re.findall(r"\bch\d\d\.check_\w+\(", text))) >= 3, "at least 3 auto-checked exercises"
    assert "{footcite" in text, "cite the papers the chapter relies on (footcite: one list per chapter)"
    assert "{cite" not in text, "use {footcite}: a {cite} would need a global bibliography"
    assert "```{footbibliography}" in text, "end with the chapter's own references"
    assert "glue(" in text, "numbers in prose are glued from executed code"
    assert ":class: dropdown" in text, "solutions sit in collapsed dropdowns"


def test_every_chapter_is_in_the_toc_and_vice_versa():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*(chapters/[\w-]+)", toc))
    assert listed == {f"chapters/{p.stem}" for p in CHAPTERS}
    for page in re.findall(r"file:\s*(book/[\w-]+)", toc):
        assert (ROOT / f"{page}.md").exists(), page


def test_colab_notebooks_are_in_sync():
    sys.path.insert(0, str(ROOT / "tools" / "book"))
    try:
        from colab_notebooks import stale_notebooks
    finally:
        sys.path.pop(0)
    stale = stale_notebooks()
    assert not stale, f"regenerate with `python tools/book/colab_notebooks.py`: {stale}"


def test_colab_notebooks_have_no_outputs():
    import json

    for path in (ROOT / "chapters").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), path.name


def test_nbval_collects_the_colab_copies_and_not_the_md_sources():
    """`pytest --nbval` executes what a Colab reader opens: the generated .ipynb copies."""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--collect-only", "-q", "-p", "no:xdist", "chapters"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    lines = result.stdout.splitlines()
    for path in CHAPTERS:
        n_code = len(_code_cells(path))
        copy = path.with_suffix(".ipynb").name
        assert sum(line.startswith(f"chapters/{copy}::Cell ") for line in lines) == n_code, path.name
    assert not any(".md::" in line for line in lines)


def _expected_outputs():
    sys.path.insert(0, str(ROOT / "tools" / "book"))
    try:
        import expected_outputs
    finally:
        sys.path.pop(0)
    return expected_outputs


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_cells_marked_check_output_have_a_current_record(path):
    eo = _expected_outputs()
    marked = {eo.cell_key(c.source) for c in _code_cells(path) if eo.is_marked(c)}
    recorded = set(eo.load(path))
    assert marked, f"{path.name}: mark at least one deterministic key-result cell # NBVAL_CHECK_OUTPUT"
    assert marked == recorded, (
        f"{path.name}: {len(marked - recorded)} marked cell(s) without a record, "
        f"{len(recorded - marked)} stale record(s): run `python tools/book/expected_outputs.py {path.relative_to(ROOT)}` "
        "and review the diff")
    for key, record in eo.load(path).items():
        assert record["outputs"], f"{path.name}: the marked cell {record['source'][1:]} prints nothing to compare"
        shown = [out.get("data", {}).get("text/plain", "") for out in record["outputs"]]
        assert not any(text.startswith("<Figure") for text in shown), (
            f"{path.name}: the marked cell {record['source'][1:]} draws a figure; whether a figure "
            "is displayed depends on the matplotlib backend, so move the plot to its own cell")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_cells_marked_check_output_do_not_glue(path):
    """Outside a book build glue() prints `name = value`, which would change a checked output."""
    eo = _expected_outputs()
    for cell in _code_cells(path):
        if eo.is_marked(cell):
            assert "glue(" not in cell.source, (
                f"{path.name}: move the glue() calls out of the marked cell {cell.source.splitlines()[1:2]}")


def test_nbval_compares_a_marked_cell_and_catches_a_changed_output(tmp_path):
    """A marked cell whose recorded output no longer matches fails under `pytest --nbval`."""
    import json
    import subprocess

    eo = _expected_outputs()
    chapter = tmp_path / "chapters" / "01-demo.md"
    chapter.parent.mkdir()
    chapter.write_text(CHAPTERS[0].read_text().split("```{code-cell}")[0]  # the front matter
                       + "```{code-cell} ipython3\n# NBVAL_CHECK_OUTPUT\nprint(6 * 7)\n```\n")
    jupytext.write(jupytext.read(chapter), chapter.with_suffix(".ipynb"))  # its "Colab copy"
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "tools" / "book").mkdir(parents=True)
    (tmp_path / "tools" / "book" / "expected_outputs.py").write_text(
        (ROOT / "tools" / "book" / "expected_outputs.py").read_text())
    key = eo.cell_key("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)")
    records = tmp_path / "tests" / "expected_outputs"
    records.mkdir(parents=True)

    def run_with(text):
        out = {"output_type": "stream", "name": "stdout", "text": text}
        (records / "01-demo.json").write_text(json.dumps({key: {"source": [], "outputs": [out]}}))
        return subprocess.run([sys.executable, "-m", "pytest", "--nbval", "-q", "-p", "no:xdist",
                               "-p", "no:cacheprovider", "chapters"],
                              cwd=tmp_path, capture_output=True, text=True)

    assert run_with("42\n").returncode == 0
    wrong = run_with("43\n")
    assert wrong.returncode != 0 and "Cell outputs differ" in wrong.stdout, wrong.stdout[-2000:]


def test_glossary_entries_sit_inside_the_glossary_block():
    """Entries appended after the closing fence would show as plain paragraphs, not glossary terms."""
    lines = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8").rstrip().splitlines()
    fences = [i for i, line in enumerate(lines) if line.startswith("```")]
    assert len(fences) == 2 and lines[fences[0]] == "```{glossary}" and fences[1] == len(lines) - 1, (
        "book/glossary.md: one ```{glossary} block, closed on the last line; add new terms before it")


def test_glossary_terms_are_unique():
    """Sphinx warns about a term defined twice (an error under -W): chapters add terms independently."""
    lines = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("```{glossary}")
    terms = [line.strip() for line in lines[start + 1:-1] if line.strip() and not line.startswith((" ", "\t"))]
    twice = sorted({term for term in terms if terms.count(term) > 1})
    assert not twice, f"book/glossary.md defines these terms more than once: {twice}"
