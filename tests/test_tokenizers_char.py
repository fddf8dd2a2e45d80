"""tfm_course.tokenizers.CharTokenizer: one token per character, and what it cannot encode."""

import pytest

from tfm_course.tokenizers import CharTokenizer


def test_vocab_is_the_sorted_characters_then_the_specials():
    tok = CharTokenizer.train("hello world", special_tokens=["<pad>"])
    assert tok.vocab == {0: " ", 1: "d", 2: "e", 3: "h", 4: "l", 5: "o", 6: "r", 7: "w", 8: "<pad>"}
    assert tok.encode("hold") == [3, 5, 4, 1] and tok.decode([3, 5, 4, 1]) == "hold"
    assert tok.encode("lo<pad>") == [4, 5, 8] and tok.vocab_size == 9


def test_round_trip_unicode():
    text = "naïve café 中文 😀 👨‍👩‍👧"
    tok = CharTokenizer.train([text, "more"])
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("😀")) == 1 and len(tok.encode("👨‍👩‍👧")) == 5  # code points, not glyphs


def test_unknown_characters():
    tok = CharTokenizer.train("abc")
    with pytest.raises(ValueError, match=r"character 'z' \(U\+007A\) is not in the vocabulary of 3 tokens"):
        tok.encode("abz")
    with_unk = CharTokenizer.train("abc", unk_token="<unk>")
    assert with_unk.encode("azb") == [0, 3, 1] and with_unk.decode([0, 3, 1]) == "a<unk>b"


def test_min_count_and_bad_input():
    tok = CharTokenizer.train("aaab", min_count=2, unk_token="<unk>")
    assert tok.vocab == {0: "a", 1: "<unk>"}
    with pytest.raises(ValueError, match="expected text"):
        CharTokenizer.train(["ok", 1])
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab"])
    with pytest.raises(ValueError, match="text must be a str"):
        tok.encode(b"a")
    with pytest.raises(ValueError, match="ids must be ints"):
        tok.decode([7])


def test_decode_accepts_a_tensor():
    torch = pytest.importorskip("torch")
    tok = CharTokenizer.train("hello")
    assert tok.decode(torch.tensor(tok.encode("hole"))) == "hole"
