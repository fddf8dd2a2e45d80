"""BERT's pretraining data: masking statistics and invariants, NSP pairs, pairs and batches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cuda_helpers import needs_cuda
from tfm_course.data.mlm import (IGNORE, build_pair, chunk, collate_pairs, mask_tokens, nsp_pairs,
                                 pack_documents, unigram_cross_entropy, word_start_table, word_starts_of)

PAD, CLS, SEP, MASK, UNK = 0, 1, 2, 3, 4
SPECIAL = (PAD, CLS, SEP, MASK, UNK)
Z = 5.0  # binomial bounds at five standard deviations: a correct function fails ~1 run in 10⁶


def within_binomial(successes: int, trials: int, p: float) -> bool:
    return abs(successes - trials * p) <= Z * math.sqrt(trials * p * (1 - p)) + 1


def padded_batch(batch: int, seq: int, vocab: int, seed: int = 0, min_len: int = 3):
    """``[CLS] tokens [SEP] [PAD]…`` rows of random lengths; returns ids and the special mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), vocab, (batch, seq), generator=g)
    lengths = torch.randint(min_len, seq + 1, (batch,), generator=g)
    positions = torch.arange(seq)[None, :]
    ids[:, 0] = CLS
    ids[positions == lengths[:, None] - 1] = SEP
    ids[positions >= lengths[:, None]] = PAD
    return ids, torch.isin(ids, torch.tensor([PAD, CLS, SEP]))


# --------------------------------------------------------------------------- MLM statistics
def test_each_row_gets_berts_count_and_at_least_one():
    ids, special = padded_batch(300, 40, 100)
    ids[0, 1:] = PAD
    ids[0, 1:3] = torch.tensor([7, SEP])  # row 0: [CLS] 7 [SEP] — one maskable token
    special = torch.isin(ids, torch.tensor([PAD, CLS, SEP]))
    _, labels = mask_tokens(ids, special, 100, MASK, generator=torch.Generator().manual_seed(1))
    n_real = (~special).sum(1)
    expected = torch.round(0.15 * n_real).clamp(min=1)
    assert torch.equal((labels != IGNORE).sum(1), expected.long())
    assert (labels[0] != IGNORE).sum() == 1


def test_every_maskable_position_is_chosen_equally_often():
    ids, special = padded_batch(1, 30, 50, seed=3)
    n_real = int((~special).sum())
    k = max(1, round(0.15 * n_real))
    draws = 2000
    g = torch.Generator().manual_seed(0)
    counts = sum((mask_tokens(ids, special, 50, MASK, generator=g)[1] != IGNORE).long()
                 for _ in range(draws))[0]
    assert (counts[special[0]] == 0).all(), "special positions are never chosen"
    assert all(within_binomial(int(c), draws, k / n_real) for c in counts[~special[0]])


@pytest.mark.parametrize("p", [0.15, 0.4])
def test_fraction_chosen_and_the_80_10_10_split(p):
    vocab = 60
    ids, special = padded_batch(400, 64, vocab, seed=2)
    g = torch.Generator().manual_seed(int(p * 100))
    inputs, labels = mask_tokens(ids, special, vocab, MASK, p=p, generator=g)
    chosen = labels != IGNORE
    n_chosen, n_real = int(chosen.sum()), int((~special).sum())
    assert within_binomial(n_chosen, n_real, p)
    masked = int((inputs[chosen] == MASK).sum())
    replaced = int(((inputs != ids) & (inputs != MASK))[chosen].sum())
    kept = int((inputs == ids)[chosen].sum())
    allowed = vocab - len(SPECIAL) + 1  # UNK is absent from the batch and not passed: drawable
    assert masked + replaced + kept == n_chosen
    assert within_binomial(masked, n_chosen, 0.8)
    assert within_binomial(replaced, n_chosen, 0.1 * (1 - 1 / allowed))  # a draw may hit the original
    assert within_binomial(kept, n_chosen, 0.1 + 0.1 / allowed)


def test_random_replacements_cover_the_non_special_tokens_uniformly():
    vocab = 13
    ids, special = padded_batch(2000, 32, vocab, seed=4)
    inputs, labels = mask_tokens(ids, special, vocab, MASK, generator=torch.Generator().manual_seed(5),
                                 special_ids=SPECIAL)
    replaced = inputs[(labels != IGNORE) & (inputs != ids) & (inputs != MASK)]
    assert not torch.isin(replaced, torch.tensor(SPECIAL)).any()
    counts = torch.bincount(replaced, minlength=vocab)[len(SPECIAL):]
    assert all(within_binomial(int(c), len(replaced), 1 / len(counts)) for c in counts)


def test_special_ids_absent_from_the_batch_are_excluded_only_when_named():
    vocab = 8  # few drawable ids, so UNK would show up if allowed
    ids, special = padded_batch(500, 20, vocab, seed=6)
    g = torch.Generator().manual_seed(0)
    inputs, _ = mask_tokens(ids, special, vocab, MASK, generator=g)
    assert (inputs == UNK).any(), "UNK is never in the batch: without special_ids it is drawable"
    inputs, _ = mask_tokens(ids, special, vocab, MASK, generator=g, special_ids=[UNK])
    assert not (inputs == UNK).any()


# --------------------------------------------------------------------------- whole words
def word_table(vocab: int, seed: int = 0, share_starts: float = 0.55):
    """A random per-id word-start table: about ``share_starts`` of the ordinary ids begin a word."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(vocab, generator=g) < share_starts
    table[list(SPECIAL)] = True
    return table


def words_of(row_ids, row_special, table):
    """The words of one row as lists of positions, by hand: a start and the ordinary tokens after it."""
    words, current = [], None
    for t, (i, s) in enumerate(zip(row_ids.tolist(), row_special.tolist())):
        if s:
            current = None
            continue
        if current is None or table[i]:
            current = [t]
            words.append(current)
        else:
            current.append(t)
    return words


def test_whole_words_are_chosen_together_within_the_budget():
    vocab = 60
    table = word_table(vocab)
    ids, special = padded_batch(300, 40, vocab, seed=11)
    for p in (0.15, 0.4):
        inputs, labels = mask_tokens(ids, special, vocab, MASK, p=p, special_ids=SPECIAL, word_starts=table,
                                     generator=torch.Generator().manual_seed(2))
        chosen = labels != IGNORE
        assert not (chosen & special).any(), "special tokens are never chosen"
        assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
        n_real = (~special).sum(1)
        k = torch.round(p * n_real).clamp(min=1)
        assert (chosen.sum(1) <= k).all(), "never more than round(p * n) tokens"
        for row in range(len(ids)):
            words = words_of(ids[row], special[row], table)
            assert sum(map(len, words)) == int(n_real[row])
            left = int(k[row]) - int(chosen[row].sum())
            for word in words:
                picked = chosen[row, word]
                assert picked.all() or not picked.any(), f"row {row}: word {word} chosen in part"
                if not picked.any():  # BERT's greedy rule: a skipped word did not fit
                    assert len(word) > left, f"row {row}: word {word} fits in the {left} tokens left"
        n_chosen, n_tokens = int(chosen.sum()), int(n_real.sum())
        assert n_chosen >= 0.97 * float(k.sum())  # short words fill the budget almost always
        assert within_binomial(n_chosen, n_tokens, p)


def test_every_word_is_chosen_about_equally_often():
    vocab = 40
    table = word_table(vocab, seed=5)
    ids, special = padded_batch(1, 30, vocab, seed=9, min_len=30)
    words = words_of(ids[0], special[0], table)
    singles = [w for w in words if len(w) == 1]
    assert len(singles) >= 5 and any(len(w) > 1 for w in words)
    draws, g = 3000, torch.Generator().manual_seed(0)
    counts = sum((mask_tokens(ids, special, vocab, MASK, p=0.3, generator=g, word_starts=table)[1] != IGNORE).long()
                 for _ in range(draws))[0]
    share = [int(counts[w[0]]) for w in singles]  # single-token words compete on equal terms
    mean = sum(share) / len(share)
    assert all(within_binomial(c, draws, mean / draws) for c in share)
    assert all(counts[w[0]] > 0 for w in words), "every word, long ones too, is chosen sometimes"


def test_without_word_starts_or_with_every_token_a_word_the_masking_is_the_same_rule():
    vocab = 50
    ids, special = padded_batch(200, 32, vocab, seed=12)
    every = torch.ones(vocab, dtype=torch.bool)
    _, labels = mask_tokens(ids, special, vocab, MASK, word_starts=every, generator=torch.Generator().manual_seed(1))
    k = torch.round(0.15 * (~special).sum(1)).clamp(min=1)
    assert torch.equal((labels != IGNORE).sum(1), k.long())  # single-token words: exactly k per row


def test_word_starts_by_position_equal_the_table_read_at_the_ids():
    vocab = 50
    table = word_table(vocab, seed=3)
    ids, special = padded_batch(16, 24, vocab, seed=13)
    starts = word_starts_of(ids, special, table)
    assert starts[:, 0].all() and starts[special].all()
    assert (starts[:, 1:][special[:, :-1]]).all(), "the token after a special one begins a word"
    by_table = mask_tokens(ids, special, vocab, MASK, word_starts=table, generator=torch.Generator().manual_seed(4))
    by_position = mask_tokens(ids, special, vocab, MASK, word_starts=table[ids],
                              generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(a, b) for a, b in zip(by_table, by_position))


def test_word_start_table_of_the_byte_level_bpe():
    from tfm_course.tokenizers import default_tokenizer
    tok = default_tokenizer(1024, special_tokens=("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    table = word_start_table(tok)
    assert table.shape == (tok.vocab_size,) and table.dtype == torch.bool
    assert table[list(tok.special_ids.values())].all()
    ids = tok.encode_ordinary("Return the sum, or raise ValueError.\n")
    pieces = [tok.decode([i]) for i in ids]
    starts = [bool(table[i]) for i in ids]
    for piece, start in zip(pieces, starts):
        if piece[0] in " ,.\n":
            assert start, f"{piece!r} begins with a space or punctuation: a word start"
        elif piece[0].isalnum():
            assert not start, f"{piece!r} begins with a letter: it continues a word"
    assert "".join(pieces) == "Return the sum, or raise ValueError.\n"
    for i, token in tok.vocab.items():  # a piece of a UTF-8 character never begins a word
        if token[:1] and token[0] >= 0x80 and i not in tok.special_ids.values():
            assert not table[i]


@pytest.mark.parametrize("bad, message", [
    (torch.ones(7, dtype=torch.bool), r"7 entries, expected one per id"),
    (torch.ones(3, 5, dtype=torch.bool), r"shape \(vocab_size,\) or \(batch, seq\) = \(4, 16\), got \(3, 5\)"),
    (torch.ones(50), r"bool tensor"),
])
def test_word_starts_reject_bad_input(bad, message):
    ids, special = padded_batch(4, 16, 50)
    with pytest.raises(ValueError, match=message):
        mask_tokens(ids, special, 50, MASK, word_starts=bad)
    with pytest.raises(ValueError, match="tokenizer"):
        word_start_table(object())


# --------------------------------------------------------------------------- MLM invariants
def test_invariants_of_inputs_and_labels():
    ids, special = padded_batch(64, 48, 90, seed=7)
    original = ids.clone()
    inputs, labels = mask_tokens(ids, special, 90, MASK, generator=torch.Generator().manual_seed(0))
    chosen = labels != IGNORE
    assert torch.equal(ids, original), "the input is not modified in place"
    assert inputs.shape == labels.shape == ids.shape and inputs.dtype == labels.dtype == ids.dtype
    assert not (chosen & special).any()
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])
    assert (chosen.sum(1) >= 1).all()


def test_a_row_with_nothing_to_mask_gets_no_label():
    ids = torch.tensor([[CLS, 7, SEP], [CLS, SEP, PAD]])
    special = torch.isin(ids, torch.tensor([PAD, CLS, SEP]))
    inputs, labels = mask_tokens(ids, special, 10, MASK)
    assert labels[0].tolist() == [IGNORE, 7, IGNORE] and (labels[1] == IGNORE).all()
    assert torch.equal(inputs[1], ids[1])


def test_the_loss_reads_only_the_chosen_positions():
    ids, special = padded_batch(4, 16, 30, seed=8)
    _, labels = mask_tokens(ids, special, 30, MASK, generator=torch.Generator().manual_seed(0))
    logits = torch.randn(4, 16, 30, requires_grad=True)
    F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE).backward()
    touched = logits.grad.abs().sum(-1) > 0
    assert torch.equal(touched, labels != IGNORE)


def test_the_same_generator_seed_gives_the_same_masking():
    ids, special = padded_batch(8, 32, 40)
    first = mask_tokens(ids, special, 40, MASK, generator=torch.Generator().manual_seed(3))
    again = mask_tokens(ids, special, 40, MASK, generator=torch.Generator().manual_seed(3))
    other = mask_tokens(ids, special, 40, MASK, generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_masking_never_reads_the_device_back_to_the_host():
    """On the meta device a host read (``.item()``, ``int(t.max())``, a ``nonzero``) would fail:
    running there shows one call costs no GPU -> CPU sync."""
    ids, special = padded_batch(4, 16, 40)
    inputs, labels = mask_tokens(ids.to("meta"), special.to("meta"), 40, MASK, special_ids=SPECIAL)
    assert inputs.device.type == labels.device.type == "meta" and inputs.shape == (4, 16)
    table = torch.ones(40, dtype=torch.bool, device="meta")
    inputs, labels = mask_tokens(ids.to("meta"), special.to("meta"), 40, MASK, word_starts=table)
    assert labels.device.type == "meta" and labels.shape == (4, 16)


@needs_cuda
def test_masking_runs_on_the_gpu_with_a_gpu_generator():
    ids, special = padded_batch(32, 64, 100)
    ids, special = ids.cuda(), special.cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs, labels = mask_tokens(ids, special, 100, MASK, generator=g, special_ids=SPECIAL)
    assert inputs.is_cuda and labels.is_cuda
    chosen = labels != IGNORE
    assert not (chosen & special).any() and (chosen.sum(1) >= 1).all()
    assert not torch.isin(inputs[chosen & (inputs != MASK)], torch.tensor(SPECIAL[:3], device="cuda")).any()


@pytest.mark.parametrize("change, message", [
    (dict(p=0.0), "strictly between 0 and 1"),
    (dict(p=1.0), "strictly between 0 and 1"),
    (dict(p=-0.2), "strictly between 0 and 1"),
    (dict(ids=torch.zeros(3, 4)), "integer tensor"),
    (dict(ids=torch.zeros(4, dtype=torch.long)), r"\(batch, seq\)"),
    (dict(special_mask=torch.zeros(2, 4, dtype=torch.bool)), "shape and device"),
    (dict(special_mask=torch.zeros(3, 4, dtype=torch.long)), "bool tensor"),
    (dict(mask_id=10), "mask_id"),
    (dict(vocab_size=5), r"ids must lie in \[0, vocab_size=5\)"),
    (dict(special_ids=[3, 99]), "special_ids"),
])
def test_mask_tokens_rejects_bad_input(change, message):
    args = dict(ids=torch.full((3, 4), 7), special_mask=torch.zeros(3, 4, dtype=torch.bool),
                vocab_size=10, mask_id=MASK) | change
    with pytest.raises(ValueError, match=message):
        mask_tokens(**args)


# --------------------------------------------------------------------------- NSP
def _documents(first_token: int, count: int, seed: int) -> list[list[list[int]]]:
    """Documents whose every token is unique: token t lives in exactly one place."""
    g = torch.Generator().manual_seed(seed)
    docs, token = [], first_token
    for _ in range(count):
        doc = []
        for _ in range(int(torch.randint(1, 6, (1,), generator=g))):
            length = int(torch.randint(1, 5, (1,), generator=g))
            doc.append(list(range(token, token + length)))
            token += length
        docs.append(doc)
    return docs


def test_nsp_pairs_are_consecutive_or_from_another_document():
    docs = _documents(10, 200, seed=0)
    where = {tuple(s): (d, i) for d, doc in enumerate(docs) for i, s in enumerate(doc)}
    pairs = nsp_pairs(docs, seed=1)
    assert len(pairs) == sum(len(doc) - 1 for doc in docs)
    for a, b, label in pairs:
        (doc_a, i), (doc_b, j) = where[tuple(a)], where[tuple(b)]
        if label == 0:
            assert doc_a == doc_b and j == i + 1
        else:
            assert label == 1 and doc_a != doc_b
    assert within_binomial(sum(label == 0 for *_, label in pairs), len(pairs), 0.5)


def test_nsp_pairs_never_cross_the_split():
    train, valid = _documents(10, 150, seed=2), _documents(100_000, 50, seed=3)
    for docs, low, high in ((train, 10, 100_000), (valid, 100_000, math.inf)):
        pairs = nsp_pairs(docs, seed=4)
        assert all(low <= t < high for a, b, _ in pairs for t in a + b)
        assert any(label == 1 for *_, label in pairs)


def test_nsp_pairs_are_reproducible_and_reject_bad_input():
    docs = _documents(10, 30, seed=5)
    assert nsp_pairs(docs, seed=7) == nsp_pairs(docs, seed=7) != nsp_pairs(docs, seed=8)
    with pytest.raises(ValueError, match="two non-empty documents"):
        nsp_pairs(docs[:1] + [[]])
    with pytest.raises(ValueError, match="p_next"):
        nsp_pairs(docs, p_next=1.0)


def test_chunk_cuts_a_document_into_segments():
    assert chunk(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="positive"):
        chunk([1, 2], 0)


# --------------------------------------------------------------------------- pairs and batches
def test_build_pair_layout_and_segments():
    ids, segments = build_pair([5, 6], [7, 8, 9], CLS, SEP)
    assert ids == [CLS, 5, 6, SEP, 7, 8, 9, SEP]
    assert segments == [0, 0, 0, 0, 1, 1, 1, 1]
    ids, segments = build_pair(list(range(10, 20)), [7, 8], CLS, SEP, max_len=9)
    assert ids == [CLS, 10, 11, 12, 13, SEP, 7, 8, SEP], "the longer segment is cut, from its end"
    assert segments == [0] * 6 + [1] * 3
    with pytest.raises(ValueError, match="at least 5"):
        build_pair([1], [2], CLS, SEP, max_len=4)


def test_collate_pairs_masks_exactly_the_special_positions():
    pairs = [([5, 6], [7], 0), ([8], [9, 10, 11], 1), ([12] * 20, [13] * 20, 1)]
    batch = collate_pairs(pairs, CLS, SEP, PAD, max_len=12)
    assert batch["ids"].shape == (3, 12) and batch["nsp_labels"].tolist() == [0, 1, 1]
    assert batch["ids"][0].tolist() == [CLS, 5, 6, SEP, 7, SEP] + [PAD] * 6
    assert batch["segment_ids"][1].tolist()[:7] == [0, 0, 0, 1, 1, 1, 1]
    special = torch.isin(batch["ids"], torch.tensor([PAD, CLS, SEP]))
    assert torch.equal(batch["special_mask"], special)
    assert torch.equal(batch["attention_mask"], batch["ids"] != PAD)
    _, labels = mask_tokens(batch["ids"], batch["special_mask"], 30, MASK)
    assert not ((labels != IGNORE) & special).any()
    with pytest.raises(ValueError, match="empty"):
        collate_pairs([], CLS, SEP, PAD, 8)


def test_pack_documents_wraps_rows_in_cls_and_sep():
    rows = pack_documents([[5, 6, 7], [8, 9], [10, 11, 12, 13]], seq_len=5, cls_id=CLS, sep_id=SEP)
    assert rows.tolist() == [[CLS, 5, 6, 7, SEP], [CLS, SEP, 8, 9, SEP], [CLS, SEP, 10, 11, SEP],
                             [CLS, 12, 13, SEP, SEP]]  # documents joined by [SEP]
    with pytest.raises(ValueError, match="fewer than one row"):
        pack_documents([[5]], seq_len=10, cls_id=CLS, sep_id=SEP)


def test_unigram_cross_entropy_is_the_entropy_of_the_frequencies():
    ids = torch.tensor([5] * 5000 + [6] * 3000 + [7] * 2000)
    entropy = -sum(q * math.log(q) for q in (0.5, 0.3, 0.2))
    assert abs(unigram_cross_entropy(ids, ids, 10) - entropy) < 1e-3
    uniform = torch.arange(10).repeat(100)
    assert abs(unigram_cross_entropy(uniform, torch.tensor([3]), 10) - math.log(10)) < 1e-9
    with pytest.raises(ValueError, match="lie in"):
        unigram_cross_entropy(ids, torch.tensor([10]), 10)
