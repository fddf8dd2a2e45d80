"""Generate the Colab copies of the chapters: ``chapters/NN-slug.md`` -> ``chapters/NN-slug.ipynb``.

The ``.md`` files are the sources; the ``.ipynb`` files (no outputs) exist so that the book's
"Open in Colab" button has a notebook to open, and they are what the tests execute. Their prose is
plain Markdown (``tools/book/myst_to_markdown.py`` rewrites the MyST roles and directives), and a first
note links the book's page and explains the names of computed numbers. Never edit them by hand;
regenerate with

    python tools/book/colab_notebooks.py          # write them all
    python tools/book/colab_notebooks.py chapters/03-multi-head-attention.md   # write one
    python tools/book/colab_notebooks.py --check  # exit 1 if any copy is stale (tests/test_chapters.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from myst_to_markdown import book_url, to_markdown  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"


def colab_note(md_path: Path, glued: bool) -> str:
    """The note that opens every Colab copy: where the book page is, and what `names` stand for."""
    page = f"{book_url()}chapters/{md_path.stem}.html"
    note = [f"> **This is the Colab notebook of a chapter of tfm-course.** The book shows it with "
            f"its figures and outputs at <{page}>.",
            "> Choose *Runtime → Change runtime type → GPU* to get the larger experiments; on a CPU "
            "runtime every cell still runs."]
    if glued:
        note.append("> Names in code font in the text, such as `name`, stand for numbers that this "
                    "notebook computes: the cell that computes one prints `name = value`, and the "
                    "book shows the value in place.")
    return "\n>\n".join(note)


def render(md_path: Path) -> str:
    """The ``.ipynb`` text that belongs to one ``.md`` chapter (paired through jupytext metadata)."""
    notebook = jupytext.read(md_path)
    cited: list[str] = []
    glued = False
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            glued = glued or "{glue" in cell.source
            cell.source = to_markdown(cell.source, md_path, cited)
    title, _, rest = notebook.cells[0].source.partition("\n")  # the chapter's "# Title" line
    notebook.cells[0].source = f"{title}\n\n{colab_note(md_path, glued)}\n{rest}"
    # not paired with the .md: the copy's prose is converted, so syncing back would overwrite the source
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["accelerator"] = "GPU"  # Colab: open on a GPU runtime
    notebook.metadata.setdefault("colab", {})["provenance"] = []
    for number, cell in enumerate(notebook.cells):
        cell.id = f"cell-{number:03d}"  # stable ids keep the generated file reproducible
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return jupytext.writes(notebook, fmt="ipynb")


def stale_notebooks() -> list[Path]:
    """The ``.ipynb`` copies that are missing or differ from what their ``.md`` renders to."""
    stale = []
    for md_path in sorted(CHAPTERS.glob("*.md")):
        ipynb = md_path.with_suffix(".ipynb")
        if not ipynb.exists() or ipynb.read_text(encoding="utf-8") != render(md_path):
            stale.append(ipynb)
    orphans = [p for p in CHAPTERS.glob("*.ipynb") if not p.with_suffix(".md").exists()]
    return stale + orphans


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_notebooks()
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: python tools/book/colab_notebooks.py)")
        return 1 if stale else 0
    chosen = [Path(a).resolve().with_suffix(".md") for a in argv]  # e.g. chapters/03-multi-head-attention.md
    for md_path in chosen or sorted(CHAPTERS.glob("*.md")):
        md_path.with_suffix(".ipynb").write_text(render(md_path), encoding="utf-8")
        print(f"wrote {md_path.with_suffix('.ipynb').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
