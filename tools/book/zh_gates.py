"""The zh_CN edition's catalog gates (../shared/specs/zh-edition.md, T1-T5): what CI checks in
``locales/zh_CN/LC_MESSAGES/**.po`` so that no translated page silently falls behind or breaks.

    python tools/book/zh_gates.py                 # every catalog (T2 only for complete pages)
    python tools/book/zh_gates.py FILE.po ...     # these catalogs, every check, as if complete
    python tools/book/zh_gates.py --fresh         # also T1: the catalogs equal a fresh extraction

T1 fresh: each catalog's msgids equal a fresh gettext extraction's; no obsolete (#~) entries.
T2 complete: a page listed in complete.txt has no untranslated and no fuzzy entry.
T3 markup parity: each translation keeps its English's glue keys, citations, doc and term targets,
   maths spans, inline code spans and digits.
T4 terminology: a {term} link shows the glossary's Chinese (or an allowed variant); no banned
   rendering anywhere.
T5 CJK typography: full-width punctuation after Chinese, a space between Chinese and Latin text,
   no emphasis marker that CommonMark would print as a literal asterisk.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "locales" / "zh_CN"
CATALOGS = LOCALE / "LC_MESSAGES"
GLOSSARY = ROOT / "book" / "glossary.toml"

ROLE = re.compile(r"\{([a-z]+(?::[a-z]+)?)\}`([^`]*)`")
CODE = re.compile(r"(?<!\})`([^`]+)`")
MATH = re.compile(r"(?<![\\$])\$(?!\$)((?:\\.|[^$\\])+)\$")
DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
FULL_WIDTH = "，。；：？！（）“”‘’、《》【】…—"


# -- reading catalogs (no dependency: the Colab-like test environment has no babel) -------------

@dataclass
class Entry:
    msgid: str
    msgstr: str = ""
    fuzzy: bool = False
    obsolete: bool = False
    line: int = 0
    flags: list[str] = field(default_factory=list)


def _unquote(s: str) -> str:
    s = s.strip()
    if not (s.startswith('"') and s.endswith('"')):
        raise ValueError(f"expected a quoted PO string, got {s!r}")
    return re.sub(r'\\(.)', lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), s[1:-1])


def read_po(path: Path | str) -> list[Entry]:
    """The entries of a .po file (the header, msgid "", left out)."""
    entries: list[Entry] = []
    cur: Entry | None = None
    target = None
    flags: list[str] = []
    for n, raw in enumerate(Path(path).read_text("utf8").splitlines(), 1):
        line = raw.strip()
        obsolete = line.startswith("#~")
        if obsolete:
            line = line[2:].strip()
        if line.startswith("#,"):
            flags += [f.strip() for f in line[2:].split(",")]
            continue
        if not line or (line.startswith("#") and not obsolete):
            continue
        if line.startswith("msgid "):
            cur = Entry(_unquote(line[6:]), fuzzy="fuzzy" in flags, obsolete=obsolete, line=n, flags=flags)
            entries.append(cur)
            flags, target = [], "msgid"
        elif line.startswith("msgstr "):
            cur.msgstr, target = _unquote(line[7:]), "msgstr"
        elif line.startswith('"') and cur is not None:
            setattr(cur, target, getattr(cur, target) + _unquote(line))
        elif line.startswith("msgctxt"):
            continue
        else:
            raise ValueError(f"{path}:{n}: cannot read {raw!r}")
    return [e for e in entries if e.msgid]


# -- what a message carries ---------------------------------------------------------------------

def markup(text: str) -> Counter:
    """The multiset of what a translation must keep: glue, citations, doc/term targets, maths, code, digits."""
    out: Counter = Counter()
    for role, body in ROLE.findall(text):
        if role == "term" or role == "doc":
            target = re.search(r"<([^>]*)>\s*$", body)
            out[f"{{{role}}}{target[1] if target else body}"] += 1
        else:
            out[f"{{{role}}}{body}"] += 1
    rest = ROLE.sub(" ", text)
    out.update(f"${m}$" for m in MATH.findall(rest))
    rest = MATH.sub(" ", rest)
    out.update(f"`{c}`" for c in CODE.findall(rest))
    rest = CODE.sub(" ", rest)
    rest = re.sub(r"(\d{4}) ?年 ?\d{1,2} ?月", r"\1", rest)  # "August 2024" is "2024 年 8 月": its month is no new number
    out.update(d.replace(",", "") for d in DIGITS.findall(rest))
    return out


def parity_errors(msgid: str, msgstr: str) -> list[str]:
    """T3: what the translation lost or added, in words."""
    a, b = markup(msgid), markup(msgstr)
    errors = []
    if a - b:
        errors.append("lost " + ", ".join(sorted((a - b).elements())))
    if b - a:
        errors.append("added " + ", ".join(sorted((b - a).elements())))
    return errors


# -- terminology ----------------------------------------------------------------------------------

def glossary(path: Path = GLOSSARY) -> dict[str, dict]:
    """English term -> its data (zh, allowed, banned, keep_english)."""
    data = tomllib.loads(path.read_text("utf8"))
    return {t["en"]: t for entry in data["entry"] for t in entry["term"]}


def term_errors(msgstr: str, terms: dict[str, dict]) -> list[str]:
    """T4: each {term} shows the glossary's Chinese (or an allowed one); no banned rendering anywhere."""
    errors = []
    for role, body in ROLE.findall(msgstr):
        if role != "term":
            continue
        m = re.fullmatch(r"\s*(.*?)\s*<([^>]*)>\s*", body)
        shown, target = (m[1], m[2]) if m else (body, body)
        t = terms.get(target)
        if t is None:
            errors.append(f"{{term}} target {target!r} is not a glossary term")
            continue
        ok = {t["zh"], *t.get("allowed", [])} | ({t["en"], t["en"].lower()} if t.get("keep_english") else set())
        if shown not in ok:
            errors.append(f"{{term}} {target!r} shows {shown!r}; expected one of {sorted(ok)}")
    plain = ROLE.sub(lambda m: m[2] if m[1] == "term" else " ", msgstr)
    for t in terms.values():
        for bad in t.get("banned", []):
            if bad in plain:
                errors.append(f"banned rendering {bad!r} (for {t['en']!r}; use {t['zh']!r})")
    return errors


# -- typography -----------------------------------------------------------------------------------

def _visible(text: str) -> str:
    """The text as its reader sees the spacing: a term or doc role by its shown text, other roles,
    maths and code as Latin placeholders."""
    def role(m: re.Match) -> str:
        if m[1] in ("term", "doc"):
            shown = re.sub(r"\s*<[^>]*>\s*$", "", m[2])
            return shown if "<" in m[2] else ("·" if m[1] == "doc" else shown)
        return "0"
    text = ROLE.sub(role, text)
    return CODE.sub("C", MATH.sub("M", text))


def _punct(ch: str) -> bool:
    return not ch or unicodedata.category(ch)[0] in "PS"


def literal_asterisks(text: str) -> int:
    """How many ``*`` runs CommonMark would print as they are (the flanking rules; runs of 1-3)."""
    text = CODE.sub("C", MATH.sub("M", text))
    stack, literal = [], 0
    for m in re.finditer(r"\*+", text):
        before = text[m.start() - 1] if m.start() else " "
        after = text[m.end()] if m.end() < len(text) else " "
        left = not after.isspace() and (not _punct(after) or before.isspace() or _punct(before))
        right = not before.isspace() and (not _punct(before) or after.isspace() or _punct(after))
        if left and not right:
            stack.append(m[0])
        elif right and not left:
            if stack:
                stack.pop()
            else:
                literal += 1
        elif left and right:
            stack.pop() if stack else stack.append(m[0])
        else:
            literal += 1
    return literal + len(stack)


def typography_errors(msgstr: str, msgid: str = "") -> list[str]:
    """T5, on a translation: full-width punctuation, Chinese-Latin spacing, emphasis markers."""
    if not re.search(f"[{CJK}]", msgstr):
        return []
    errors = []
    seen = _visible(msgstr)
    for m in re.finditer(f"[{CJK}][A-Za-z0-9]|[A-Za-z0-9][{CJK}]", seen):
        errors.append(f"no space between Chinese and Latin text: {seen[max(0, m.start() - 6):m.end() + 6]!r}")
    for m in re.finditer(f"[{CJK}][,.;:?!()]|[,;:?!(][{CJK}]", seen):
        errors.append(f"ASCII punctuation in Chinese text: {seen[max(0, m.start() - 6):m.end() + 6]!r}")
    for m in re.finditer(f"[{FULL_WIDTH}] | [{FULL_WIDTH}]", seen):
        errors.append(f"a space next to full-width punctuation: {seen[max(0, m.start() - 6):m.end() + 6]!r}")
    if literal_asterisks(msgstr) > literal_asterisks(msgid):
        errors.append("an emphasis marker CommonMark prints as '*' (move ** inside the full-width punctuation)")
    return errors


# -- pages ----------------------------------------------------------------------------------------

def complete_pages(locale: Path = LOCALE) -> set[str]:
    path = locale / "complete.txt"
    lines = (x.split("#", 1)[0].strip() for x in path.read_text("utf8").splitlines()) if path.exists() else []
    return {x for x in lines if x}


def docname(po: Path, catalogs: Path = CATALOGS) -> str:
    return po.relative_to(catalogs).with_suffix("").as_posix()


def check_catalog(po: Path, complete: bool, terms: dict[str, dict]) -> list[str]:
    """Every gate but T1 on one catalog; T2 only when the page is complete."""
    errors = []
    for e in read_po(po):
        where = f"{po.name}:{e.line}"
        if e.obsolete:
            errors.append(f"{where}: obsolete entry (#~): run tools/book/editions.py catalogs and remove it")
            continue
        if not e.msgstr or e.fuzzy:
            if complete:
                errors.append(f"{where}: {'fuzzy' if e.fuzzy else 'untranslated'} in a complete page: {e.msgid[:60]!r}")
            continue
        problems = parity_errors(e.msgid, e.msgstr) + term_errors(e.msgstr, terms) + \
            typography_errors(e.msgstr, e.msgid)
        errors += [f"{where}: {p}" for p in problems]
    return errors


def fresh_errors(pot_dir: Path, catalogs: Path = CATALOGS) -> list[str]:
    """T1: each .po has exactly the msgids of its freshly extracted .pot, and each .pot has a .po."""
    errors = []
    pots = {p.relative_to(pot_dir).with_suffix("").as_posix(): p for p in pot_dir.rglob("*.pot")}
    pos = {docname(p, catalogs): p for p in catalogs.rglob("*.po")}
    for name in sorted(set(pots) | set(pos)):
        if name not in pos:
            errors.append(f"{name}: no catalog (run tools/book/editions.py catalogs)")
            continue
        if name not in pots:
            errors.append(f"{name}.po: no page extracts to it any more")
            continue
        want = {e.msgid for e in read_po(pots[name])}
        have = {e.msgid for e in read_po(pos[name]) if not e.obsolete}
        if want != have:
            errors.append(f"{name}.po: {len(want - have)} msgids missing, {len(have - want)} stale "
                          "(run tools/book/editions.py catalogs)")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--fresh", action="store_true", help="also T1 (runs Sphinx's gettext builder)")
    args = parser.parse_args(argv)
    terms = glossary()
    complete = complete_pages()
    errors = []
    if args.files:
        for po in args.files:
            errors += check_catalog(po.resolve(), True, terms)
    else:
        for po in sorted(CATALOGS.rglob("*.po")):
            errors += check_catalog(po, docname(po) in complete, terms)
        missing = complete - {docname(p) for p in CATALOGS.rglob("*.po")}
        errors += [f"{name}: listed in complete.txt but has no catalog" for name in sorted(missing)]
    if args.fresh:
        sys.path.insert(0, str(Path(__file__).parent))
        import editions
        errors += fresh_errors(editions.extract())
    for line in errors:
        print(line)
    print(f"{len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
