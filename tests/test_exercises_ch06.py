"""Chapter 6 checkers: each accepts correct answers and rejects typical mistakes with the right words."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest

from checker_helpers import rejects, verdict
from tfm_course.exercises import ch06
from tfm_course.tokenizers import BPETokenizer, bytes_to_unicode
from tfm_course.tokenizers.bpe_train import merge_pair
from tfm_course.tokenizers.pretokenize import special_pattern, split_on_specials


# --------------------------------------------------------------------------- one merge step
def merge_step(pieces, weighted=True, key=lambda counts, p: (counts[p], p), merge_all=True,
               right_to_left=False, keep_counts=True, keep_unmerged=True, overlapping=False):
    counts = Counter()
    for piece, n in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] += n if weighted else 1
    best = max(counts, key=lambda p: key(counts, p))

    def merge(piece):
        piece = list(piece[::-1] if right_to_left else piece)
        pair = best[::-1] if right_to_left else best
        out, i, done = [], 0, False
        while i < len(piece):
            if i < len(piece) - 1 and (piece[i], piece[i + 1]) == pair and (merge_all or not done):
                out.append(best[0] + best[1])
                i, done = i + (1 if overlapping else 2), True
            else:
                out.append(piece[i])
                i += 1
        return tuple(out[::-1] if right_to_left else out)

    new = {merge(p): (n if keep_counts else 1) for p, n in pieces.items()}
    if not keep_unmerged:
        new = {k: n for (p, n), k in zip(pieces.items(), new) if k != p}
    return best, new


def test_merge_step_checker_accepts_correct_answers(capsys):
    ok, out = verdict(ch06.check_merge_step, merge_step, capsys)
    assert ok and "✅" in out


MERGE_WRONG = {
    "unweighted counts": (lambda p: merge_step(p, weighted=False), "you counted each piece once"),
    "tie to the smaller pair": (lambda p: merge_step(p, key=lambda c, q: (c[q], tuple(-x for x in q[0] + q[1]))),
                                "the rule takes the lexicographically greater pair"),
    "tie to the first seen": (lambda p: merge_step(p, key=lambda c, q: c[q]), "lexicographically greater pair"),
    "tie by concatenation": (lambda p: merge_step(p, key=lambda c, q: (c[q], q[0] + q[1])),
                             "you compared the concatenated bytes"),
    "least frequent": (lambda p: merge_step(p, key=lambda c, q: (-c[q], q)), "take the most frequent"),
    "first occurrence only": (lambda p: merge_step(p, merge_all=False), "only the first occurrence"),
    "right to left": (lambda p: merge_step(p, right_to_left=True), "merge left to right"),
    "overlapping": (lambda p: merge_step(p, overlapping=True), "a byte was lost or used twice"),
    "counts lost": (lambda p: merge_step(p, keep_counts=False), "the counts were lost"),
    "unmerged dropped": (lambda p: merge_step(p, keep_unmerged=False), "pieces without the pair disappeared"),
    "merged token instead of pair": (lambda p: (b"".join(merge_step(p)[0]), merge_step(p)[1]),
                                     "a tuple of two bytes"),
    "str pair": (lambda p: (tuple(t.decode() for t in merge_step(p)[0]), {}), "a tuple of two bytes"),
    "no tuple": (lambda p: merge_step(p)[0], "a tuple of two bytes"),
    "crashes": (lambda p: p["missing"], "your function raised KeyError"),
}


@pytest.mark.parametrize("name", MERGE_WRONG)
def test_merge_step_checker_rejects_typical_mistakes(name, capsys):
    fn, message = MERGE_WRONG[name]
    rejects(ch06.check_merge_step, fn, message, capsys)


# --------------------------------------------------------------------------- the fast trainer's update step
def package_update(word, count, pair, new, pair_counts):
    """The package's own update step (bpe_train.merge_pair) on a corpus of this one piece."""
    words, where = [list(word)], defaultdict(set, {pair: {0}})
    merge_pair(words, [count], where, pair_counts, *pair, new)
    return words[0]


def update(word, count, pair, new, pair_counts, subtract=True, add=True, weight=True, overlapping=False):
    new_word = ch06._merge_ids(word, pair, new, overlapping=overlapping)
    n = count if weight else 1
    if new_word != word:
        if subtract:
            for p in zip(word, word[1:]):
                pair_counts[p] -= n
        if add:
            for p in zip(new_word, new_word[1:]):
                pair_counts[p] += n
    return new_word


def neighbours_update(word, count, pair, new, pair_counts):
    """Per merge: the pair and its two neighbours go, two new neighbours come, read from the OLD word:
    with overlapping merges ('aaaa', 'abab') a neighbour is subtracted twice and a wrong pair added."""
    out, i = [], 0
    while i < len(word):
        if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
            pair_counts[pair] -= count
            if i > 0:
                pair_counts[(word[i - 1], pair[0])] -= count
                pair_counts[(word[i - 1], new)] += count
            if i + 2 < len(word):
                pair_counts[(pair[1], word[i + 2])] -= count
                pair_counts[(new, word[i + 2])] += count
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def rebuilt(word, count, pair, new, pair_counts):
    fresh = defaultdict(int, pair_counts)
    return update(word, count, pair, new, fresh)


def test_update_checker_accepts_the_reference_and_the_package(capsys):
    assert verdict(ch06.check_update_pair_counts, ch06.update_pair_counts, capsys)[0]
    assert verdict(ch06.check_update_pair_counts, package_update, capsys)[0]
    assert verdict(ch06.check_update_pair_counts, update, capsys)[0]


UPDATE_WRONG = {
    "old pairs not subtracted": (lambda *a: update(*a, subtract=False), "did not subtract the piece's old pairs"),
    "new pairs not added": (lambda *a: update(*a, add=False), "did not add its new ones"),
    "count ignored": (lambda *a: update(*a, weight=False), "subtract and add `count`, not 1"),
    "overlapping merge": (lambda *a: update(*a, overlapping=True), "merge left to right without overlap"),
    "neighbours double-counted": (neighbours_update, "the pair between two merges"),
    "a new dict": (rebuilt, "update the dict you were given, in place"),
    "no return": (lambda *a: None, "return the new word"),
    "crashes": (lambda word, count, pair, new, counts: counts.pop("missing"), "your function raised KeyError"),
}


@pytest.mark.parametrize("name", UPDATE_WRONG)
def test_update_checker_rejects_typical_mistakes(name, capsys):
    fn, message = UPDATE_WRONG[name]
    rejects(ch06.check_update_pair_counts, fn, message, capsys)


# --------------------------------------------------------------------------- encoding with a merge list
def package_encode(piece, merges):
    vocab = {i: bytes([i]) for i in range(256)}
    for a, b in merges:
        if a + b not in vocab.values():
            vocab[len(vocab)] = a + b
    tok = BPETokenizer(vocab, merges)
    return [tok.vocab[i] for i in tok.encode_piece(piece.decode("latin-1"))] if piece.isascii() else None


def test_encode_checker_accepts_the_reference_and_the_package(capsys):
    assert verdict(ch06.check_encode_piece, ch06.encode_piece, capsys)[0]
    assert verdict(ch06.check_encode_piece, package_encode, capsys)[0]


def sequential_replay(piece, merges):  # each merge, in order, everywhere: equal to rank order here
    tokens = tuple(bytes([b]) for b in piece)
    for pair in merges:
        tokens = ch06._merge(tokens, pair)
    return list(tokens)


def test_sequential_replay_is_accepted(capsys):
    assert verdict(ch06.check_encode_piece, sequential_replay, capsys)[0]


ENCODE_WRONG = {
    "leftmost pair first": (ch06._leftmost_first, "you merged the leftmost pair"),
    "last merge first": (lambda p, m: ch06.encode_piece(p, m[::-1]), "from the last learned to the first"),
    "longest match": (ch06._longest_match, "greedy longest-match"),
    "each merge once": (ch06._each_merge_once_first_occurrence, "not only the first"),
    "one merge only": (lambda p, m: ch06.encode_piece(p, m[:1]), "expected"),
    "no merge": (lambda p, m: [bytes([b]) for b in p], "keep merging until no adjacent pair is in the list"),
    "ids": (lambda p, m: list(p), "return a list of bytes tokens"),
    "str tokens": (lambda p, m: [t.decode() for t in ch06.encode_piece(p, m)], "return a list of bytes tokens"),
    "drops a byte": (lambda p, m: ch06.encode_piece(p, m)[:-1], "do not spell the piece"),
}


@pytest.mark.parametrize("name", ENCODE_WRONG)
def test_encode_checker_rejects_typical_mistakes(name, capsys):
    fn, message = ENCODE_WRONG[name]
    rejects(ch06.check_encode_piece, fn, message, capsys)


# --------------------------------------------------------------------------- the byte <-> unicode table
def table(printable_ranges=((0x21, 0x7E), (0xA1, 0xAC), (0xAE, 0xFF)), offset_by_byte=False):
    keep = [b for lo, hi in printable_ranges for b in range(lo, hi + 1)]
    out, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + (b if offset_by_byte else n))
            n += 1
    return out


def test_table_checker_accepts_correct_answers(capsys):
    assert verdict(ch06.check_bytes_to_unicode, table, capsys)[0]
    assert verdict(ch06.check_bytes_to_unicode, bytes_to_unicode, capsys)[0]


TABLE_WRONG = {
    "identity": (lambda: {b: chr(b) for b in range(256)}, "every byte maps to chr(byte)"),
    "offset by byte": (lambda: table(offset_by_byte=True), "chr(256 + n), not chr(256 + byte)"),
    "soft hyphen kept": (lambda: table(((0x21, 0x7E), (0xA1, 0xFF))), "soft hyphen"),
    "ascii only": (lambda: table(((0x21, 0x7E),)), "¡..¬ (0xA1-0xAC) and ®..ÿ (0xAE-0xFF)"),
    "not one-to-one": (lambda: {b: chr(b) if 0x21 <= b <= 0x7E else "?" for b in range(256)}, "one-to-one"),
    "space kept": (lambda: table(((0x20, 0x7E), (0xA1, 0xAC), (0xAE, 0xFF))), "the space (0x20) maps to itself"),
    "string keys": (lambda: {str(b): c for b, c in bytes_to_unicode().items()}, "the 256 ints 0..255"),
    "missing entries": (lambda: dict(list(bytes_to_unicode().items())[:255]), "got 255 keys"),
    "a list": (lambda: list(bytes_to_unicode().values()), "return a dict"),
    "two characters": (lambda: {b: c * 2 for b, c in bytes_to_unicode().items()}, "one character"),
}


@pytest.mark.parametrize("name", TABLE_WRONG)
def test_table_checker_rejects_typical_mistakes(name, capsys):
    fn, message = TABLE_WRONG[name]
    rejects(ch06.check_bytes_to_unicode, fn, message, capsys)


# --------------------------------------------------------------------------- splitting on special tokens
def package_split(text, specials):
    return [part for part, _ in split_on_specials(text, special_pattern(specials))]


def test_split_checker_accepts_correct_answers(capsys):
    assert verdict(ch06.check_split_on_specials, ch06.split_on_specials, capsys)[0]
    assert verdict(ch06.check_split_on_specials, package_split, capsys)[0]


def unescaped(text, specials):
    return [p for p in re.split("(" + "|".join(specials) + ")", text) if p] if specials else [text]


def listed_order(text, specials):
    return [p for p in re.split("(" + "|".join(map(re.escape, specials)) + ")", text) if p] if specials else [text]


def keeps_empty(text, specials):
    return re.split("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True))) + ")", text) \
        if specials else [text]


def drops_specials(text, specials):
    return [p for p in re.split("|".join(map(re.escape, sorted(specials, key=len, reverse=True))), text) if p] \
        if specials else [text]


def empty_pattern(text, specials):
    return [p for p in re.split("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True))) + ")",
                                text) if p]


SPLIT_WRONG = {
    "not escaped": (unescaped, "escape each token with re.escape"),
    "shorter first": (listed_order, "try the longest special tokens first"),
    "empty strings kept": (keeps_empty, "drop the empty strings"),
    "special tokens dropped": (drops_specials, "the special tokens disappeared"),
    "no special tokens splits everything": (empty_pattern, "with no special tokens the text is one part"),
    "a str": (lambda t, s: t, "return a list of str"),
    "whitespace split": (lambda t, s: t.split(), "no special token came out as an item of its own"),
    "characters": (lambda t, s: list(t), "no special token came out as an item of its own"),
    "loses text": (lambda t, s: ch06.split_on_specials(t, s)[1:], "do not add up to the text"),
}


@pytest.mark.parametrize("name", SPLIT_WRONG)
def test_split_checker_rejects_typical_mistakes(name, capsys):
    fn, message = SPLIT_WRONG[name]
    rejects(ch06.check_split_on_specials, fn, message, capsys)
