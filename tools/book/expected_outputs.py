"""Recorded outputs for the chapter cells marked ``# NBVAL_CHECK_OUTPUT``.

nbval compares a cell's new output with the output stored in the notebook, but a MyST-Markdown
chapter stores no outputs, so under ``pytest --nbval`` it only checks that cells run. For the
few deterministic cells that *show* a key result (a computed table, a parameter count, an error
message), the reviewed output is kept in ``tests/expected_outputs/NN-slug.json``, keyed by a hash
of the cell's source. The root ``conftest.py`` attaches it to the notebook nbval reads, so nbval
fails when the output changes; ``tests/test_chapters.py`` fails when a marked cell has no
current record (its source changed, or it was never recorded).

    python tools/book/expected_outputs.py                 # execute every chapter, record the outputs
    python tools/book/expected_outputs.py chapters/02-positional-encoding.md

Review the diff of the JSON before committing it: that review is what makes the record a test.
Images are not recorded (nbval skips them too); nothing here may depend on the device.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
RECORDS = ROOT / "tests" / "expected_outputs"
MARKER = "# NBVAL_CHECK_OUTPUT"
DROPPED_DATA = ("image/png", "image/jpeg", "image/svg+xml")
# myst-nb's glue() stores a value as display data under these MIME types; the prose shows it, and
# a glued float may differ in its last digits between machines, so glued data is not compared
GLUE_PREFIX = "application/papermill.record/"
GLUE_MIMES = tuple(GLUE_PREFIX + m for m in ("text/plain", "text/html", "text/markdown", "text/latex",
                                             "image/png", "image/jpeg", "image/svg+xml",
                                             "application/json"))


def is_marked(cell) -> bool:
    return cell.cell_type == "code" and any(line.strip() == MARKER for line in cell.source.splitlines())


def cell_key(source: str) -> str:
    """A short hash of the cell's source: an edited cell no longer matches its old record."""
    return hashlib.sha256(source.strip().encode()).hexdigest()[:16]


def record_path(chapter: Path) -> Path:
    return RECORDS / (Path(chapter).stem + ".json")


def load(chapter: Path) -> dict:
    path = record_path(chapter)
    return json.loads(path.read_text()) if path.exists() else {}


def attach(nb, chapter: Path):
    """Give every marked cell of ``nb`` its recorded outputs (and an execution count, so nbval
    compares them). Unmarked or unrecorded cells stay "unrun": nbval only checks that they run."""
    import nbformat

    records = load(chapter)
    for cell in nb.cells:
        if is_marked(cell) and cell_key(cell.source) in records:
            cell.outputs = [nbformat.from_dict(out) for out in records[cell_key(cell.source)]["outputs"]]
            cell.execution_count = 1
    return nb


def _clean(outputs: list) -> list:
    kept = []
    for out in outputs:
        out = {k: v for k, v in out.items() if k not in ("metadata", "execution_count")}
        if "data" in out:
            out["data"] = {k: v for k, v in out["data"].items()
                           if k not in DROPPED_DATA and not k.startswith(GLUE_PREFIX)}
            if not out["data"]:
                continue  # a figure or a glued value only
        kept.append(out)
    return kept


def record(chapter: Path) -> int:
    """Execute ``chapter`` and write the outputs of its marked cells; return how many."""
    import jupytext
    import nbclient

    nb = jupytext.read(chapter)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(CHAPTERS)}}).execute()
    records = {cell_key(c.source): {"source": c.source.splitlines()[:3], "outputs": _clean(c.outputs)}
               for c in nb.cells if is_marked(c)}
    path = record_path(chapter)
    if records:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    elif path.exists():
        path.unlink()
    return len(records)


def main(argv: list[str]) -> None:
    chapters = [Path(a) for a in argv] or sorted(CHAPTERS.glob("[0-9][0-9]-*.md"))
    for chapter in chapters:
        print(f"{chapter.name}: {record(chapter)} marked cells recorded")


if __name__ == "__main__":
    main(sys.argv[1:])
