"""An offline text corpus: the docstrings of the running Python's standard library.

Every Python installation carries about 1.7 million characters of English technical prose in its
standard library's docstrings, so a course can train real language models on real text without
downloading anything. The docstrings are read with :mod:`ast` from the ``.py`` sources — no module
is imported, so nothing runs and nothing platform-specific can fail.

    >>> from tfm_course.data import corpus
    >>> docs = corpus.documents("train")          # list[Docstring]: module, name, text
    >>> text = corpus.text("validation")          # the validation docstrings joined by blank lines

**Split.** A module's docstrings all land in the same split, chosen by a hash of the module path
(``sha256("json.decoder")``): about 10 % of the modules are held out for validation. The split is
the same on every machine and never depends on what else is installed.

**Filtering** (each rule's effect is counted by :func:`filter_report`):

1. Test suites (``test/``, ``tests/``, ``idle_test/``) are skipped: they are code, not prose.
2. Licence and copyright paragraphs ("(c) Copyright CNRI, All Rights Reserved. NO WARRANTY.")
   are cut out of the docstrings that carry them; the rest of such a docstring is kept.
3. The codec headers that a script generated for ``encodings/*`` ("Python Character Mapping Codec
   cp1252 generated from ... with gencodec.py.") are dropped: dozens of near-copies of one line.
4. Docstrings with fewer than two words ("Stub.", "days") are labels, not prose: dropped.
5. Exact duplicates (tkinter's "Internal function." appears 29 times) are kept once, so the same
   string can never sit in both splits.

The corpus differs between Python versions (modules come and go), so tests assert ranges, never
exact counts. It is collected once per process (cached in memory) and, to spare the few seconds
of parsing in the next process, also cached on disk under :func:`cache_dir`. The file's name is a
key of everything the result depends on (the Python version, this file's code, every source
file's path, size and modification time), and the file carries a checksum of its content: a stale
or damaged file is never read, the corpus is collected again. Without a usable cache (none yet, a
read-only home, ``TFM_COURSE_CACHE=off``) everything still works, a few seconds slower.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

CORPUS_VERSION = 2  # bump when the collection or the filtering changes (invalidates disk caches)
VALIDATION_FRACTION = 0.1
SPLITS = ("train", "validation")
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

# a paragraph that is a licence or copyright notice (matched case-insensitively)
LICENCE = re.compile(
    r"\(c\)\s*copyright|copyright\s*(?:\(c\)|©|\d{4})|all rights reserved|no warranty|"
    r"licensed to the psf|^:(?:copyright|license):|in no event shall|disclaims (?:all|any) warranties|"
    r"choose between two licenses|free software, and you may redistribute",
    re.IGNORECASE | re.MULTILINE,
)
GENERATED_CODEC = re.compile(r"generated from .* with gencodec\.py", re.IGNORECASE)


@dataclass(frozen=True)
class Docstring:
    """One document of the corpus.

    ``module`` is the dotted module path (``"json.decoder"``, a package's own docstring under
    ``"json"``), ``name`` the qualified name inside it (``"JSONDecoder.decode"``; ``""`` for the
    module docstring), ``text`` the cleaned docstring (:func:`inspect.cleandoc` indentation).
    """

    module: str
    name: str
    text: str

    @property
    def split(self) -> str:
        return split_of(self.module)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def split_of(module: str) -> str:
    """``"train"`` or ``"validation"`` for a dotted module path, from a hash of the path."""
    digest = hashlib.sha256(module.encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") < VALIDATION_FRACTION * 2**64 else "train"


def stdlib_root() -> Path:
    """The folder of the running Python's standard library (e.g. ``.../lib/python3.11``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def cache_dir() -> Path | None:
    """Where tfm_course caches what it computed (``$TFM_COURSE_CACHE`` or ``~/.cache/tfm_course``).

    ``TFM_COURSE_CACHE=off`` disables the disk cache (everything is then recomputed per process).
    """
    setting = os.environ.get("TFM_COURSE_CACHE")
    if setting is not None and setting.lower() in {"", "0", "off", "no", "false"}:
        return None
    if setting:
        return Path(setting)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfm_course"
    except RuntimeError:  # no home directory to be found: no disk cache
        return None


def source_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files outside test suites, in a fixed (sorted) order."""
    root = stdlib_root() if root is None else Path(root)
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_DIRS)
        files.extend(Path(folder) / n for n in sorted(names) if n.endswith(".py"))
    return files


def module_name(path: Path, root: Path) -> str:
    """``.../email/mime/text.py`` -> ``"email.mime.text"``; a package's ``__init__.py`` -> its name."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def docstrings_of(source: bytes | str) -> list[tuple[str, str]]:
    """``(qualified name, docstring)`` for the module, classes and functions of one source file."""
    found: list[tuple[str, str]] = []
    tree = ast.parse(source)
    module_doc = ast.get_docstring(tree, clean=True)
    if module_doc is not None:
        found.append(("", module_doc))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(child, clean=True)
                if doc is not None:
                    found.append((prefix + child.name, doc))
                visit(child, f"{prefix}{child.name}.")
            elif not isinstance(child, ast.expr):  # defs nested in if / try / with / match blocks
                visit(child, prefix)

    visit(tree, "")
    return found


def strip_licence(text: str) -> tuple[str, int]:
    """Remove the paragraphs of ``text`` that are licence or copyright notices.

    Returns the remaining text and the number of paragraphs removed.
    """
    paragraphs = re.split(r"\n\s*\n", text)
    kept = [p for p in paragraphs if not LICENCE.search(p)]
    return "\n\n".join(kept).strip(), len(paragraphs) - len(kept)


_collected: dict[Path, tuple[list[Docstring], dict[str, int]]] = {}  # what collect() found, by root


def collect(root: Path | None = None) -> tuple[list[Docstring], dict[str, int]]:
    """Parse every source file and filter the docstrings, without any cache: ``(documents, report)``.

    The result also seeds this process's in-memory cache, so timing a fresh collection does not
    make the next :func:`documents` call parse everything again.
    """
    root = stdlib_root() if root is None else Path(root)
    files = source_files(root)
    report = dict.fromkeys(["source files", "unparsable files", "docstrings found", "characters found",
                            "licence paragraphs removed", "licence characters removed",
                            "generated codec headers dropped", "shorter than two words dropped",
                            "duplicates dropped", "duplicate characters dropped"], 0)
    report["source files"] = len(files)
    kept: list[Docstring] = []
    seen: set[str] = set()
    for path in files:
        try:
            found = docstrings_of(path.read_bytes())
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            report["unparsable files"] += 1  # e.g. a file written for another Python version
            continue
        module = module_name(path, root)
        for name, text in found:
            report["docstrings found"] += 1
            report["characters found"] += len(text)
            cleaned, n_licence = strip_licence(text)
            report["licence paragraphs removed"] += n_licence
            report["licence characters removed"] += len(text) - len(cleaned) if n_licence else 0
            if GENERATED_CODEC.search(cleaned):
                report["generated codec headers dropped"] += 1
            elif len(cleaned.split()) < 2:
                report["shorter than two words dropped"] += 1
            elif cleaned in seen:
                report["duplicates dropped"] += 1
                report["duplicate characters dropped"] += len(cleaned)
            else:
                seen.add(cleaned)
                kept.append(Docstring(module, name, cleaned))
    report["docstrings kept"] = len(kept)
    report["characters kept"] = sum(len(d.text) for d in kept)
    _collected[root] = (list(kept), dict(report))
    return kept, report


def _fingerprint(root: Path) -> str:
    """Changes when the Python version, this file (its filtering) or any source file (size, mtime) does."""
    h = hashlib.sha256(f"{CORPUS_VERSION}|{sys.version}|{root}|".encode() + Path(__file__).read_bytes())
    for path in source_files(root):
        stat = path.stat()
        h.update(f"|{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def _checksum(documents: list, report: dict) -> str:
    return hashlib.sha256(json.dumps([documents, report], ensure_ascii=False).encode("utf-8")).hexdigest()


def _read_cache(path: Path, key: str) -> tuple[list[Docstring], dict[str, int]] | None:
    """The corpus stored in ``path``, or None if it is missing, stale or damaged in any way."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        documents, report = data["documents"], data["report"]
        if data["key"] != key or data["sha256"] != _checksum(documents, report):
            return None
        docs = [Docstring(*d) for d in documents]
        if not all(isinstance(field, str) for d in docs for field in (d.module, d.name, d.text)):
            return None
        return docs, {str(k): int(v) for k, v in report.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: Path, key: str, docs: list[Docstring], report: dict[str, int]) -> None:
    """Write atomically (a temporary file, then a rename): a reader sees the old file or the whole new one."""
    documents = [[d.module, d.name, d.text] for d in docs]
    payload = {"key": key, "sha256": _checksum(documents, report), "documents": documents, "report": report}
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: keep the in-memory cache only
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


@functools.lru_cache(maxsize=None)
def _corpus() -> tuple[tuple[Docstring, ...], dict[str, int]]:
    root = stdlib_root()
    folder = cache_dir()
    key = _fingerprint(root) if folder else ""
    cached = folder / f"stdlib-docstrings-{key}.json" if folder else None
    found = _read_cache(cached, key) if cached is not None else None
    if found is None:
        found = _collected.get(root) or collect(root)
        if cached is not None:
            _write_cache(cached, key, *found)
    docs, report = found
    return tuple(docs), dict(report)


def stdlib_docstrings() -> list[Docstring]:
    """Every kept docstring of the standard library (both splits), in a fixed order."""
    return list(_corpus()[0])


def filter_report() -> dict[str, int]:
    """What the collection found and what each filtering rule removed (counts and characters)."""
    return dict(_corpus()[1])


def documents(split: str = "train") -> list[Docstring]:
    """The docstrings of one split: ``"train"``, ``"validation"`` or ``"all"``."""
    if split not in SPLITS + ("all",):
        raise ValueError(f"split must be one of {SPLITS + ('all',)}, got {split!r}")
    docs = _corpus()[0]
    return list(docs) if split == "all" else [d for d in docs if d.split == split]


def fingerprint() -> str:
    """A short sha256 of every kept docstring (module, name, text): equal fingerprints mean equal
    corpora. It changes with the Python version, whose standard library the corpus is; stored runs
    record it so that a chapter can tell whether it reads the corpus the run was trained on."""
    docs = [[d.module, d.name, d.text] for d in _corpus()[0]]
    return hashlib.sha256(json.dumps(docs, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def text(split: str = "train", separator: str = "\n\n") -> str:
    """The docstrings of one split joined by ``separator`` (a blank line by default)."""
    return separator.join(d.text for d in documents(split))
