"""A character-level tokenizer: one token per Unicode character (code point).

The vocabulary is the set of characters seen in training, sorted, then the special tokens. A
character never seen in training cannot be encoded: it raises a ``ValueError`` naming it, or maps
to ``unk_token`` if you give one. That is the out-of-vocabulary problem a byte-level tokenizer
does not have.

    >>> tok = CharTokenizer.train("hello world", special_tokens=["<pad>"])
    >>> tok.encode("hold")
    [3, 5, 4, 1]
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from .pretokenize import check_special_tokens, special_pattern, split_on_specials


class CharTokenizer:
    """``vocab``: id -> character (or special token); ``encode`` / ``decode`` like :class:`.BPETokenizer`."""

    def __init__(self, chars: Iterable[str], special_tokens: list[str] | None = None,
                 unk_token: str | None = None):
        chars = list(dict.fromkeys(chars))
        for char in chars:
            if not isinstance(char, str) or len(char) != 1:
                raise ValueError(f"chars must be single characters, got {char!r}")
        self.special_tokens = check_special_tokens(list(special_tokens or []) + ([unk_token] if unk_token else []))
        self.unk_token = unk_token
        self.vocab: dict[int, str] = dict(enumerate(chars + self.special_tokens))
        self.stoi = {token: i for i, token in self.vocab.items()}
        self._special_re = special_pattern(self.special_tokens)

    @classmethod
    def train(cls, data: str | Iterable[str], special_tokens: list[str] | None = None,
              unk_token: str | None = None, min_count: int = 1) -> "CharTokenizer":
        """The characters of ``data`` (a text or documents) seen at least ``min_count`` times, sorted."""
        texts = [data] if isinstance(data, str) else data
        counts: Counter[str] = Counter()
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"expected text (str), got {type(text).__name__}")
            counts.update(text)
        return cls(sorted(c for c, n in counts.items() if n >= min_count), special_tokens, unk_token)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        unk = self.stoi.get(self.unk_token) if self.unk_token else None
        for part, is_special in split_on_specials(text, self._special_re):
            if is_special:
                ids.append(self.stoi[part])
                continue
            for char in part:
                i = self.stoi.get(char, unk)
                if i is None:
                    raise ValueError(f"character {char!r} (U+{ord(char):04X}) is not in the vocabulary "
                                     f"of {self.vocab_size} tokens; pass unk_token=... to map it to one")
                ids.append(i)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        if hasattr(ids, "tolist"):  # a tensor (on any device: read once, on the CPU) or an array of ids
            ids = (ids.cpu() if hasattr(ids, "cpu") else ids).tolist()
        try:
            return "".join(self.vocab[i] for i in ids)
        except (KeyError, TypeError):
            raise ValueError(f"ids must be ints in 0..{self.vocab_size - 1}, got {list(ids)[:10]!r}...") from None

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
