"""The zh_CN edition's gates on the built pages (../shared/specs/zh-edition.md, T6-T9); CI runs
them after ``tools/book/editions.py build`` (``check_built_book.py`` calls ``problems``).

T6 no silent English: in a complete page, every article paragraph holds Chinese (or only maths,
   code, numbers, a name of two words at most, or links to other pages, which show their titles).
T7 same execution: every page's code cells (input and output) are byte-identical between the
   editions, and so are the figure files.
T8 banner: exactly the pages not listed in complete.txt carry the "not yet translated" notice.
T9 interface: the page says it is zh-CN, the theme's strings read as mainland Chinese, and the
   search index holds Chinese words.

    python tools/book/check_zh_edition.py [_build/html]
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from zh_gates import CJK, complete_pages  # noqa: E402

SKIP_CLASSES = {"cell", "lang-switch", "footnote", "footnote-list", "bibliography", "zh-banner", "math",
                "highlight", "docutils-literal"}
VOID = {"br", "img", "hr", "input", "meta", "link", "wbr", "source", "col", "area", "base", "embed"}
TAIWANESE = ("列印", "程式", "預設", "資訊", "檔案")


class _Page(HTMLParser):
    """Collects the code cells' HTML and the article's paragraphs (text outside skipped containers)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, set[str]]] = []
        self.cells: list[str] = []
        self._cell: list[str] | None = None
        self._cell_depth = 0
        self.paragraphs: list[str] = []
        self._text: list[list[str]] = []
        self.in_article = 0
        self.banners = 0

    def _skipped(self) -> bool:
        # a link to another page shows that page's title: its translation is that page's business
        return any(classes & SKIP_CLASSES or tag in ("pre", "code", "aside", "nav", "dt")
                   or (tag == "a" and "internal" in classes) for tag, classes in self.stack)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        raw = self.get_starttag_text()
        if self._cell is not None:
            self._cell.append(raw)
        elif tag == "div" and classes & {"cell_input", "cell_output"}:
            self._cell, self._cell_depth = [raw], len(self.stack) + 1
        if "zh-banner" in classes:
            self.banners += 1
        if tag in VOID:
            return
        self.stack.append((tag, classes))
        if tag == "article":
            self.in_article += 1
        if tag == "p" and self.in_article and not self._skipped():
            self._text.append([])

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self._cell is not None:
            self._cell.append(f"</{tag}>")
        while self.stack:
            top, _ = self.stack.pop()
            if top == "p" and self._text and self.in_article and not self._skipped():
                self.paragraphs.append("".join(self._text.pop()).strip())
            if top == "article":
                self.in_article -= 1
            if top == tag:
                break
        if self._cell is not None and len(self.stack) < self._cell_depth:
            self.cells.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._text and not self._skipped():
            self._text[-1].append(data)


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text("utf8"))
    return page


def silent_english(paragraph: str) -> bool:
    """T6: a paragraph with no Chinese and three or more English words (fewer: a name or a symbol,
    such as a table cell "logits"; maths, code and links to other pages are left out before)."""
    return not re.search(f"[{CJK}]", paragraph) and len(re.findall(r"[A-Za-z]{2,}", paragraph)) >= 3


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problems(html_dir: Path, srcdir: Path = ROOT) -> list[str]:
    zh_dir = html_dir / "zh_CN"
    if not zh_dir.exists():
        return [f"no Chinese edition at {zh_dir} (build with tools/book/editions.py build)"]
    found = []
    complete = complete_pages(srcdir / "locales" / "zh_CN")
    docs = sorted(p.relative_to(html_dir).with_suffix("").as_posix() for d in ("book", "chapters")
                  for p in (html_dir / d).glob("*.html"))
    for doc in docs:
        en_path, zh_path = html_dir / f"{doc}.html", zh_dir / f"{doc}.html"
        if not zh_path.exists():
            found.append(f"zh_CN/{doc}.html is missing")
            continue
        en, zh = parse(en_path), parse(zh_path)
        if en.cells != zh.cells:  # T7
            differ = sum(a != b for a, b in zip(en.cells, zh.cells)) + abs(len(en.cells) - len(zh.cells))
            found.append(f"{doc}: {differ} of {len(en.cells)} code cells differ between the editions")
        if en.banners:
            found.append(f"{doc}: the English edition shows the translation banner")
        want = 0 if doc in complete else 1  # T8
        if zh.banners != want:
            found.append(f"zh_CN/{doc}: {zh.banners} translation banners, expected {want}")
        if doc in complete:  # T6
            for p in zh.paragraphs:
                if silent_english(p):
                    found.append(f"zh_CN/{doc}: an English paragraph in a complete page: {p[:70]!r}")
        html = zh_path.read_text("utf8")  # T9
        if 'lang="zh-CN"' not in html:
            found.append(f"zh_CN/{doc}: <html> does not say lang=\"zh-CN\"")
        for word in TAIWANESE:
            if word in html:
                found.append(f"zh_CN/{doc}: Taiwanese wording {word!r} in the interface")
        if "打印为 PDF" not in html or "搜索本书" not in html:
            found.append(f"zh_CN/{doc}: the interface strings are not the mainland ones")
        if 'hreflang="en"' not in html or 'hreflang="zh-CN"' not in en_path.read_text("utf8"):
            found.append(f"{doc}: no language switch between the editions")
    en_images = {p.name: _digest(p) for p in (html_dir / "_images").glob("*")}
    zh_images = {p.name: _digest(p) for p in (zh_dir / "_images").glob("*")}
    if en_images != zh_images:  # T7: the same figure files
        found.append(f"the editions' figures differ: {len(set(en_images.items()) ^ set(zh_images.items()))} files")
    index = zh_dir / "searchindex.js"
    terms = json.loads(index.read_text("utf8")[len("Search.setIndex("):-1])["terms"] if index.exists() else {}
    if "注意力" not in terms:  # jieba segments the Chinese text; without it no Chinese word is indexed
        found.append("the Chinese search index has no Chinese words (is jieba installed?)")
    return found


def main(argv: list[str]) -> int:
    html_dir = Path(argv[0]) if argv else ROOT / "_build" / "html"
    found = problems(html_dir)
    for line in found:
        print(line)
    print(f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
