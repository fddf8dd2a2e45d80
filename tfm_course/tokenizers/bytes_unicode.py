"""GPT-2's printable byte ↔ unicode table, used to store byte tokens in text files.

A byte-level BPE's tokens are byte strings, and many bytes (space, newline, control bytes, the
halves of multi-byte UTF-8 characters) are invisible or invalid on their own in a text file. GPT-2's
``vocab.json`` and ``merges.txt`` therefore write every byte as one printable character: the 188
bytes that already are printable characters (``!`` to ``~``, ``¡`` to ``¬``, ``®`` to ``ÿ``) stand
for themselves, and the other 68 are mapped, in byte order, to the characters U+0100, U+0101, …
So the space 0x20 is written ``Ġ`` (U+0120) and the newline 0x0A ``Ċ`` (U+010A).

    >>> token_to_text(b" the")
    'Ġthe'
    >>> text_to_token('Ġthe')
    b' the'
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """The table: byte value (0-255) -> one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))


@functools.lru_cache(maxsize=None)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse table: printable character -> byte value."""
    return {char: b for b, char in bytes_to_unicode().items()}


def token_to_text(token: bytes) -> str:
    """A byte string as the printable text GPT-2's files use (``b" the"`` -> ``"Ġthe"``)."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def text_to_token(text: str) -> bytes:
    """The inverse of :func:`token_to_text`; ``ValueError`` for a character outside the table."""
    table = unicode_to_bytes()
    try:
        return bytes(table[char] for char in text)
    except KeyError as error:
        raise ValueError(f"{text!r} is not in GPT-2's byte-to-unicode form: character {error.args[0]!r} "
                         "stands for no byte") from None
