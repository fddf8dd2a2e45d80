"""The course's shared tokenizer: a byte-level BPE trained on the corpus's train split.

Chapters 7-9 (BERT, GPT, T5) all need the same tokenizer within a small time budget, so it is
trained once per process (cached in memory) and saved in GPT-2's format under
``tfm_course.data.corpus.cache_dir()``, keyed by everything it depends on (the training text, the
vocabulary size, the special tokens and the tokenizer's code). A later process loads it in a
fraction of a second; ``TFM_COURSE_CACHE=off`` retrains every time.

    >>> tok = default_tokenizer(4096, special_tokens=("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    >>> tok.special_ids["[MASK]"]
    4095

The special tokens take the last ids, so the ids of ordinary tokens do not depend on them; the
number of merges does (``vocab_size − 256 − len(special_tokens)``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Sequence

from ..data import corpus
from .bpe import BPETokenizer


def _code_version() -> bytes:
    here = Path(__file__).parent
    return b"".join((here / name).read_bytes() for name in ("bpe_train.py", "pretokenize.py", "bpe.py"))


@functools.lru_cache(maxsize=16)
def _cached(vocab_size: int, special_tokens: tuple[str, ...]) -> BPETokenizer:
    documents = [d.text for d in corpus.documents("train")]
    key = hashlib.sha256(_code_version() + repr((vocab_size, special_tokens)).encode()
                         + "\0".join(documents).encode("utf-8")).hexdigest()[:20]
    folder = corpus.cache_dir()
    target = folder / f"bpe-{vocab_size}-{key}" if folder else None
    if target is not None and (target / "merges.txt").exists():
        try:
            return BPETokenizer.from_files(target / "vocab.json", target / "merges.txt", list(special_tokens))
        except (OSError, ValueError):
            pass  # damaged: train again
    tokenizer = BPETokenizer.train(documents, vocab_size, list(special_tokens))
    if target is not None:
        try:
            tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
            tokenizer.save(tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        except OSError:
            pass  # read-only: the in-memory cache still holds it
    return tokenizer


def default_tokenizer(vocab_size: int = 4096, special_tokens: Sequence[str] = ("<|endoftext|>",)) -> BPETokenizer:
    """A byte-level BPE with ``vocab_size`` tokens trained on ``corpus.documents("train")``.

    A few seconds the first time on a laptop CPU; then loaded from the disk cache. The same object
    is returned for the same arguments within a process: do not modify it.
    """
    if isinstance(special_tokens, str):
        raise ValueError(f"special_tokens must be a sequence of str, got the str {special_tokens!r}")
    return _cached(vocab_size, tuple(special_tokens))
