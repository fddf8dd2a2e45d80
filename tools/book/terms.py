"""Glossary terms in a page's prose: where each first occurs, and whether that first use is linked.

    python tools/book/terms.py --link chapters/01-attention.md   # link each term at its first use
    python tools/book/terms.py chapters/01-attention.md          # list the terms not linked there

Prose is the page's text outside code cells and code blocks, maths, inline code, roles, link
targets, headings, directive options and admonition titles. A term *occurs* where one of its
forms does, as a whole word and not inside a hyphenated or slashed word (so "attention" does not
occur in "self-attention", nor "key" in "key/value"): its English term, the parts of a term written "A, B" or "A / B", and their
plurals ("s" or "es"), matched without regard to case. Longer forms win where forms overlap
("multi-head attention" before "attention"). The first use is *linked* when it is a
``{term}`text <Term>``` role (or ``{term}`text```) naming that term.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glossary import ROOT, load, terms  # noqa: E402

_SKIP_INLINE = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$|``[^`]+``|`[^`]+`|\]\([^)]*\)|<[^>\n]+>|https?://\S+")
_ROLE = re.compile(r"\{([a-z:]+)\}`([^`]*)`")


@dataclass
class Use:
    term: str  # the glossary term (its `en`)
    start: int  # offset in the page's text
    end: int
    linked: bool


def forms(term: dict) -> list[str]:
    """The lower-case forms a term is found by (see the module docstring)."""
    base = [term["en"]] + re.split(r",\s+|\s+/\s+", term["en"])
    explicit = term.get("forms", [])
    out = {f.lower() for f in base + explicit if len(f) >= 3}
    return sorted(out | {f + "s" for f in out} | {f + "es" for f in out if f.endswith(("s", "x", "h"))},
                  key=len, reverse=True)


def prose_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the prose lines' text, with the inline parts that are not prose
    blanked out by the caller (see :func:`mask`)."""
    spans, offset, fence, front = [], 0, None, text.startswith("---\n")
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines):
        stripped = line.strip()
        start, offset = offset, offset + len(line)
        if front:
            if number > 0 and stripped == "---":
                front = False
            continue
        if fence:
            if stripped.startswith(fence) and stripped.strip("`:~") == "":
                fence = None
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if stripped == "$$" or (stripped.startswith("$$") and not stripped.endswith("$$")):
            fence = "$$"
            continue
        if stripped.startswith(("#", ":::", "%", "<!--")) or re.match(r"^:[a-z-]+:", stripped):
            continue
        spans.append((start, offset))
    return spans


def mask(text: str) -> str:
    """``text`` with everything that is not prose replaced by spaces (offsets are kept), and
    roles other than {term} blanked too."""
    keep = [" "] * len(text)
    for start, end in prose_spans(text):
        keep[start:end] = text[start:end]
    masked = "".join(keep)
    term_roles = [m.span() for m in _ROLE.finditer(masked) if m.group(1) == "term"]
    masked = _ROLE.sub(lambda m: m.group(0) if m.group(1) == "term" else " " * len(m.group(0)), masked)
    blanked = _SKIP_INLINE.sub(lambda m: " " * len(m.group(0)), masked)
    for start, end in term_roles:  # a {term} role's backticks are not inline code
        blanked = blanked[:start] + masked[start:end] + blanked[end:]
    return blanked


def first_uses(text: str, glossary: list[dict] | None = None) -> list[Use]:
    """Each glossary term's first use in the page's prose, in the order of the glossary."""
    glossary = terms(load()) if glossary is None else glossary
    masked = mask(text)
    roles = [(m.start(), m.end(), m.group(2)) for m in _ROLE.finditer(masked) if m.group(1) == "term"]
    role_free = _ROLE.sub(lambda m: " " * len(m.group(0)), masked)
    by_form = sorted(((f, t) for t in glossary for f in forms(t)), key=lambda ft: -len(ft[0]))
    taken = [False] * len(text)
    found: dict[str, Use] = {}
    for form, term in by_form:  # longer forms first, so that they claim their words
        pattern = re.compile(r"(?<![\w/-])" + re.escape(form) + r"(?![\w/-])", re.IGNORECASE)
        for m in pattern.finditer(role_free):
            if any(taken[m.start():m.end()]):
                continue
            taken[m.start():m.end()] = [True] * (m.end() - m.start())
            use = found.get(term["en"])
            if use is None or m.start() < use.start:
                found[term["en"]] = Use(term["en"], m.start(), m.end(), False)
    for start, end, body in roles:
        target = (body.rsplit("<", 1)[1].rstrip(">") if body.endswith(">") else body).strip().lower()
        for term in glossary:
            if term["en"].lower() == target or target in forms(term):
                use = found.get(term["en"])
                if use is None or start < use.start:
                    found[term["en"]] = Use(term["en"], start, end, True)
    return [found[t["en"]] for t in glossary if t["en"] in found]


def link(text: str, glossary: list[dict] | None = None) -> str:
    """``text`` with each term's first use, where not linked, made a {term} role."""
    for use in sorted((u for u in first_uses(text, glossary) if not u.linked), key=lambda u: -u.start):
        words = text[use.start:use.end]
        text = text[:use.start] + f"{{term}}`{words} <{use.term}>`" + text[use.end:]
    return text


def main(argv: list[str]) -> int:
    do_link = "--link" in argv
    problems = 0
    for name in (a for a in argv if a != "--link"):
        path = ROOT / name if not Path(name).is_absolute() else Path(name)
        text = path.read_text(encoding="utf-8")
        if do_link:
            path.write_text(link(text), encoding="utf-8")
            text = path.read_text(encoding="utf-8")
        missing = [u for u in first_uses(text) if not u.linked]
        problems += len(missing)
        for use in missing:
            line = text.count("\n", 0, use.start) + 1
            print(f"{name}:{line}: first use of {use.term!r} is not linked: {text[use.start:use.end]!r}")
    return 1 if problems and not do_link else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
