"""Checkers for chapter 6, "From text to tokens".

>>> from tfm_course.exercises import ch06
>>> ch06.check_merge_step(my_merge_step)          # fn(pieces: {tuple[bytes, ...]: count}) -> (pair, new pieces)
>>> ch06.check_update_pair_counts(my_update)      # fn(word, count, pair, new, pair_counts) -> new word; counts in place
>>> ch06.check_encode_piece(my_encode_piece)      # fn(piece: bytes, merges: list[(bytes, bytes)]) -> list[bytes]
>>> ch06.check_bytes_to_unicode(my_table)         # fn() -> {byte value: printable character}
>>> ch06.check_split_on_specials(my_split)        # fn(text, special_tokens) -> list[str]

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Callable

from ..tokenizers import bytes_to_unicode
from ._checking import Failed, attempt, run_checks

__all__ = ["check_merge_step", "check_update_pair_counts", "check_encode_piece", "check_bytes_to_unicode", "check_split_on_specials"]

Pieces = dict[tuple[bytes, ...], int]
Pair = tuple[bytes, bytes]


def _show(pieces: Pieces) -> str:
    return "{" + ", ".join(f"{'|'.join(t.decode('latin-1') for t in k)}: {n}" for k, n in pieces.items()) + "}"


# --------------------------------------------------------------------------- one BPE merge step
def _merge(piece: tuple[bytes, ...], pair: Pair, first_only: bool = False) -> tuple[bytes, ...]:
    """Replace (every, or only the first) non-overlapping ``pair``, left to right."""
    out: list[bytes] = []
    i, merged_once = 0, False
    while i < len(piece):
        if i < len(piece) - 1 and (piece[i], piece[i + 1]) == pair and not (first_only and merged_once):
            out.append(pair[0] + pair[1])
            merged_once = True
            i += 2
        else:
            out.append(piece[i])
            i += 1
    return tuple(out)


def _merge_right_to_left(piece: tuple[bytes, ...], pair: Pair) -> tuple[bytes, ...]:
    return tuple(t[::-1] for t in reversed(_merge(tuple(t[::-1] for t in reversed(piece)), (pair[1][::-1], pair[0][::-1]))))


def _pair_counts(pieces: Pieces, weighted: bool = True) -> Counter:
    counts: Counter = Counter()
    for piece, n in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] += n if weighted else 1
    return counts


def merge_step(pieces: Pieces) -> tuple[Pair, Pieces]:
    """The reference: most frequent pair (weighted by piece counts), ties -> greater pair; merge it."""
    counts = _pair_counts(pieces)
    best = max(counts, key=lambda pair: (counts[pair], pair))
    return best, {_merge(piece, best): n for piece, n in pieces.items()}


def _pieces(*items: tuple[str, int]) -> Pieces:
    return {tuple(bytes([b]) for b in word.encode()): n for word, n in items}


MERGE_CASES: list[tuple[str, Pieces]] = [
    ("counts matter: 'th' ×6 against 'in' spread over four pieces",
     _pieces(("th", 6), ("ing", 1), ("kin", 1), ("pin", 1), ("wing", 1))),
    ("a tie between (b'a', b'b') and (b'z', b'y'), the smaller seen first", _pieces(("ab", 3), ("zy", 3), ("c", 5))),
    ("a tie between (b'ab', b'a') and (b'a', b'bb')", {(b"ab", b"a"): 2, (b"a", b"bb"): 2, (b"q",): 7}),
    ("a pair that overlaps itself and occurs twice in a piece",
     _pieces(("aaa", 4), ("aab", 1), ("ba", 2), ("aaxaa", 1), ("q", 9))),
]


def _pair_mistake(got: Pair, pieces: Pieces) -> str | None:
    counts = _pair_counts(pieces)
    top = max(counts.values())
    tied = [p for p, n in counts.items() if n == top]
    unweighted = _pair_counts(pieces, weighted=False)
    if got in tied and len(tied) > 1:
        if max(tied, key=lambda p: p[0] + p[1]) == got:
            return ("you compared the concatenated bytes a + b; compare the pairs as tuples of byte strings "
                    "(first a, then b): max over (count, (a, b))")
        return (f"{len(tied)} pairs are equally frequent ({top} times): the rule takes the lexicographically "
                "greater pair of byte strings, max(..., key=lambda p: (count[p], p)); you took another one")
    if got == max(unweighted, key=lambda p: (unweighted[p], p)) and got not in tied:
        return ("you counted each piece once: a pair occurring in a piece of count n occurs n times — "
                "add the piece's count, not 1")
    if counts.get(got, 0) and counts[got] < top:
        return f"{got!r} occurs {counts[got]} times, but another pair occurs {top} times: take the most frequent"
    return None


def check_merge_step(fn: Callable[[Pieces], tuple[Pair, Pieces]]) -> bool:
    """``fn(pieces)`` -> ``(pair, new_pieces)``: pieces map tuples of tokens (bytes) to their counts."""

    def case(pieces: Pieces) -> Callable[[], None]:
        def check() -> None:
            want_pair, want_pieces = merge_step(pieces)
            got = attempt(fn, dict(pieces))
            if not (isinstance(got, tuple) and len(got) == 2):
                raise Failed(f"return a tuple (pair, new_pieces), got {type(got).__name__}")
            pair, new = got
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(t, bytes) for t in pair)):
                raise Failed(f"the pair should be a tuple of two bytes objects like (b'a', b'b'), got {pair!r}")
            if pair != want_pair:
                raise Failed(_pair_mistake(pair, pieces) or f"the pair should be {want_pair!r}, got {pair!r}")
            if not isinstance(new, dict):
                raise Failed(f"new_pieces should be a dict {{tuple of tokens: count}}, got {type(new).__name__}")
            if new == want_pieces:
                return
            if not all(isinstance(k, tuple) and all(isinstance(t, bytes) for t in k) for k in new):
                raise Failed("new_pieces' keys should be tuples of bytes tokens, like (b'lo', b'w')")
            if not {b"".join(k) for k in new} <= {b"".join(k) for k in pieces}:
                raise Failed("the new pieces do not spell the old ones: a byte was lost or used twice — merge "
                             "left to right without overlap, (a, a, a) -> (aa, a)")
            variants = [
                ({_merge_right_to_left(p, pair): n for p, n in pieces.items()},
                 "merge left to right: (a, a, a) -> (aa, a), not (a, aa)"),
                ({_merge(p, pair, first_only=True): n for p, n in pieces.items()},
                 "only the first occurrence in each piece was merged: replace every occurrence"),
                ({_merge(p, pair): 1 for p in pieces},
                 "the counts were lost: each new piece keeps the count of the piece it came from"),
                ({_merge(p, pair): n for p, n in pieces.items() if _merge(p, pair) != p},
                 "pieces without the pair disappeared: keep them unchanged, with their counts"),
            ]
            for variant, message in variants:
                if new == variant:
                    raise Failed(message)
            raise Failed(f"new_pieces should be {_show(want_pieces)}, got {_show(new)}")
        return check

    return run_checks("one BPE merge step", [(name, case(pieces)) for name, pieces in MERGE_CASES])


# --------------------------------------------------------------------------- the fast trainer's update step
IdPair = tuple[int, int]


def _merge_ids(word: list[int], pair: IdPair, new: int, overlapping: bool = False) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(word):
        if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
            out.append(new)
            i += 1 if overlapping else 2
        else:
            out.append(word[i])
            i += 1
    return out


def update_pair_counts(word: list[int], count: int, pair: IdPair, new: int,
                       pair_counts: dict[IdPair, int]) -> list[int]:
    """The reference: merge ``pair`` in ``word``; subtract its old pairs, add its new ones, times ``count``."""
    new_word = _merge_ids(word, pair, new)
    if new_word != word:
        for p in zip(word, word[1:]):
            pair_counts[p] -= count
        for p in zip(new_word, new_word[1:]):
            pair_counts[p] += count
    return new_word


def _pairs(word: list[int], weight: int) -> Counter:
    return Counter({p: n * weight for p, n in Counter(zip(word, word[1:])).items()})


def _nonzero(counts: dict) -> dict:
    return {p: n for p, n in counts.items() if n != 0}


# (what the case shows, the piece, its count, the pair, the new id, the other pieces: {piece: count})
UPDATE_CASES = [
    ("the pair twice in a piece seen 3 times", [1, 2, 3, 1, 2, 4], 3, (1, 2), 9, {(1, 2): 5, (3, 1, 4): 2}),
    ("an overlapping pair: 'aaa' seen twice", [5, 5, 5], 2, (5, 5), 7, {(5, 6): 1}),
    ("an overlapping pair: 'aaaa' seen 4 times", [5, 5, 5, 5], 4, (5, 5), 7, {(5, 5): 3}),
    ("two merges side by side: 'abab'", [1, 2, 1, 2], 1, (1, 2), 9, {(2, 1): 2}),
    ("a piece without the pair", [1, 3, 2], 6, (1, 2), 9, {(1, 2): 4}),
]


def _update_mistake(word, count, pair, new, before: Counter, got: dict) -> str | None:
    new_word = _merge_ids(word, pair, new)
    old_pairs, new_pairs = _pairs(word, count), _pairs(new_word, count)
    variants = [
        (before + new_pairs, "you added the new pairs but did not subtract the piece's old pairs: "
                             "each old pair of the piece goes away, count times"),
        (before - old_pairs, "you subtracted the piece's old pairs but did not add its new ones "
                             "(with the new token)"),
        (_sub(before, old_pairs) + new_pairs, None),
        (_sub(before, _pairs(word, 1)) + _pairs(new_word, 1),
         "each pair of this piece occurs `count` times in the corpus: subtract and add `count`, not 1"),
    ]
    got_nz = _nonzero(got)
    for variant, message in variants:
        if message and got_nz == _nonzero(variant):
            return message
    if any(n < 0 for n in got.values()):
        return ("a count went below zero: a pair was subtracted more often than it occurs — with an "
                "overlapping pair ('aaaa') the pair between two merges is the right neighbour of one merge "
                "and the left neighbour of the next; subtract each old pair once, zip(word, word[1:])")
    want = _nonzero(_sub(before, old_pairs) + new_pairs)
    if sum(got_nz.values()) < sum(want.values()):
        return ("too much was subtracted: with an overlapping pair ('aaaa') the pair between two merges is "
                "the right neighbour of one merge and the left neighbour of the next — subtract each old pair "
                "of the piece once (zip(word, word[1:])), then add each new pair once")
    return None


def _sub(a: Counter, b: Counter) -> Counter:
    """a - b keeping negative values (Counter's ``-`` drops them)."""
    out = Counter(a)
    for k, n in b.items():
        out[k] -= n
    return out


def check_update_pair_counts(fn: Callable[[list[int], int, IdPair, int, dict], list[int]]) -> bool:
    """``fn(word, count, pair, new, pair_counts)`` -> the new word; ``pair_counts`` updated in place.

    ``word`` is one piece as token ids, seen ``count`` times; ``pair_counts`` (a ``defaultdict(int)``)
    holds the counts of every pair of the corpus, this piece included. A pair whose count drops to 0
    may be kept at 0 or deleted.
    """

    def case(word, count, pair, new, others) -> Callable[[], None]:
        def check() -> None:
            before = _pairs(word, count)
            for piece, n in others.items():
                before.update(_pairs(list(piece), n))
            counts: defaultdict = defaultdict(int, before)
            want_word = _merge_ids(word, pair, new)
            want = _nonzero(_sub(before, _pairs(word, count)) + _pairs(want_word, count)) \
                if want_word != word else _nonzero(before)
            got_word = attempt(fn, list(word), count, pair, new, counts)
            if isinstance(got_word, tuple):
                got_word = list(got_word)
            if not isinstance(got_word, list):
                raise Failed(f"return the new word, a list of ids like {want_word}, got {type(got_word).__name__}")
            if got_word != want_word:
                if got_word == _merge_ids(word, pair, new, overlapping=True):
                    raise Failed(f"{word} -> {got_word}: an id was used twice; merge left to right without "
                                 f"overlap, {word} -> {want_word}")
                raise Failed(f"the new word should be {want_word}, got {got_word}")
            if not isinstance(counts, dict) or not all(isinstance(n, int) for n in counts.values()):
                raise Failed("pair_counts should hold int counts")
            got = _nonzero(counts)
            if got == want:
                return
            if got == _nonzero(before):
                raise Failed("pair_counts did not change: update the dict you were given, in place "
                             "(pair_counts[p] -= count ...), do not build a new one")
            message = _update_mistake(word, count, pair, new, before, counts)
            if message:
                raise Failed(message)
            wrong = sorted(set(got) | set(want), key=lambda p: (got.get(p, 0) == want.get(p, 0), p))[0]
            raise Failed(f"pair_counts[{wrong}] should be {want.get(wrong, 0)}, got {got.get(wrong, 0)}")
        return check

    return run_checks("the update step of the fast trainer",
                      [(name, case(*rest)) for name, *rest in UPDATE_CASES])


# --------------------------------------------------------------------------- encoding with a merge list
def encode_piece(piece: bytes, merges: list[Pair]) -> list[bytes]:
    """The reference: merge the adjacent pair with the lowest rank until none is in ``merges``."""
    ranks = {pair: r for r, pair in reversed(list(enumerate(merges)))}
    tokens = [bytes([b]) for b in piece]
    while len(tokens) > 1:
        pairs = [p for p in zip(tokens, tokens[1:]) if p in ranks]
        if not pairs:
            break
        best = min(pairs, key=ranks.__getitem__)
        tokens = list(_merge(tuple(tokens), best))
    return tokens


def _leftmost_first(piece: bytes, merges: list[Pair]) -> list[bytes]:
    known, tokens = set(merges), [bytes([b]) for b in piece]
    while True:
        pair = next((p for p in zip(tokens, tokens[1:]) if p in known), None)
        if pair is None:
            return tokens
        i = list(zip(tokens, tokens[1:])).index(pair)
        tokens[i:i + 2] = [pair[0] + pair[1]]


def _longest_match(piece: bytes, merges: list[Pair]) -> list[bytes]:
    vocab = {bytes([b]) for b in range(256)} | {a + b for a, b in merges}
    tokens, i = [], 0
    while i < len(piece):
        j = max(j for j in range(i + 1, len(piece) + 1) if piece[i:j] in vocab)
        tokens.append(piece[i:j])
        i = j
    return tokens


def _each_merge_once_first_occurrence(piece: bytes, merges: list[Pair]) -> list[bytes]:
    tokens = (bytes([b]) for b in piece)
    tokens = tuple(tokens)
    for pair in merges:
        tokens = _merge(tokens, pair, first_only=True)
    return list(tokens)


ENCODE_MERGES: list[Pair] = [(b" ", b"l"), (b"o", b"w"), (b"e", b"r"), (b" l", b"ow"), (b"e", b"w"),
                             (b"n", b"ew"), (b"ow", b"er"), (b" low", b"er"), (b"w", b"e"), (b"s", b"t"),
                             (b"e", b"s"), (b" ", b"n"), (b"es", b"t")]
ENCODE_CASES = [
    (b"abc", [(b"a", b"b"), (b"b", b"c")]),
    (b"ddd", [(b"d", b"d"), (b"d", b"dd")]),
    (b"cbddaa", [(b"b", b"d"), (b"d", b"a"), (b"bd", b"d"), (b"bd", b"da")]),
    (b" lowlow", ENCODE_MERGES), (b" lower", ENCODE_MERGES), (b" newest", ENCODE_MERGES),
    (b"lowest", ENCODE_MERGES), (b"xyz", [(b"q", b"r")]), (b"", ENCODE_MERGES),
]


def check_encode_piece(fn: Callable[[bytes, list[Pair]], list[bytes]]) -> bool:
    """``fn(piece, merges)`` -> the piece's tokens (a list of bytes), merging by rank."""
    mistakes = [
        (_leftmost_first, "you merged the leftmost pair that has a merge; merge the pair with the lowest "
                          "rank (learned earliest) first, wherever it is"),
        (lambda p, m: encode_piece(p, m[::-1]), "you applied the merges from the last learned to the "
                                                "first: the lowest rank (earliest merge) goes first"),
        (_longest_match, "that is greedy longest-match (WordPiece's way of encoding); BPE replays its "
                         "merges by rank and can end with a different split"),
        (_each_merge_once_first_occurrence, "each merge must replace every occurrence of its pair, not "
                                            "only the first"),
    ]

    def case(piece: bytes, merges: list[Pair]) -> Callable[[], None]:
        def check() -> None:
            want = encode_piece(piece, merges)
            got = attempt(fn, piece, list(merges))
            if isinstance(got, tuple):
                got = list(got)
            if not isinstance(got, list) or not all(isinstance(t, bytes) for t in got):
                raise Failed(f"return a list of bytes tokens like [b' low', b'er'], got {got!r}")
            if got == want:
                return
            if b"".join(got) != piece:
                raise Failed(f"the tokens {got!r} do not spell the piece {piece!r}: merging must keep every byte")
            for mistake, message in mistakes:
                if got == mistake(piece, merges) != want:
                    raise Failed(message)
            if len(got) == len(want) + 1 or len(got) > len(want):
                raise Failed(f"expected {want!r}, got {got!r}: keep merging until no adjacent pair is in the list")
            raise Failed(f"expected {want!r}, got {got!r}")
        return check

    return run_checks("encoding a piece with a merge list",
                      [(f"piece {p!r}", case(p, m)) for p, m in ENCODE_CASES])


# --------------------------------------------------------------------------- the byte <-> unicode table
def check_bytes_to_unicode(fn: Callable[[], dict[int, str]]) -> bool:
    """``fn()`` -> GPT-2's table {byte value: printable character}."""
    want = bytes_to_unicode()

    def check() -> None:
        got = attempt(fn)
        if not isinstance(got, dict):
            raise Failed(f"return a dict {{byte value: character}}, got {type(got).__name__}")
        if sorted(got, key=repr) != sorted(range(256), key=repr):
            keys = list(got)[:3]
            raise Failed(f"the keys should be the 256 ints 0..255, got {len(got)} keys starting with {keys!r}")
        if not all(isinstance(c, str) and len(c) == 1 for c in got.values()):
            raise Failed("each value should be one character (a str of length 1)")
        if got == want:
            return
        if all(got[b] == chr(b) for b in range(256)):
            raise Failed("every byte maps to chr(byte): the space and control bytes stay invisible; only "
                         "the printable bytes may stand for themselves")
        if len(set(got.values())) < 256:
            raise Failed("two bytes map to the same character: the table must be one-to-one, or a file "
                         "could not be read back")
        if got[0x20] == " ":
            raise Failed("the space (0x20) maps to itself: a space in merges.txt would split the line; "
                         "only '!'..'~' of ASCII stand for themselves, and the space becomes 'Ġ' (U+0120)")
        if got[0x20] == chr(256 + 0x20) and got[0x7F] == chr(256 + 0x7F):
            raise Failed("the unprintable bytes are numbered in order from U+0100: the n-th unprintable "
                         "byte gets chr(256 + n), not chr(256 + byte)")
        if got[0xAD] == chr(0xAD):
            raise Failed("byte 0xAD is the soft hyphen, invisible: it is not among the bytes kept as "
                         "themselves (¡..¬ and ®..ÿ skip it)")
        if got[0xA1] != chr(0xA1) or got[0xFF] != chr(0xFF):
            raise Failed("the printable Latin-1 bytes ¡..¬ (0xA1-0xAC) and ®..ÿ (0xAE-0xFF) stand for "
                         "themselves too, not only '!'..'~'")
        wrong = [b for b in range(256) if got[b] != want[b]]
        b = wrong[0]
        raise Failed(f"{len(wrong)} bytes map to the wrong character; the first is byte {b} (0x{b:02X}): "
                     f"expected {want[b]!r} (U+{ord(want[b]):04X}), got {got[b]!r}")

    return run_checks("GPT-2's byte-to-unicode table", [("the whole table", check)])


# --------------------------------------------------------------------------- splitting on special tokens
def split_on_specials(text: str, special_tokens: list[str]) -> list[str]:
    """The reference: special tokens as separate items, longest first, empty parts dropped."""
    if not special_tokens:
        return [text] if text else []
    pattern = "(" + "|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True)) + ")"
    return [part for part in re.split(pattern, text) if part]


EOT = "<|endoftext|>"
SPLIT_CASES = [
    ("one special token", "Hello<|endoftext|>world", [EOT]),
    ("two adjacent special tokens", f"a{EOT}{EOT}b", [EOT]),
    ("at the start and the end", f"{EOT}text{EOT}", [EOT]),
    ("overlapping special tokens, the shorter listed first", f"x{EOT}{EOT}{EOT}y", [EOT, EOT + EOT]),
    ("several kinds", "[CLS] a b [SEP] c [SEP]", ["[CLS]", "[SEP]"]),
    ("no special token in the text", "plain | text (with) [regex] *chars*", [EOT]),
    ("no special tokens at all", "plain text", []),
]


def check_split_on_specials(fn: Callable[[str, list[str]], list[str]]) -> bool:
    """``fn(text, special_tokens)`` -> the text cut into ordinary parts and special tokens, in order."""

    def case(text: str, specials: list[str]) -> Callable[[], None]:
        def check() -> None:
            want = split_on_specials(text, specials)
            got = attempt(fn, text, list(specials))
            if not isinstance(got, list) or not all(isinstance(p, str) for p in got):
                raise Failed(f"return a list of str, got {got!r}")
            if got == want:
                return
            if "" in got:
                raise Failed("drop the empty strings (between adjacent special tokens, or at the ends)")
            if not specials:
                raise Failed(f"with no special tokens the text is one part: expected {want!r}, got {got!r}")
            for variant, message in _split_mistakes(text, specials):
                if got == variant:
                    raise Failed(message)
            if "".join(got) != text:
                raise Failed(f"the parts do not add up to the text: expected {want!r}, got {got!r}")
            if not any(p in specials for p in got):
                raise Failed("no special token came out as an item of its own: cut the text at each special "
                             f"token and keep the token, e.g. {want!r}")
            raise Failed(f"expected {want!r}, got {got!r}")
        return check

    return run_checks("splitting on special tokens", [(name, case(t, s)) for name, t, s in SPLIT_CASES])


def _split_mistakes(text: str, specials: list[str]) -> list[tuple[list[str], str]]:
    def split(pattern: str) -> list[str]:
        try:
            return [part for part in re.split(pattern, text) if part]
        except re.error:
            return []

    escaped = [re.escape(t) for t in specials]
    longest_first = sorted(escaped, key=len, reverse=True)
    return [
        (split("(" + "|".join(specials) + ")"),
         "the '|' in '<|endoftext|>' means 'or' in a regular expression (and '[' opens a class): escape "
         "each token with re.escape before joining them"),
        (split("(" + "|".join(sorted(escaped, key=len)) + ")"),
         "a shorter special token was matched inside a longer one: try the longest special tokens first "
         "(sort by length, descending)"),
        (split("(" + "|".join(escaped) + ")"),
         "a shorter special token was matched inside a longer one: try the longest special tokens first "
         "(sort by length, descending)"),
        (split("|".join(longest_first)),
         "the special tokens disappeared: keep them in the list, as items of their own (re.split keeps what "
         "a capturing group (...) matched)"),
    ]
