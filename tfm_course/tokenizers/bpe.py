"""A byte-level BPE tokenizer (GPT-2's kind): train, encode, decode, save and load GPT-2's files.

    >>> tok = BPETokenizer.train(text, vocab_size=1024, special_tokens=["<|endoftext|>"])
    >>> ids = tok.encode("Hello world<|endoftext|>")
    >>> tok.decode(ids)
    'Hello world<|endoftext|>'

* The vocabulary starts from the 256 bytes, so any text can be encoded: there is no unknown token.
* Text is first cut at special tokens (longest first; a special token is never split), then
  into GPT-2's pre-tokenisation pieces (:mod:`.pretokenize`); merges never cross either cut.
* Encoding a piece applies the learned merges by **rank**: repeatedly merge the adjacent pair that
  was learned earliest, until no learned pair is left (GPT-2's algorithm). Pieces repeat a lot in
  text, so their encodings are cached.
* ``vocab`` maps id -> bytes; ids 0-255 are the bytes themselves in a trained tokenizer, then the
  merges, then the special tokens. A loaded GPT-2 vocabulary may number them differently.
* ``save`` / ``from_files`` use GPT-2's ``vocab.json`` + ``merges.txt`` (see :mod:`.bytes_unicode`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from .bpe_train import train_bpe
from .bytes_unicode import text_to_token, token_to_text
from .pretokenize import SPLIT, check_special_tokens, special_pattern, split_on_specials, stream_pieces

MAX_CACHED_PIECES = 200_000  # bounded memory when encoding an endless stream of new words


def _check_text(text: object, what: str = "text") -> str:
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str, got {type(text).__name__}")
    return text


class BPETokenizer:
    """Byte-level BPE. ``vocab``: id -> bytes; ``merges``: pairs of byte strings, in learned order."""

    def __init__(self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                 special_tokens: list[str] | None = None):
        self.vocab: dict[int, bytes] = dict(vocab)
        self.merges: list[tuple[bytes, bytes]] = [(bytes(a), bytes(b)) for a, b in merges]
        self.special_tokens: list[str] = check_special_tokens(special_tokens)
        id_of: dict[bytes, int] = {}
        for i, token in self.vocab.items():
            if not isinstance(i, int) or not isinstance(token, bytes):
                raise ValueError(f"vocab must map int ids to bytes, got {i!r}: {token!r}")
            id_of.setdefault(token, i)
        missing = [b for b in range(256) if bytes([b]) not in id_of]
        if missing:
            raise ValueError(f"a byte-level vocab must contain all 256 single bytes; {len(missing)} missing "
                             f"(first: {bytes(missing[:1])!r})")
        self.special_ids: dict[str, int] = {}
        for token in self.special_tokens:  # reuse an id the vocab already has (GPT-2's <|endoftext|>)
            encoded = token.encode("utf-8")
            if encoded not in id_of:
                id_of[encoded] = max(self.vocab) + 1
                self.vocab[id_of[encoded]] = encoded
            self.special_ids[token] = id_of[encoded]
        self._byte_ids = [id_of[bytes([b])] for b in range(256)]
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}  # (id_a, id_b) -> (rank, merged id)
        for rank, (a, b) in enumerate(self.merges):
            for part in (a, b, a + b):
                if part not in id_of:
                    raise ValueError(f"merge {rank} ({a!r}, {b!r}) uses {part!r}, which is not in the vocab")
            self._ranks.setdefault((id_of[a], id_of[b]), (rank, id_of[a + b]))
        self._special_re = special_pattern(self.special_tokens)
        self._longest_special = max(map(len, self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ training
    @classmethod
    def train(cls, data: str | os.PathLike | Iterable[str], vocab_size: int,
              special_tokens: list[str] | None = None) -> "BPETokenizer":
        """Learn ``vocab_size − 256 − len(special_tokens)`` merges (fewer if the text runs out of pairs).

        ``data`` is a text (``str``), a file (``pathlib.Path``; read as UTF-8, in chunks) or an
        iterable of documents (``str`` each, pre-tokenised separately: no piece spans two).
        """
        return cls(*train_bpe(_documents(data, special_tokens), vocab_size, special_tokens), special_tokens)

    def truncated(self, vocab_size: int) -> "BPETokenizer":
        """The tokenizer that training with a smaller ``vocab_size`` would give: the first merges only.

        Training is greedy, so its first merges do not depend on how many follow; one training at
        the largest size gives every smaller vocabulary. Ordinary tokens keep their ids; the
        special tokens move to the end.
        """
        smallest = 256 + len(self.special_tokens)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not smallest <= vocab_size <= self.vocab_size:
            raise ValueError(f"vocab_size must be an int in [{smallest}, {self.vocab_size}], got {vocab_size!r}")
        kept_tokens = {bytes([b]) for b in range(256)}
        n_merges = 0
        for a, b in self.merges:
            if a + b not in kept_tokens:
                if len(kept_tokens) == vocab_size - len(self.special_tokens):
                    break
                kept_tokens.add(a + b)
            n_merges += 1
        special = set(self.special_ids.values())
        vocab = {i: t for i, t in self.vocab.items() if t in kept_tokens and i not in special}
        return BPETokenizer(vocab, self.merges[:n_merges], self.special_tokens)

    # ------------------------------------------------------------------ encoding
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_piece(self, piece: str) -> list[int]:
        """The ids of one pre-tokenised piece: merge the earliest-learned adjacent pair until none is left."""
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        ids = [self._byte_ids[b] for b in piece.encode("utf-8")]
        ranks = self._ranks
        while len(ids) > 1:
            best = min(zip(ids, ids[1:]), key=lambda pair: ranks.get(pair, (float("inf"),))[0])
            if best not in ranks:
                break
            a, b = best
            new = ranks[best][1]
            merged, i = [], 0
            while i < len(ids):
                if i < len(ids) - 1 and ids[i] == a and ids[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        if len(self._cache) >= MAX_CACHED_PIECES:
            self._cache.clear()
        self._cache[piece] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` ignoring special tokens: ``"<|endoftext|>"`` in it is plain characters.

        Use this for text you did not write (user input, scraped documents), and insert special
        tokens yourself by id (``tok.special_ids["<|endoftext|>"]``).
        """
        ids: list[int] = []
        for piece in SPLIT.findall(_check_text(text)):
            ids.extend(self.encode_piece(piece))
        return ids

    def encode(self, text: str) -> list[int]:
        """Encode ``text``; occurrences of the special tokens become their single ids."""
        ids: list[int] = []
        for part, is_special in split_on_specials(_check_text(text), self._special_re):
            if is_special:
                ids.append(self.special_ids[part])
            else:
                ids.extend(self.encode_ordinary(part))
        return ids

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Yield the ids of the *concatenation* of ``iterable`` (e.g. a file's lines), one by one.

        Exactly ``encode("".join(iterable))``, with bounded memory: only the last few characters
        (those that text yet to come could still change) and the piece cache are kept.
        """
        if isinstance(iterable, (str, bytes)):
            raise ValueError("encode_iterable expects an iterable of str (e.g. an open file); "
                             "for one string use encode()")
        for piece, is_special in stream_pieces(iterable, self._special_re, self._longest_special):
            if is_special:
                yield self.special_ids[piece]
            else:
                yield from self.encode_piece(piece)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD (�), never an error."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        if hasattr(ids, "tolist"):  # a tensor (on any device: read once, on the CPU) or an array of ids
            ids = (ids.cpu() if hasattr(ids, "cpu") else ids).tolist()
        try:
            return b"".join(self.vocab[i] for i in ids)
        except (KeyError, TypeError):
            bad = next((i for i in ids if not isinstance(i, int) or i not in self.vocab), None)
            raise ValueError(f"ids must be ints in the vocab (0..{max(self.vocab)}), got {bad!r}") from None

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike) -> tuple[Path, Path]:
        """Write GPT-2's ``vocab.json`` and ``merges.txt`` to ``directory``; return their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        special = set(self.special_ids.values())
        vocab_json = {self.vocab[i].decode("utf-8") if i in special else token_to_text(self.vocab[i]): i
                      for i in sorted(self.vocab)}
        vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
        vocab_path.write_text(json.dumps(vocab_json, ensure_ascii=False, indent=0), encoding="utf-8")
        lines = ["#version: 0.2"] + [f"{token_to_text(a)} {token_to_text(b)}" for a, b in self.merges]
        merges_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return vocab_path, merges_path

    @classmethod
    def from_files(cls, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike,
                   special_tokens: list[str] | None = None) -> "BPETokenizer":
        """Load GPT-2-format files (ours from :meth:`save`, or GPT-2's own)."""
        specials = set(check_special_tokens(special_tokens))
        entries = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            raise ValueError(f"{vocab_json}: expected a JSON object {{token: id}}, got {type(entries).__name__}")
        vocab = {int(i): token.encode("utf-8") if token in specials else text_to_token(token)
                 for token, i in entries.items()}
        merges = []
        for number, line in enumerate(Path(merges_txt).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_txt}, line {number}: expected two tokens separated by one space, "
                                 f"got {line!r}")
            merges.append((text_to_token(parts[0]), text_to_token(parts[1])))
        return cls(vocab, merges, special_tokens)

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens})")


def _documents(data: object, special_tokens: list[str] | None) -> Iterable[str] | Counter[bytes]:
    """What :meth:`BPETokenizer.train` counts: a text, documents, or a file streamed in chunks."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, os.PathLike):
        specials = check_special_tokens(special_tokens)
        with open(data, encoding="utf-8") as file:
            chunks = iter(lambda: file.read(1 << 16), "")
            pieces = stream_pieces(chunks, special_pattern(specials), max(map(len, specials), default=0))
            return Counter(piece.encode("utf-8") for piece, is_special in pieces if not is_special)
    if isinstance(data, bytes) or not isinstance(data, Iterable):
        raise ValueError("train() expects a str, a pathlib.Path or an iterable of str, "
                         f"got {type(data).__name__}")
    return data


__all__ = ["BPETokenizer"]
