"""Turn the MyST Markdown of a chapter's prose into plain Markdown for its Colab copy.

The book's sources use a few MyST extensions that Colab (and Jupyter) would show as raw text:
``{glue:text}`` numbers, ``{footcite}`` citations, ``{doc}`` cross-references, ``:::{admonition}``
fences, ``{math}`` blocks and the ``{footbibliography}`` list. This module rewrites exactly those:

* a glued number becomes its name in code font, `` `rnn_ms` ``: the cell that computes it prints
  ``rnn_ms = 5.21`` on Colab (``tfm_course.glue``), and the notebook's first note says so;
* a citation becomes "Author et al. (year)" (``footcite:t``) or "(Author et al., year)"
  (``footcite:p``), and ``{footbibliography}`` the list of the works the chapter cites;
* a cross-reference becomes a link to the published book's page;
* an admonition becomes a block quote with a bold title, a dropdown a ``<details>`` block;
* a ``{math}`` block becomes ``$$ … $$``, with the book's MathJax macros (``_config.yml``) expanded.

Anything else written in MyST raises ``ValueError`` naming the file and line, so a chapter cannot
bring a new construct into its Colab copy unconverted.

Why not a Sphinx builder? QuantEcon generates its notebooks with one (``sphinx-tojupyter``), which
resolves every role from Sphinx's doctree. That needs the whole book toolchain and an executed
build to fill in glued values, and the generated copies would then change with every machine's
numbers. This course's sources use a small, fixed set of constructs, so a converter over exactly
that set keeps the committed Colab copies deterministic and checkable in the lightweight,
Colab-like test environment (``tests/test_colab_copies.py``).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIB = ROOT / "book" / "references.bib"
CONFIG = ROOT / "_config.yml"

ROLE = re.compile(r"\{([A-Za-z][\w:+-]*)\}`([^`]*)`")
FENCE_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}\s*(?P<arg>.*)$")
CODE_FENCE = re.compile(r"^(`{3,}|~{3,})")
TARGET = re.compile(r"^\(([\w-]+)\)=\s*$")
OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")
TITLES = {"note": "Note", "tip": "Tip", "warning": "Warning", "important": "Important",
          "seealso": "See also", "hint": "Hint", "caution": "Caution"}


# --------------------------------------------------------------------------- bibliography
_LATEX = {r"{\L}": "Ł", r"{\l}": "ł", r"\L": "Ł", r"\l": "ł", r"{\o}": "ø", r"{\ss}": "ß"}
_ACCENTS = {"'": "\u0301", "`": "\u0300", '"': "\u0308", "^": "\u0302", "~": "\u0303", "c": "\u0327",
            "v": "\u030c", "=": "\u0304", ".": "\u0307", "u": "\u0306", "H": "\u030b"}


def latex_to_text(text: str) -> str:
    """BibTeX field text as plain Unicode: accents resolved, protective braces dropped."""
    import unicodedata

    for latex, char in _LATEX.items():
        text = text.replace(latex, char)
    text = re.sub(r"\{?\\([`'\"^~=.]|[cvuH](?=[\s{]))\s*\{?([A-Za-z])\}?\}?",
                  lambda m: unicodedata.normalize("NFC", m.group(2) + _ACCENTS[m.group(1)]), text)
    text = text.replace("\\&", "&").replace("--", "–")
    return re.sub(r"\s+", " ", text.replace("{", "").replace("}", "")).strip()


def parse_bibtex(text: str) -> dict[str, dict[str, str]]:
    """``{key: {field: value}}`` for every ``@type{key, field = {...} or "..." or digits, ...}``."""
    entries: dict[str, dict[str, str]] = {}
    for match in re.finditer(r"@(\w+)\s*\{\s*([^,\s]+)\s*,", text):
        fields = {"type": match.group(1).lower()}
        pos, depth = match.end(), 1
        while depth > 0 and pos < len(text):
            field = re.compile(r"\s*([\w-]+)\s*=\s*").match(text, pos)
            if not field:
                closing = re.compile(r"[\s,]*\}").match(text, pos)
                if not closing:
                    raise ValueError(f"cannot parse the BibTeX entry {match.group(2)!r} near {text[pos:pos + 40]!r}")
                break
            pos = field.end()
            if text[pos] == "{":
                level, start = 0, pos
                while True:
                    level += {"{": 1, "}": -1}.get(text[pos], 0)
                    pos += 1
                    if level == 0:
                        break
                value = text[start + 1:pos - 1]
            elif text[pos] == '"':
                end = text.index('"', pos + 1)
                value, pos = text[pos + 1:end], end + 1
            else:
                number = re.compile(r"\w+").match(text, pos)
                value, pos = number.group(0), number.end()
            fields[field.group(1).lower()] = value
            comma = re.compile(r"\s*,").match(text, pos)
            pos = comma.end() if comma else pos
        entries[match.group(2)] = fields
    return entries


@cache
def bibliography(path: Path = BIB) -> dict[str, dict[str, str]]:
    return parse_bibtex(path.read_text(encoding="utf-8"))


def _surnames(entry: dict[str, str]) -> list[str]:
    people = re.split(r"\s+and\s+", entry.get("author") or entry.get("editor") or "Anonymous")
    names = []
    for person in people:
        person = person.strip()
        names.append(person.split(",")[0] if "," in person else person.split()[-1])
    return [latex_to_text(name) for name in names]


def authors_short(entry: dict[str, str]) -> str:
    names = _surnames(entry)
    if names[-1].lower() == "others" or len(names) > 2:
        return f"{names[0]} et al."
    return " and ".join(names)


def cite(keys: str, textual: bool, source: str) -> str:
    """``Vaswani et al. (2017)`` (textual) or ``(Vaswani et al., 2017; Ba et al., 2016)``."""
    bib = bibliography()
    parts = []
    for key in (k.strip() for k in keys.split(",")):
        if key not in bib:
            raise ValueError(f"{source}: citation key {key!r} is not in {BIB.relative_to(ROOT)}")
        entry = bib[key]
        parts.append(f"{authors_short(entry)} ({entry.get('year', 'n.d.')})" if textual
                     else f"{authors_short(entry)}, {entry.get('year', 'n.d.')}")
    return "; ".join(parts) if textual else f"({'; '.join(parts)})"


def reference_line(key: str) -> str:
    entry = bibliography()[key]
    venue = entry.get("journal") or entry.get("booktitle") or entry.get("publisher") or entry.get("howpublished", "")
    line = f"- {authors_short(entry)} ({entry.get('year', 'n.d.')}). *{latex_to_text(entry.get('title', key))}*."
    if venue:
        line += f" {latex_to_text(venue)}."
    if entry.get("url"):
        line += f" <{entry['url']}>"
    return line


# --------------------------------------------------------------------------- config
@cache
def book_config() -> dict:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def book_url() -> str:
    """The published book's address (``html.baseurl`` in ``_config.yml``), ending in ``/``."""
    url = book_config()["html"]["baseurl"]
    return url if url.endswith("/") else url + "/"


def expand_macros(text: str) -> str:
    """Replace the book's MathJax macros (``mathjax3_config`` in ``_config.yml``) by their bodies."""
    macros = book_config()["sphinx"]["config"].get("mathjax3_config", {}).get("tex", {}).get("macros", {})
    for name, body in macros.items():
        text = re.sub(r"\\" + name + r"(?![A-Za-z])", lambda _m, b=body: b, text)
    return text


def page_title(page: Path) -> str:
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def doc_link(argument: str, source: Path) -> str:
    """``{doc}`text <target>``` or ``{doc}`target``` as a link to the published page."""
    match = re.fullmatch(r"(.*?)\s*<([^>]+)>", argument.strip())
    text, target = (match.group(1), match.group(2)) if match else (None, argument.strip())
    page = (source.parent / target).resolve().with_suffix(".md")
    if not page.exists():
        raise ValueError(f"{source.name}: {{doc}} target {target!r} does not exist")
    relative = page.relative_to(ROOT).with_suffix(".html").as_posix()
    return f"[{text or page_title(page)}]({book_url()}{relative})"


def term_link(argument: str) -> str:
    """``{term}`text <Term>``` or ``{term}`text``` as a link to the term on the glossary page
    (Sphinx's anchor for a glossary term: ``term-`` and the term, lower case, runs of other
    characters as one hyphen)."""
    match = re.fullmatch(r"(.*?)\s*<([^>]+)>", argument.strip())
    text, target = (match.group(1), match.group(2)) if match else (argument.strip(), argument.strip())
    anchor = "term-" + re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")
    return f"[{text}]({book_url()}book/glossary.html#{anchor})"


# --------------------------------------------------------------------------- roles
def _spans(line: str):
    """Split ``line`` into (text, is_role) pieces, left to right as MyST reads it: a role is
    ``{name}`` followed by a backtick span; any other backtick span is inline code, kept verbatim
    (so `` `\\p{L}` `` in code is not a role)."""
    pos, plain = 0, ""
    while pos < len(line):
        role = ROLE.match(line, pos)
        if role:
            yield plain, False
            yield role.group(0), True
            plain, pos = "", role.end()
            continue
        ticks = re.compile(r"`+").match(line, pos)
        if ticks:
            closing = line.find(ticks.group(0), ticks.end())
            end = closing + len(ticks.group(0)) if closing >= 0 else ticks.end()
            plain += line[pos:end]
            pos = end
            continue
        plain += line[pos]
        pos += 1
    yield plain, False


def convert_roles(line: str, source: Path, cited: list[str]) -> str:
    def replace(match: re.Match) -> str:
        role, argument = match.group(1), match.group(2)
        if role in ("glue", "glue:text", "glue:md"):
            return f"`{argument.split(':')[0].strip()}`"
        if role in ("footcite:p", "footcite:t", "footcite"):
            cited.extend(k.strip() for k in argument.split(",") if k.strip() not in cited)
            return cite(argument, textual=role == "footcite:t", source=source.name)
        if role == "doc":
            return doc_link(argument, source)
        if role == "term":
            return term_link(argument)
        raise ValueError(f"{source.name}: unsupported MyST role {{{role}}} in {line.strip()[:80]!r}")
    return "".join(ROLE.sub(replace, text) if is_role else text for text, is_role in _spans(line))


def roles_left(text: str) -> list[str]:
    """The MyST roles still in ``text`` (inline code ignored)."""
    return [piece for line in text.split("\n") for piece, is_role in _spans(line) if is_role]


# --------------------------------------------------------------------------- blocks
def _read_options(lines: list[str], start: int) -> tuple[dict[str, str], int]:
    options = {}
    while start < len(lines) and OPTION.match(lines[start]):
        key, value = OPTION.match(lines[start]).groups()
        options[key] = value
        start += 1
    return options, start


def _block_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing a directive opened with ``fence`` (nested fences skipped)."""
    depth, code = 1, None
    for index in range(start, len(lines)):
        stripped = lines[index].strip()
        if code:  # inside a plain code block: nothing opens or closes here
            if stripped.startswith(code) and stripped.strip(code[0]) == "":
                code = None
            continue
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            depth -= 1  # a closing fence
            if depth == 0:
                return index
            continue
        opened = FENCE_OPEN.match(stripped)
        if opened:
            depth += opened.group("fence")[0] == fence[0] and len(opened.group("fence")) >= len(fence)
        elif CODE_FENCE.match(stripped):
            code = CODE_FENCE.match(stripped).group(1)
    raise ValueError(f"unclosed {fence} directive")


def convert_lines(lines: list[str], source: Path, cited: list[str]) -> list[str]:
    out: list[str] = []
    index, code = 0, None
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if code:
            out.append(line)
            if stripped.startswith(code) and stripped.strip(code[0]) == "":
                code = None
            index += 1
            continue
        opened = FENCE_OPEN.match(stripped)
        if opened:
            fence, name, argument = opened.group("fence"), opened.group("name"), opened.group("arg").strip()
            end = _block_end(lines, index + 1, fence)
            options, body_start = _read_options(lines, index + 1)
            body = convert_lines(lines[body_start:end], source, cited)
            out.extend(render_directive(name, argument, options, body, source, cited))
            index = end + 1
            continue
        if CODE_FENCE.match(stripped):
            code = CODE_FENCE.match(stripped).group(1)
            out.append(line)
            index += 1
            continue
        if TARGET.match(stripped):
            index += 1  # a label for {ref}: nothing to show
            continue
        if re.match(r"^(`{3,}|:{3,})\{", stripped):
            raise ValueError(f"{source.name}: cannot read the directive {stripped[:60]!r}")
        out.append(expand_macros(convert_roles(line, source, cited)))
        index += 1
    return out


def render_directive(name: str, argument: str, options: dict[str, str], body: list[str],
                     source: Path, cited: list[str]) -> list[str]:
    if name == "math":
        return ["$$", *(expand_macros(line) for line in body), "$$"]
    if name == "footbibliography":
        if not cited:
            return []
        return [reference_line(key) for key in cited]
    if name == "admonition" or name in TITLES:
        title = convert_roles(argument, source, cited) if name == "admonition" else TITLES[name]
        if "dropdown" in options.get("class", "").split():
            return [f"<details><summary><b>{title}</b> (click to show)</summary>", "", *body, "", "</details>"]
        quoted = [f"> **{title}**" if title else ">", ">"]
        quoted += [f"> {line}" if line.strip() else ">" for line in body]
        return quoted
    raise ValueError(f"{source.name}: unsupported MyST directive {{{name}}}")


def to_markdown(text: str, source: Path, cited: list[str] | None = None) -> str:
    """Plain Markdown for one markdown cell of ``source``; citations found are added to ``cited``
    (in order of first use, for the chapter's reference list)."""
    cited = [] if cited is None else cited
    return "\n".join(convert_lines(text.split("\n"), source, cited))


# What a converted cell may no longer contain besides roles (checked by tests/test_colab_copies.py).
MYST_BLOCKS_LEFT = re.compile(r"^\s*(`{3,}|:{3,})\{|^\s*\([\w-]+\)=\s*$|^:[\w-]+:", re.M)


def myst_left(text: str) -> list[str]:
    """MyST roles, directives, targets and directive options left in converted ``text``."""
    return roles_left(text) + [m.group(0) for m in MYST_BLOCKS_LEFT.finditer(text)]
