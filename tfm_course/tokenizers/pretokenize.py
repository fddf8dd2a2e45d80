"""Pre-tokenisation: cut text into the pieces inside which BPE may merge.

GPT-2 splits text with a regular expression before any merge, so that a merge can never glue a
word to the punctuation or the space after it ("dog." and "dog!" share the token "dog"). Each
piece keeps its leading space (" world"), contractions are split off ("'ll"), letters, numbers,
other symbols and whitespace form separate runs. Special tokens (``<|endoftext|>``) are cut out
*before* that, matched longest first, and never split.

``\\p{L}`` (any letter) and ``\\p{N}`` (any number) need the ``regex`` package; Python's ``re``
does not know them.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import regex

GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPLIT = regex.compile(GPT2_SPLIT_PATTERN)
# how many characters the pattern may read past the start of a piece before deciding it ("'ll")
_LOOKAHEAD = 3


def pretokenize(text: str) -> list[str]:
    """The GPT-2 pieces of ``text`` (special tokens are not handled here)."""
    return SPLIT.findall(text)


def check_special_tokens(special_tokens: Iterable[str] | None) -> list[str]:
    """A clean list of special tokens (order kept, duplicates removed); ``ValueError`` if malformed."""
    if special_tokens is None:
        return []
    if isinstance(special_tokens, (str, bytes)):
        raise ValueError(f"special_tokens must be a list of strings, got a single {type(special_tokens).__name__}"
                         f" {special_tokens!r}: write [{special_tokens!r}]")
    tokens = list(special_tokens)
    for token in tokens:
        if not isinstance(token, str) or not token:
            raise ValueError(f"each special token must be a non-empty str, got {token!r}")
    return list(dict.fromkeys(tokens))


def special_pattern(special_tokens: list[str]) -> regex.Pattern | None:
    """One alternation of the special tokens, longest first (so ``<a><a>`` wins over ``<a>``)."""
    if not special_tokens:
        return None
    ordered = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(token) for token in ordered))


def split_on_specials(text: str, pattern: regex.Pattern | None) -> Iterator[tuple[str, bool]]:
    """``(piece, is_special)`` in order: ordinary stretches of text and the special tokens between them."""
    if pattern is None:
        if text:
            yield text, False
        return
    start = 0
    for match in pattern.finditer(text):
        if match.start() > start:
            yield text[start:match.start()], False
        yield match.group(), True
        start = match.end()
    if start < len(text):
        yield text[start:], False


def safe_cut(text: str, pattern: regex.Pattern | None, longest_special: int) -> int:
    """The largest position ``p`` such that the pieces of ``text[:p]`` are final.

    Whatever text is appended later, pre-tokenising ``text[:p]`` and ``text[p:] + later`` separately
    gives exactly the pieces of ``text + later``. This is what lets a long file be encoded chunk by
    chunk with bounded memory. Only the last few characters can still change: a piece is decided by
    at most ``_LOOKAHEAD`` characters from its start plus one after its end, and a special token by
    its longest alternative (two more characters of margin keep every such read inside ``text``).
    """
    limit = len(text) - max(_LOOKAHEAD, longest_special) - 2
    cut = 0
    position = 0
    for piece, is_special in split_on_specials(text, pattern):
        if position > limit:
            break
        if is_special:
            cut = position + len(piece)
        else:
            for match in SPLIT.finditer(piece):
                if position + match.start() > limit:
                    break
                cut = position + match.start()
        position += len(piece)
    return cut


def stream_pieces(chunks: Iterable[str], pattern: regex.Pattern | None,
                  longest_special: int) -> Iterator[tuple[str, bool]]:
    """``(piece, is_special)`` of the concatenation of ``chunks``, keeping only a short tail in memory.

    The pieces are exactly those of ``"".join(chunks)`` (see :func:`safe_cut`).
    """
    carry = ""
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise ValueError(f"expected chunks of text (str), got {type(chunk).__name__}")
        carry += chunk
        cut = safe_cut(carry, pattern, longest_special)
        if cut:
            yield from _pieces(carry[:cut], pattern)
            carry = carry[cut:]
    yield from _pieces(carry, pattern)


def _pieces(text: str, pattern: regex.Pattern | None) -> Iterator[tuple[str, bool]]:
    for part, is_special in split_on_specials(text, pattern):
        if is_special:
            yield part, True
        else:
            for piece in SPLIT.findall(part):
                yield piece, False
