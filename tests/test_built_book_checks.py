"""The checks CI runs on the built book (tools/book/check_built_book.py) catch what they are for."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "book"))
import check_built_book as check  # noqa: E402

sys.path.pop(0)

GOOD_PAGE = ('<script src="../_static/mathjax/tex-chtml.js?v=1"></script>'
             '<a href="https://colab.research.google.com/github/o/r/blob/main/chapters/01-x.ipynb">Colab</a>'
             '<link rel="stylesheet" href="../_static/styles/theme.css">'
             + '<img alt="" src="../_images/fig{}.png" />' * 3)


def book(tmp_path: Path, page: str) -> tuple[Path, list[Path]]:
    html = tmp_path / "html"
    (html / "chapters").mkdir(parents=True)
    (html / "_static" / "mathjax").mkdir(parents=True)
    (html / "_static" / "mathjax" / "tex-chtml.js").write_text("// MathJax")
    (html / "chapters" / "01-x.html").write_text(page)
    return html, [Path("chapters/01-x.md")]


def test_a_self_contained_page_passes(tmp_path):
    assert check.problems(*book(tmp_path, GOOD_PAGE)) == []


def test_a_script_from_a_cdn_is_caught(tmp_path):
    page = GOOD_PAGE + '<script defer="defer" src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
    assert check.problems(*book(tmp_path, page)) == [
        "chapters/01-x.html loads https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js from another host"]


def test_a_protocol_relative_script_and_a_remote_style_sheet_are_caught(tmp_path):
    page = GOOD_PAGE + ('<script src="//cdnjs.cloudflare.com/require.min.js"></script>'
                        '<link href="https://fonts.example.com/a.css" rel="stylesheet">')
    found = check.problems(*book(tmp_path, page))
    assert len(found) == 2 and all("from another host" in line for line in found)


def test_missing_mathjax_figures_and_colab_link_are_caught(tmp_path):
    html, chapters = book(tmp_path, '<img src="../_images/a.png">')
    (html / "_static" / "mathjax" / "tex-chtml.js").unlink()
    found = check.problems(html, chapters)
    assert any("vendor_mathjax" in line for line in found)
    assert any("no Colab link" in line for line in found)
    assert any("only 1 executed figures" in line for line in found)
