"""The course's shared tokenizer: a byte-level BPE trained on the corpus's train split.

Chapters 7-9 (BERT, GPT, T5) all need the same tokenizer within a small time budget, so it is
trained once per process (cached in memory) and saved in GPT-2's format under
``tfm_course.data.corpus.cache_dir()``, in a folder named by a key of everything it depends on
(the training text, the vocabulary size, the special tokens, the tokenizer's code and the
``regex`` version). A ``manifest.json`` written last holds that key and the files' checksums; a
folder whose manifest does not match (stale, truncated, edited, half-written) is never read: the
tokenizer is trained again. A later process loads it in a fraction of a second;
``TFM_COURSE_CACHE=off`` (or a read-only disk) retrains every time, a few seconds on a laptop CPU.

    >>> tok = default_tokenizer(4096, special_tokens=("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    >>> tok.special_ids["[MASK]"]
    4095

The special tokens take the last ids, so the ids of ordinary tokens do not depend on them; the
number of merges does (``vocab_size − 256 − len(special_tokens)``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import regex

from ..data import corpus
from .bpe import BPETokenizer

# the modules whose code decides what training gives and how the files are written and read
CODE_FILES = ("bpe_train.py", "pretokenize.py", "bpe.py", "bytes_unicode.py", "default.py")
FILES = ("vocab.json", "merges.txt")


def _code_version() -> bytes:
    here = Path(__file__).parent
    return b"".join((here / name).read_bytes() for name in CODE_FILES) + regex.__version__.encode()


def _digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def _is_complete(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds the files of ``key``, exactly as they were written."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        return manifest == {"key": key, "sha256": _digests(folder)}
    except (OSError, ValueError):
        return False


def _load(folder: Path, key: str, special_tokens: list[str]) -> BPETokenizer | None:
    """The tokenizer saved in ``folder``, or None if the folder is missing, stale or damaged."""
    if not _is_complete(folder, key):
        return None
    try:
        return BPETokenizer.from_files(folder / "vocab.json", folder / "merges.txt", special_tokens)
    except (OSError, ValueError):
        return None


def _save(tokenizer: BPETokenizer, folder: Path, key: str) -> None:
    """Write to a temporary folder, then rename it: readers see no folder or a complete one."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        tokenizer.save(tmp)
        manifest = {"key": key, "sha256": _digests(tmp)}
        (tmp / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        if not _is_complete(folder, key):  # another process may have written the same files first
            shutil.rmtree(folder, ignore_errors=True)  # a stale or damaged copy
            os.replace(tmp, folder)
    except OSError:
        pass  # a read-only disk, or another process's identical copy won the rename
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=16)
def _cached(vocab_size: int, special_tokens: tuple[str, ...]) -> BPETokenizer:
    documents = [d.text for d in corpus.documents("train")]
    key = hashlib.sha256(_code_version() + repr((vocab_size, special_tokens)).encode()
                         + "\0".join(documents).encode("utf-8")).hexdigest()[:20]
    folder = corpus.cache_dir()
    target = folder / f"bpe-{vocab_size}-{key}" if folder else None
    tokenizer = _load(target, key, list(special_tokens)) if target is not None else None
    if tokenizer is None:
        tokenizer = BPETokenizer.train(documents, vocab_size, list(special_tokens))
        if target is not None:
            _save(tokenizer, target, key)
    return tokenizer


def default_tokenizer(vocab_size: int = 4096, special_tokens: Sequence[str] = ("<|endoftext|>",)) -> BPETokenizer:
    """A byte-level BPE with ``vocab_size`` tokens trained on ``corpus.documents("train")``.

    A few seconds the first time on a laptop CPU; then loaded from the disk cache. The same object
    is returned for the same arguments within a process: do not modify it.
    """
    if isinstance(special_tokens, str):
        raise ValueError(f"special_tokens must be a sequence of str, got the str {special_tokens!r}")
    return _cached(vocab_size, tuple(special_tokens))
