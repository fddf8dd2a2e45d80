"""Check the built HTML book (``_build/html``) as a reader would meet it; CI runs this after the build.

* every chapter page exists, and its Colab button opens the chapter's ``.ipynb``;
* every chapter page shows at least ``MIN_FIGURES`` executed figures;
* the same for the Chinese edition (``_build/html/zh_CN``), and its gates T6-T9
  (``tools/book/check_zh_edition.py``);
* no page loads a script or a style sheet from another host (MathJax included: it is served
  from ``_static/mathjax``, see ``tools/book/vendor_mathjax.py``), so the book works offline.

    python tools/book/check_built_book.py [_build/html]     # prints the problems; exit 1 if any
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
import check_zh_edition  # noqa: E402
MIN_FIGURES = 3
SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)
STYLESHEET = re.compile(r"<link\b[^>]*\brel=[\"']stylesheet[\"'][^>]*>", re.I)
HREF = re.compile(r"\bhref=[\"']([^\"']+)[\"']", re.I)
FIGURE = re.compile(r"<img[^>]*src=\"[^\"]*_images/[^\"]*\.png\"")


def is_remote(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url.strip(), re.I))


def remote_loads(html: str) -> list[str]:
    """The scripts and style sheets a page would fetch from another host."""
    urls = [u for u in SCRIPT.findall(html) if is_remote(u)]
    for tag in STYLESHEET.findall(html):
        urls += [u for u in HREF.findall(tag) if is_remote(u)]
    return urls


def problems(html_dir: Path, chapters: list[Path]) -> list[str]:
    found = []
    if not (html_dir / "_static" / "mathjax" / "tex-chtml.js").exists():
        found.append("_static/mathjax/tex-chtml.js is missing: run python tools/book/vendor_mathjax.py before building")
    for page in sorted(html_dir.rglob("*.html")):
        for url in remote_loads(page.read_text(encoding="utf-8", errors="replace")):
            found.append(f"{page.relative_to(html_dir)} loads {url} from another host")
    for md in chapters:
        page = html_dir / "chapters" / f"{md.stem}.html"
        if not page.exists():
            found.append(f"missing {page.relative_to(html_dir)}")
            continue
        html = page.read_text(encoding="utf-8")
        if not re.search(rf"colab\.research\.google\.com/github/.*/chapters/{re.escape(md.stem)}\.ipynb", html):
            found.append(f"no Colab link to chapters/{md.stem}.ipynb in {page.name}")
        figures = len(FIGURE.findall(html))
        if figures < MIN_FIGURES:
            found.append(f"only {figures} executed figures in {page.name} (at least {MIN_FIGURES})")
    return found


def main(argv: list[str]) -> int:
    html_dir = Path(argv[0]) if argv else ROOT / "_build" / "html"
    chapters = sorted((ROOT / "chapters").glob("*.md"))
    found = problems(html_dir, chapters)
    # the Chinese edition: the same chapter checks, then its own gates (T6-T9)
    found += [f"zh_CN: {p}" for p in problems(html_dir / "zh_CN", chapters)]
    found += check_zh_edition.problems(html_dir)
    for line in found:
        print(line)
    pages = len(list(html_dir.rglob("*.html")))
    print(f"{pages} pages checked: {'OK' if not found else f'{len(found)} problems'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
