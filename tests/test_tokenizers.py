"""tfm_course.tokenizers: byte-level BPE (training, encoding, files, special tokens, streaming) and its parts."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from cuda_helpers import needs_cuda
from tfm_course.data import corpus
from tfm_course.tokenizers import (BPETokenizer, bytes_to_unicode, count_pieces, pretokenize, text_to_token,
                                   token_to_text, train_bpe, train_bpe_naive)
from tfm_course.tokenizers import default as default_module
from tfm_course.tokenizers.pretokenize import safe_cut, special_pattern
from tfm_course.tokenizers.bpe_train import hf_byte_ids

EOT = "<|endoftext|>"
EDGE_CASES = ["", " ", "  ", "\n", "\n\n\n", "\t x", "a  \n  b", "x\n  y", "trailing   ", "   leading",
              "héllo wörld", "naïve café", "e\u0301", "中文分词很难。", "日本語のテキスト", "한국어", "مرحبا بالعالم",
              "😀", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵", "x²+y²=z²", "\x00\x01\x7f", "tab\tand\r\nwindows",
              "it's we'll I'D they've", "3.14159 1,000,000 0xFF", "<|endoftext|>", "<|endoftext",
              "\u200b zero width", "\ufeffBOM"]


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train([d.text for d in corpus.documents("train")], 1024, [EOT])


# --------------------------------------------------------------------------- the byte <-> unicode table
def test_bytes_to_unicode_table():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā" and table[0xAD] == "Ń"
    assert all(table[b] == chr(b) for b in range(ord("!"), ord("~") + 1))
    assert token_to_text(b" the") == "Ġthe" and text_to_token("Ġthe") == b" the"
    everything = bytes(range(256))
    assert text_to_token(token_to_text(everything)) == everything
    with pytest.raises(ValueError, match="stands for no byte"):
        text_to_token("a b")  # a real space is not in the table


# --------------------------------------------------------------------------- pre-tokenisation
def test_gpt2_pretokenisation():
    assert pretokenize("Hello world's 123 !!") == ["Hello", " world", "'s", " 123", " !!"]
    assert pretokenize("a  b\n\n  c") == ["a", " ", " b", "\n\n ", " c"]
    assert pretokenize("I'll don't") == ["I", "'ll", " don", "'t"]
    assert pretokenize("x=1") == ["x", "=", "1"]
    assert "".join(pretokenize(corpus.text("validation"))) == corpus.text("validation")


# --------------------------------------------------------------------------- training
SMALL_TEXTS = [
    "aaabdaaabac",
    "low low low low low lower lower newest newest newest newest newest newest widest widest widest",
    "ab cd",
    "aaaaaaaaaa aaaa aaa a",
    "the cat sat on the mat; the dog sat on the log. It's 2024, we'll see 1234567 things!\n\n  Indented.",
    "中文中文中文 😀😀 😀 naïve naïve",
]


@pytest.mark.parametrize("text", SMALL_TEXTS + ["<random>"], ids=lambda t: t[:12])
def test_fast_trainer_equals_naive_trainer(text):
    if text == "<random>":  # many ties: a small alphabet, random words
        rng = random.Random(0)
        text = " ".join("".join(rng.choice("abc") for _ in range(rng.randint(1, 6))) for _ in range(300))
    for vocab_size in (260, 300, 400):
        assert train_bpe([text], vocab_size) == train_bpe_naive([text], vocab_size)


def test_fast_trainer_equals_naive_on_documents_with_special_tokens():
    docs = [d.text for d in corpus.documents("validation")[:24]]
    docs = [f"{a}{EOT}{b}" for a, b in zip(docs[::2], docs[1::2])]
    assert train_bpe(docs, 500, [EOT]) == train_bpe_naive(docs, 500, [EOT])


def test_tie_break_and_first_merges_by_hand():
    # "aaabdaaabac": aa occurs 4 times -> (a, a); then (aa, a) and (a, b) both occur twice:
    # the lexicographically greater pair of byte strings wins, (b"aa", b"a") > (b"a", b"b").
    _, merges = train_bpe(["aaabdaaabac"], 258)
    assert merges == [(b"a", b"a"), (b"aa", b"a")]
    # three pairs seen once each: (c, d) > (a, b) > (" ", c) byte-wise; then (" ", cd)
    _, merges = train_bpe(["ab cd"], 260)
    assert merges == [(b"c", b"d"), (b"a", b"b"), (b" ", b"cd")]


def test_hf_tie_break_by_hand():
    # HF tokenizers' rule: among equally frequent pairs the one with smaller ids wins, (id_a, id_b);
    # bytes are numbered by their printable character: letters first, the space (U+0120 'Ġ') at 220,
    # and every merged token after all 256 bytes, in creation order.
    assert hf_byte_ids()[ord("a")] < hf_byte_ids()[ord("c")] < hf_byte_ids()[ord(" ")] == 220
    _, merges = train_bpe(["ab cd"], 259, tie_break="hf")  # three pairs once each
    assert merges == [(b"a", b"b"), (b"c", b"d"), (b" ", b"cd")]  # the default gives (c, d) first
    # after (x, y), the pairs (xy, xy), (" ", a) and (a, b) tie: HF takes byte ids before merged ids
    _, merges = train_bpe(["xyxy ab"], 260, tie_break="hf")
    assert merges == [(b"x", b"y"), (b"a", b"b"), (b" ", b"ab"), (b"xy", b"xy")]
    _, merges = train_bpe(["xyxy ab"], 260)  # the default: the greater pair of byte strings
    assert merges == [(b"x", b"y"), (b"xy", b"xy"), (b"a", b"b"), (b" ", b"ab")]
    with pytest.raises(ValueError, match=r"tie_break must be one of \('greater', 'hf'\), got 'smaller'"):
        train_bpe(["ab"], 257, tie_break="smaller")


def test_merges_never_cross_pretokens_or_special_tokens():
    vocab, merges = train_bpe(["a.a.a.a.a.a.a.a."], 300)  # every piece is a single byte: no pair at all
    assert merges == [] and len(vocab) == 256
    _, merges = train_bpe(["x y x y x y x y"], 300)
    assert merges == [(b" ", b"y"), (b" ", b"x")]  # never b"x" + b" "
    _, merges = train_bpe([f"ab{EOT}ab{EOT}ab"], 300, [EOT])
    assert merges == [(b"a", b"b")]  # the special token's bytes are never counted
    vocab, _ = train_bpe([corpus.text("validation")[:30_000]], 700)
    assert not any(b" " in token.strip(b" ") and not token.isspace() for token in vocab.values())


def test_vocab_layout_and_truncation():
    docs = [d.text for d in corpus.documents("validation")]
    big = BPETokenizer.train(docs, 1500, [EOT, "[MASK]"])
    assert big.vocab_size == 1500 and len(big.merges) == 1500 - 256 - 2
    assert all(big.vocab[b] == bytes([b]) for b in range(256))
    assert big.special_ids == {EOT: 1498, "[MASK]": 1499}
    small = BPETokenizer.train(docs, 700, [EOT, "[MASK]"])
    cut = big.truncated(700)
    assert (cut.vocab, cut.merges, cut.special_ids) == (small.vocab, small.merges, small.special_ids)
    with pytest.raises(ValueError, match=r"in \[258, 1500\]"):
        big.truncated(2000)


def test_train_from_a_path_equals_train_from_the_text(tmp_path):
    text = "\n".join(d.text for d in corpus.documents("validation")[:300])
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    from_text = BPETokenizer.train(text, 600)
    from_file = BPETokenizer.train(path, 600)
    assert (from_file.vocab, from_file.merges) == (from_text.vocab, from_text.merges)


def test_count_pieces_counts_unique_pieces():
    counts = count_pieces(["the cat the", "the"])
    assert counts[b"the"] == 2 and counts[b" the"] == 1 and counts[b" cat"] == 1


# --------------------------------------------------------------------------- encoding / decoding
def test_round_trip_on_every_validation_docstring(tok):
    for doc in corpus.documents("validation"):
        assert tok.decode(tok.encode(doc.text)) == doc.text, doc.path


@pytest.mark.parametrize("text", EDGE_CASES)
def test_round_trip_edge_cases(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode_ordinary(text)) == text


def test_round_trip_random_unicode(tok):
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x0, 0x1F)]
    for _ in range(300):
        text = "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(0, 40)))
        assert tok.decode(tok.encode(text)) == text


def test_encoding_compresses_and_uses_learned_tokens(tok):
    text = corpus.text("validation")
    ids = tok.encode(text)
    assert 2.5 < len(text) / len(ids) < 5  # characters per token at 1k tokens
    assert tok.encode(" the") == [tok.merges.index((b" t", b"he")) + 256]


def test_decode_never_raises_on_invalid_utf8(tok):
    assert tok.decode([0xFF]) == "\ufffd"
    emoji = tok.encode("😀")
    first_byte = "😀".encode()[0]
    assert tok.decode([first_byte]) == "\ufffd" and tok.decode(emoji) == "😀"
    assert tok.decode([]) == ""


def test_special_tokens_are_single_ids_and_never_split(tok):
    eot = tok.special_ids[EOT]
    ids = tok.encode(f"Hello{EOT}world")
    assert ids.count(eot) == 1 and tok.decode(ids) == f"Hello{EOT}world"
    assert tok.encode(f"{EOT}{EOT}") == [eot, eot]
    assert eot not in tok.encode_ordinary(EOT) and tok.decode(tok.encode_ordinary(EOT)) == EOT
    assert tok.encode("<|endoftext") == tok.encode_ordinary("<|endoftext")  # a prefix is plain text


def test_overlapping_special_tokens_longest_first(tok):
    double = EOT + EOT
    t = BPETokenizer(tok.vocab, tok.merges, [EOT, double])
    single_id, double_id = t.special_ids[EOT], t.special_ids[double]
    assert single_id != double_id
    assert t.encode(EOT * 3) == [double_id, single_id]
    assert t.encode(f"a{EOT}{EOT}b")[1:-1] == [double_id]
    t2 = BPETokenizer(tok.vocab, tok.merges, ["<a>", "<a><b>"])
    assert t2.encode("<a><b><a>") == [t2.special_ids["<a><b>"], t2.special_ids["<a>"]]


def test_encode_iterable_equals_encode_on_any_chunking(tok):
    t = BPETokenizer(tok.vocab, tok.merges, [EOT, EOT + EOT])
    text = "".join(EDGE_CASES) + corpus.text("validation")[:5000] + f"x\n  y{EOT}{EOT}'ll  \n\n   z{EOT}"
    want = t.encode(text)
    rng = random.Random(0)
    for _ in range(30):
        cuts = sorted(rng.sample(range(len(text)), rng.randint(1, 200)))
        chunks = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        assert list(t.encode_iterable(chunks)) == want
    assert list(t.encode_iterable(list(text))) == want  # one character at a time
    assert list(t.encode_iterable(text.splitlines(keepends=True))) == want


def test_safe_cut_is_conservative():
    assert safe_cut("hello world", None, 0) == len("hello")  # " world" may still grow
    assert safe_cut("ab", None, 0) == 0
    pattern = special_pattern([EOT])
    text = f"abc {EOT}"
    assert safe_cut(text, pattern, len(EOT)) <= len(text) - len(EOT)


def test_encode_iterable_streams_a_large_file_with_bounded_memory(tok, tmp_path):
    block = "\n".join(d.text for d in corpus.documents("validation")[:50]) + "\n"
    assert block[0].isalpha() and not block.endswith("\n\n")  # so that blocks do not interact
    repeats = max(1, 2_000_000 // len(block))
    path = tmp_path / "big.txt"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeats):
            f.write(block)
    size = path.stat().st_size
    tok.encode(block)  # warm the piece cache, which is bounded separately (MAX_CACHED_PIECES)
    tracemalloc.start()
    with open(path, encoding="utf-8") as f:
        n_ids = sum(1 for _ in tok.encode_iterable(f))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n_ids == repeats * len(tok.encode(block))
    # measured: a peak of ~23 kB of Python objects, against ~31 MB to encode the same 2 MB in one call
    assert size > 1_500_000 and peak < 1_000_000, (size, peak)


# --------------------------------------------------------------------------- files
def test_save_and_from_files_round_trip(tok, tmp_path):
    vocab_path, merges_path = tok.save(tmp_path)
    assert merges_path.read_text(encoding="utf-8").splitlines()[:2] == ["#version: 0.2", "Ġ t"]
    entries = json.loads(vocab_path.read_text(encoding="utf-8"))
    assert entries["Ġ"] == 32 and entries[EOT] == tok.special_ids[EOT]
    loaded = BPETokenizer.from_files(vocab_path, merges_path, special_tokens=[EOT])
    assert (loaded.vocab, loaded.merges, loaded.special_ids) == (tok.vocab, tok.merges, tok.special_ids)
    text = corpus.text("validation")[:20_000] + EOT + "😀"
    assert loaded.encode(text) == tok.encode(text)


def test_from_files_rejects_malformed_files(tok, tmp_path):
    vocab_path, merges_path = tok.save(tmp_path)
    bad = tmp_path / "bad_merges.txt"
    bad.write_text("#version: 0.2\nĠ t h\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected two tokens"):
        BPETokenizer.from_files(vocab_path, bad)
    bad.write_text("Ġ zzzzzzzzzzzzzz\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not in the vocab"):
        BPETokenizer.from_files(vocab_path, bad)
    bad_vocab = tmp_path / "bad_vocab.json"
    bad_vocab.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON object"):
        BPETokenizer.from_files(bad_vocab, merges_path)


# --------------------------------------------------------------------------- bad input
def test_bad_input_gives_clear_errors(tok):
    with pytest.raises(ValueError, match=r"at least 256 bytes \+ 1 special tokens = 257, got 256"):
        BPETokenizer.train("some text", 256, [EOT])
    with pytest.raises(ValueError, match="vocab_size must be an int"):
        BPETokenizer.train("some text", 300.0)
    with pytest.raises(ValueError, match="expects a str, a pathlib.Path or an iterable of str, got int"):
        BPETokenizer.train(123, 300)
    with pytest.raises(ValueError, match="got bytes"):
        BPETokenizer.train(b"bytes", 300)
    with pytest.raises(ValueError, match="expected documents of text"):
        BPETokenizer.train(["ok", 5], 300)
    with pytest.raises(ValueError, match="a single str"):
        BPETokenizer.train("text", 300, special_tokens=EOT)
    with pytest.raises(ValueError, match="non-empty str"):
        BPETokenizer.train("text", 300, special_tokens=[""])
    for bad in (None, b"bytes", 42, ["a list"]):
        with pytest.raises(ValueError, match="text must be a str"):
            tok.encode(bad)
    with pytest.raises(ValueError, match="iterable of str"):
        list(tok.encode_iterable("a string"))
    with pytest.raises(ValueError, match="expected chunks of text"):
        list(tok.encode_iterable(["ok", 3]))
    with pytest.raises(ValueError, match=r"ids must be ints in the vocab \(0..1023\), got 5000"):
        tok.decode([1, 5000])
    with pytest.raises(ValueError, match="all 256 single bytes"):
        BPETokenizer({i: bytes([i]) for i in range(255)}, [])
    with pytest.raises(ValueError, match="not in the vocab"):
        BPETokenizer({i: bytes([i]) for i in range(256)}, [(b"a", b"b")])


def test_decode_accepts_a_tensor_or_an_array(tok):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    ids = tok.encode("hello world")
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == "hello world"


@needs_cuda
def test_decode_accepts_a_cuda_tensor(tok):
    import torch

    ids = tok.encode("hello world 😀")
    assert tok.decode(torch.tensor(ids, device="cuda")) == "hello world 😀"


# --------------------------------------------------------------------------- the shared default tokenizer
def test_default_tokenizer_is_trained_once_then_loaded_from_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("TFM_COURSE_CACHE", str(tmp_path))
    default_module._cached.cache_clear()
    try:
        first = default_module.default_tokenizer(512, special_tokens=("[PAD]", "[MASK]"))
        assert first is default_module.default_tokenizer(512, special_tokens=["[PAD]", "[MASK]"])
        assert first.vocab_size == 512 and first.special_ids == {"[PAD]": 510, "[MASK]": 511}
        assert len(list(tmp_path.glob("bpe-512-*/merges.txt"))) == 1
        default_module._cached.cache_clear()

        def no_training(*args, **kwargs):
            raise AssertionError("should have been loaded from the disk cache")

        monkeypatch.setattr(BPETokenizer, "train", no_training)
        again = default_module.default_tokenizer(512, special_tokens=("[PAD]", "[MASK]"))
        assert (again.vocab, again.merges, again.special_ids) == (first.vocab, first.merges, first.special_ids)
    finally:
        default_module._cached.cache_clear()
    with pytest.raises(ValueError, match="sequence of str"):
        default_module.default_tokenizer(512, special_tokens="[PAD]")


@pytest.fixture
def counted_training(monkeypatch):
    """BPETokenizer.train, counting its calls; the in-memory cache cleared before and after."""
    calls = []
    train = BPETokenizer.train.__func__

    def counting(cls, *args, **kwargs):
        calls.append(args[1:])
        return train(cls, *args, **kwargs)

    monkeypatch.setattr(BPETokenizer, "train", classmethod(counting))
    default_module._cached.cache_clear()
    yield calls
    default_module._cached.cache_clear()


def _fresh_default():
    default_module._cached.cache_clear()  # a new process: only the disk cache is left
    return default_module.default_tokenizer(300, special_tokens=())


def test_a_stale_or_damaged_tokenizer_cache_is_never_read(counted_training, monkeypatch, tmp_path):
    monkeypatch.setenv("TFM_COURSE_CACHE", str(tmp_path))
    want = _fresh_default()
    (folder,) = tmp_path.glob("bpe-300-*")
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "merges.txt", "vocab.json"]
    assert _fresh_default().merges == want.merges and len(counted_training) == 1, "a sound cache is read"
    good = {name: (folder / name).read_bytes() for name in ("manifest.json", "merges.txt", "vocab.json")}
    merges_lines = good["merges.txt"].splitlines(keepends=True)
    manifest = json.loads(good["manifest.json"])
    damaged = {
        # the worst kind: GPT-2 files that load without error, with the last merges missing
        "merges.txt truncated": {"merges.txt": b"".join(merges_lines[:-5])},
        "two merges swapped": {"merges.txt": b"".join(merges_lines[:1] + merges_lines[2:3] + merges_lines[1:2]
                                                      + merges_lines[3:])},
        "vocab.json edited": {"vocab.json": good["vocab.json"].replace(b'"!": 33', b'"!": 299')},
        "manifest of another key": {"manifest.json": json.dumps(dict(manifest, key="0" * 20)).encode()},
        "manifest missing": {"manifest.json": None},
        "manifest not JSON": {"manifest.json": b"{"},
    }
    for n, (what, changes) in enumerate(damaged.items(), start=2):
        for name, content in changes.items():
            if content is None:
                (folder / name).unlink()
            else:
                (folder / name).write_bytes(content)
        got = _fresh_default()
        assert len(counted_training) == n, f"{what}: the damaged cache was read"
        assert (got.vocab, got.merges) == (want.vocab, want.merges), what
        assert {name: (folder / name).read_bytes() for name in good} == good, f"{what}: not rewritten"
    assert [p.name for p in tmp_path.iterdir()] == [folder.name], "no temporary folder is left behind"


def test_default_tokenizer_works_without_a_usable_disk_cache(counted_training, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TFM_COURSE_CACHE", str(blocker / "cache"))  # cannot be created
    first, second = _fresh_default(), _fresh_default()
    assert first.merges == second.merges and len(counted_training) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    monkeypatch.setenv("TFM_COURSE_CACHE", "off")
    assert _fresh_default().merges == first.merges and len(counted_training) == 3
