"""Generate the Colab copies of the chapters: ``chapters/NN-slug.md`` -> ``chapters/NN-slug.ipynb``.

The ``.md`` files are the sources; the ``.ipynb`` files (no outputs) exist so that the book's
"Open in Colab" button has a notebook to open. Never edit them by hand; regenerate with

    python tools/colab_notebooks.py          # write
    python tools/colab_notebooks.py --check  # exit 1 if any copy is stale (tests/test_chapters.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"


def render(md_path: Path) -> str:
    """The ``.ipynb`` text that belongs to one ``.md`` chapter (paired through jupytext metadata)."""
    notebook = jupytext.read(md_path)
    notebook.metadata.setdefault("jupytext", {})["formats"] = "ipynb,md:myst"
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
            print(f"stale: {path.relative_to(ROOT)} (run: python tools/colab_notebooks.py)")
        return 1 if stale else 0
    for md_path in sorted(CHAPTERS.glob("*.md")):
        md_path.with_suffix(".ipynb").write_text(render(md_path), encoding="utf-8")
        print(f"wrote {md_path.with_suffix('.ipynb').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
