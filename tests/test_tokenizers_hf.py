"""Our BPE files load in Hugging Face's tokenizers and encode every validation docstring identically.

The ``tokenizers`` library (Rust) and ``transformers.GPT2Tokenizer`` (Python, GPT-2's original
algorithm) read our ``vocab.json`` / ``merges.txt``: the same ids is evidence that the file format,
the byte table, the pre-tokenisation and the rank-based merging all match GPT-2's.
"""

import pytest

from tfm_course.data import corpus

pytestmark = pytest.mark.hf  # CI runs these in the book's environment, which has Hugging Face's libraries
from tfm_course.tokenizers import BPETokenizer

EXTRA = ["Hello  world\n\n  x", "héllo 😀 中文 it's WE'LL I'd 12345 3.14", "\t\ttabs\r\n", "   ", "a\u00a0b"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tok = BPETokenizer.train([d.text for d in corpus.documents("train")], 2000)
    folder = tmp_path_factory.mktemp("bpe")
    vocab_path, merges_path = tok.save(folder)
    return tok, str(vocab_path), str(merges_path)


def test_rust_tokenizers_library_gives_the_same_ids(saved):
    tokenizers = pytest.importorskip("tokenizers")
    tok, vocab_path, merges_path = saved
    theirs = tokenizers.ByteLevelBPETokenizer(vocab_path, merges_path)
    texts = [d.text for d in corpus.documents("validation")] + EXTRA
    mismatched = [t for t in texts if theirs.encode(t).ids != tok.encode(t)]
    assert not mismatched, mismatched[:3]


def test_transformers_gpt2_tokenizer_gives_the_same_ids(saved):
    transformers = pytest.importorskip("transformers")
    tok, vocab_path, merges_path = saved
    theirs = transformers.GPT2Tokenizer(vocab_path, merges_path)
    texts = [d.text for d in corpus.documents("validation")[:400]] + EXTRA
    mismatched = [t for t in texts if theirs.encode(t) != tok.encode(t)]
    assert not mismatched, mismatched[:3]
    assert all(theirs.decode(tok.encode(t)) == t for t in EXTRA)


def test_hf_tie_break_reproduces_hf_trainer_merge_for_merge():
    """HF's BpeTrainer and ours with tie_break="hf" learn the same merges, in the same order.

    With the default rule the lists share most merges but first differ at a tie; this checks
    that the tie rule is the only difference between the two trainers on the course corpus.
    """
    tokenizers = pytest.importorskip("tokenizers")
    import os
    import tempfile

    from tfm_course.tokenizers import count_pieces
    from tfm_course.tokenizers.bpe_train import train_merges

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    docs = [d.text for d in corpus.documents("train")]
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=4096, min_frequency=0, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(docs, trainer)
    with tempfile.TemporaryDirectory() as folder:
        theirs = BPETokenizer.from_files(*hf.model.save(folder)).merges
    pieces = count_pieces(docs)
    ours = train_merges(pieces, 4096, tie_break="hf")[1]
    assert len(theirs) == 3840 and ours == theirs
    assert train_merges(pieces, 4096)[1] != theirs  # the default rule is a different rule
