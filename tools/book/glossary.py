"""Write book/glossary.md from book/glossary.toml, the glossary's data (English, Chinese, variants).

    python tools/book/glossary.py           # write book/glossary.md
    python tools/book/glossary.py --check   # exit 1 if book/glossary.md is not what the data gives

Each term becomes a Sphinx glossary term in English, so a chapter links it with
{term}`attention` (Sphinx matches terms case-insensitively); its definition starts with the
canonical Chinese rendering, then the allowed variants, then the English definition. A term whose
`keep_english` flag is set is written in Chinese text as the English term, with the Chinese as a
gloss. `terms(data)` and `load()` are what the tests use.
"""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA, PAGE = ROOT / "book" / "glossary.toml", ROOT / "book" / "glossary.md"

HEADER = """# Glossary

Many readers arrive from Chinese-language material, so each term carries its Chinese rendering:
the one 《动手学深度学习》 (d2l-zh, the most-read Chinese deep-learning book) uses where that is
standard, then the other renderings a Chinese text may use (也作). Terms marked 保留英文 keep their
English name in Chinese text, with the Chinese as a gloss. The chapters link each term at its
first use on a page. This page is generated from `book/glossary.toml` by
`tools/book/glossary.py`.

```{glossary}
"""


def load(path: Path = DATA) -> list[dict]:
    """The entries of the data file, each ``{"definition": str, "term": [{"en", "zh", ...}]}``."""
    with open(path, "rb") as f:
        entries = tomllib.load(f)["entry"]
    for entry in entries:
        if not entry.get("definition") or not entry.get("term"):
            raise ValueError(f"an entry needs a definition and at least one term, got {entry}")
        for term in entry["term"]:
            if not term.get("en") or not term.get("zh"):
                raise ValueError(f"a term needs `en` and `zh`, got {term}")
    return entries


def terms(entries: list[dict]) -> list[dict]:
    """Every term of every entry, in order."""
    return [term for entry in entries for term in entry["term"]]


def _chinese(term: dict) -> str:
    if term.get("keep_english"):
        text = f"**{term['en']}**（{term['zh']}，保留英文）"
    else:
        text = f"**{term['zh']}**"
    if term.get("allowed"):
        text += "（也作 " + "、".join(term["allowed"]) + "）"
    return text


_KEEP_TOGETHER = re.compile(r"\$[^$]+\$|`[^`]+`|\{[a-z:]+\}`[^`]+`")  # maths, code, roles


def _wrap(text: str, width: int = 100) -> str:
    """The definition indented by two spaces and wrapped, never inside maths, code or a role."""
    protected = _KEEP_TOGETHER.sub(lambda m: m.group(0).replace(" ", "\x00"), text)
    lines = textwrap.wrap(protected, width, initial_indent="  ", subsequent_indent="  ",
                          break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines).replace("\x00", " ")


def render(entries: list[dict]) -> str:
    """The whole of book/glossary.md."""
    blocks = []
    for entry in entries:
        heads = "\n".join(term["en"] for term in entry["term"])
        chinese = " / ".join(_chinese(term) for term in entry["term"])
        blocks.append(f"{heads}\n{_wrap(chinese + ' · ' + entry['definition'])}\n")
    return HEADER + "\n".join(blocks) + "```\n"


def main(argv: list[str]) -> int:
    text = render(load())
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python tools/book/glossary.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(terms(load()))} terms)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
