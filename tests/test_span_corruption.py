"""tfm_course.data.span_corruption: T5's noise mask, sentinels, lengths."""

from __future__ import annotations

import collections
import random

import pytest
import torch

from tfm_course.data.span_corruption import (fill_spans, noise_counts, random_spans_noise_mask,
                                             span_corrupt, span_corrupt_batch, t5_lengths,
                                             t5_raw_length, t5_sentinel_ids)

V, EOS = 1000, 1
SENTINELS = t5_sentinel_ids(V)


def runs(mask: torch.Tensor) -> list[tuple[bool, int]]:
    """[(value, run length), ...] of a 1-D bool tensor."""
    out: list[tuple[bool, int]] = []
    for value in mask.tolist():
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


LENGTHS = list(range(1, 80)) + random.Random(0).sample(range(80, 2000), 40) + [568]


# --------------------------------------------------------------------------- the mask
@pytest.mark.parametrize("length", LENGTHS)
def test_noise_mask_invariants(length):
    g = torch.Generator().manual_seed(length)
    n_noise, n_spans = noise_counts(length)
    for _ in range(3):
        mask = random_spans_noise_mask(length, generator=g)
        assert mask.dtype == torch.bool and mask.shape == (length,)
        assert int(mask.sum()) == n_noise
        spans = runs(mask)
        assert spans[0][0] is False, "starts with kept tokens"
        if length >= 2:
            assert spans[-1][0] is True, "T5's masks end with a noise span"
            assert sum(value for value, _ in spans) == n_spans  # number of noise spans
            assert len(spans) == 2 * n_spans  # kept and noise alternate
        else:
            assert (n_noise, n_spans) == (0, 0) and not mask.any()


def test_noise_counts_follow_t5():
    assert noise_counts(568) == (85, 28)  # round(85.2), round(28.33)
    assert noise_counts(1) == (0, 0)  # T5 lifts L=1 to 2 and keeps the first token
    assert noise_counts(2) == (1, 1) and noise_counts(3) == (1, 1)  # clamped to [1, L-1]
    assert noise_counts(10) == (2, 1)  # 1.5 rounds half to even: 2
    assert noise_counts(190) == (29, 10)  # float32 28.500002, as in T5's TensorFlow code
    assert noise_counts(100, noise_density=0.5, mean_span_length=5) == (50, 10)
    assert noise_counts(50, noise_density=0.0) == (0, 0)
    assert not random_spans_noise_mask(50, noise_density=0.0).any()


def test_short_masks_always_drop_the_end():
    """Up to 30 tokens there is one noise span, and it always ends the text (T5's mask, not a bug here)."""
    g = torch.Generator().manual_seed(0)
    for length in (5, 20, 30):
        n_noise = noise_counts(length)[0]
        for _ in range(5):
            assert random_spans_noise_mask(length, generator=g).tolist() == \
                [False] * (length - n_noise) + [True] * n_noise
    masks = {tuple(random_spans_noise_mask(31, generator=g).tolist()) for _ in range(20)}
    assert len(masks) > 5  # from 31 tokens on there are two spans to place


def test_all_segmentations_equally_likely():
    """40 tokens have 6 noise tokens in 2 spans: the 5 ways to split them must be equally frequent."""
    g = torch.Generator().manual_seed(1)
    counts = collections.Counter()
    n = 3000
    for _ in range(n):
        spans = runs(random_spans_noise_mask(40, generator=g))
        counts[tuple(length for value, length in spans if value)] += 1
    assert set(counts) == {(1, 5), (2, 4), (3, 3), (4, 2), (5, 1)}
    for count in counts.values():  # each 600 expected; 5 sigma ≈ 110
        assert abs(count - n / 5) < 110, counts


def test_mask_mean_span_length_over_many_masks():
    g = torch.Generator().manual_seed(2)
    lengths = [length for _ in range(50)
               for value, length in runs(random_spans_noise_mask(568, generator=g)) if value]
    assert sum(lengths) / len(lengths) == pytest.approx(85 / 28)
    assert min(lengths) >= 1 and max(lengths) > 6  # spans vary in length


def test_mask_is_reproducible_with_a_generator():
    a = random_spans_noise_mask(200, generator=torch.Generator().manual_seed(5))
    b = random_spans_noise_mask(200, generator=torch.Generator().manual_seed(5))
    c = random_spans_noise_mask(200, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


# --------------------------------------------------------------------------- corrupting
WORDS = "Thank you for inviting me to your party last week .".split()


def test_the_papers_example():
    vocab = {w: i + 2 for i, w in enumerate(WORDS)}
    names = {**{i: w for w, i in vocab.items()}, SENTINELS[0]: "<X>", SENTINELS[1]: "<Y>",
             SENTINELS[2]: "<Z>", EOS: "</s>"}
    ids = torch.tensor([vocab[w] for w in WORDS])
    mask = torch.tensor([w in ("for", "inviting", "last") for w in WORDS])
    inputs, targets = span_corrupt(ids, SENTINELS, eos_id=EOS, noise_mask=mask)
    assert " ".join(names[t] for t in inputs.tolist()) == "Thank you <X> me to your party <Y> week . </s>"
    assert " ".join(names[t] for t in targets.tolist()) == "<X> for inviting <Y> last <Z> </s>"
    assert fill_spans(inputs, targets, SENTINELS, EOS) == ids.tolist()


def test_sentinels_follow_the_tokenizers_length_by_the_documented_rule():
    """<extra_id_i> = len(tokenizer) - 1 - i: t5-small's tokenizer has 32,000 pieces and 100 extra ids."""
    tokenizer_length = 32_000 + 100
    assert t5_sentinel_ids(tokenizer_length) == [tokenizer_length - 1 - i for i in range(100)]
    assert t5_sentinel_ids(tokenizer_length, 1) == [32_099]
    embedding_rows = 32_128  # t5-small's config.vocab_size: the tokenizer padded to a multiple of 128
    assert embedding_rows % 128 == 0 and embedding_rows > tokenizer_length
    wrong = t5_sentinel_ids(embedding_rows, 100)  # the pitfall: rows no token has, then off by 28
    assert all(i >= tokenizer_length for i in wrong[:28]) and wrong[28] == tokenizer_length - 1


def test_sentinels_match_an_offline_t5_tokenizer():
    """Hugging Face's T5Tokenizer, built offline with Google's layout (<pad>, </s>, <unk>, the
    pieces, then <extra_id_99> ... <extra_id_0>): the ids come from len(tokenizer)."""
    transformers = pytest.importorskip("transformers")
    pieces = [(f"\u2581w{i}", -float(i)) for i in range(500)]
    vocab = ([("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces
             + [(f"<extra_id_{i}>", 0.0) for i in range(99, -1, -1)])
    tokenizer = transformers.T5Tokenizer(vocab=vocab)
    theirs = tokenizer.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(100)])
    assert len(tokenizer) == len(vocab) and t5_sentinel_ids(len(tokenizer)) == theirs
    rows = -(-len(tokenizer) // 128) * 128  # an embedding padded as Google's are
    assert t5_sentinel_ids(rows) != theirs


def test_sentinels_count_down_from_the_top_of_the_vocabulary():
    assert t5_sentinel_ids(32100, 3) == [32099, 32098, 32097]  # <extra_id_0>, <extra_id_1>, ...
    ids = torch.arange(2, 302)
    inputs, targets = span_corrupt(ids, SENTINELS, generator=torch.Generator().manual_seed(0))
    used = [t for t in inputs.tolist() if t in SENTINELS]
    assert used == SENTINELS[:len(used)] and len(used) == noise_counts(300)[1]
    assert [t for t in targets.tolist() if t in SENTINELS] == used


@pytest.mark.parametrize("length", LENGTHS)
def test_span_corrupt_invariants(length):
    g = torch.Generator().manual_seed(1000 + length)
    ids = torch.randint(2, V - 100, (length,), generator=g)  # no sentinel or EOS in the text
    mask = random_spans_noise_mask(length, generator=g)
    inputs, targets = span_corrupt(ids, SENTINELS, eos_id=EOS, noise_mask=mask)
    assert (inputs.numel(), targets.numel()) == t5_lengths(length)
    assert inputs.dtype == targets.dtype == torch.long
    assert inputs[-1] == EOS and targets[-1] == EOS
    assert inputs[0] == ids[0]  # the text starts with kept tokens
    assert targets[0] == SENTINELS[0]
    assert fill_spans(inputs, targets, SENTINELS, EOS) == ids.tolist()  # nothing lost
    # the kept tokens are in the input in order, the dropped ones in the target
    assert [t for t in inputs[:-1].tolist() if t not in SENTINELS] == ids[~mask].tolist()
    assert [t for t in targets[:-1].tolist() if t not in SENTINELS] == ids[mask].tolist()
    # the final sentinel: the target ends with one exactly when the text ends with kept tokens
    ends_kept = not bool(mask[-1])
    assert (int(targets[-2]) in SENTINELS) == ends_kept
    assert (int(inputs[-2]) in SENTINELS) == (not ends_kept)


def test_a_text_ending_with_kept_tokens_gets_a_final_sentinel():
    ids = torch.arange(10, 20)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[2, 3, 6]] = True
    inputs, targets = span_corrupt(ids, SENTINELS, eos_id=EOS, noise_mask=mask)
    assert targets.tolist() == [SENTINELS[0], 12, 13, SENTINELS[1], 16, SENTINELS[2], EOS]
    assert inputs.tolist() == [10, 11, SENTINELS[0], 14, 15, SENTINELS[1], 17, 18, 19, EOS]


def test_edge_lengths_one_to_three():
    for length, want_in, want_tgt in ((1, [5, EOS], [SENTINELS[0], EOS]),
                                      (2, [5, SENTINELS[0], EOS], [SENTINELS[0], 6, EOS]),
                                      (3, [5, 6, SENTINELS[0], EOS], [SENTINELS[0], 7, EOS])):
        inputs, targets = span_corrupt(torch.arange(5, 5 + length), SENTINELS, eos_id=EOS)
        assert inputs.tolist() == want_in and targets.tolist() == want_tgt
        assert (len(want_in), len(want_tgt)) == t5_lengths(length)


def test_without_eos_and_from_a_list():
    inputs, targets = span_corrupt([7, 8, 9, 10], SENTINELS, noise_mask=torch.tensor([0, 0, 1, 1]).bool())
    assert inputs.tolist() == [7, 8, SENTINELS[0]] and targets.tolist() == [SENTINELS[0], 9, 10]
    assert t5_lengths(4, eos=False) == (4, 2)  # 1 noise token: kept 3 + 1 sentinel; 1 + 1


def test_batch_has_t5_lengths_and_fresh_masks():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 800, (6, 114), generator=g)
    inputs, targets = span_corrupt_batch(ids, SENTINELS, EOS, generator=g)
    assert inputs.shape == (6, t5_lengths(114)[0]) and targets.shape == (6, t5_lengths(114)[1])
    assert len({tuple(row.tolist()) for row in targets}) == 6
    for row, i, t in zip(ids, inputs, targets):
        assert fill_spans(i, t, SENTINELS, EOS) == row.tolist()


# --------------------------------------------------------------------------- lengths
def test_t5_lengths_golden():
    assert t5_lengths(568) == (512, 114)  # the T5 paper's setting
    assert t5_raw_length(512) == 568
    assert t5_lengths(t5_raw_length(128))[0] <= 128 < t5_lengths(t5_raw_length(128) + 1)[0]
    assert t5_raw_length(2) == 1


def test_t5_lengths_agree_with_t5s_helper_formula_away_from_float32_ties():
    """T5's random_spans_helper: kept + spans + 1 and noise + spans + 1, counted in float64."""
    for raw in range(10, 1500):  # below 10, round(n_noise / 3) is 0 and T5 clamps it to 1
        n_noise = int(round(raw * 0.15))
        if n_noise != noise_counts(raw)[0]:
            continue  # float32 vs float64 at .5 ties (190, 350, ...)
        n_spans = int(round(n_noise / 3.0))
        assert t5_lengths(raw) == (raw - n_noise + n_spans + 1, n_noise + n_spans + 1), raw


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, match", [
    (lambda: random_spans_noise_mask(0), "positive int"),
    (lambda: random_spans_noise_mask(5.0), "positive int"),
    (lambda: random_spans_noise_mask(10, noise_density=1.0), r"\[0, 1\)"),
    (lambda: random_spans_noise_mask(10, noise_density=-0.1), r"\[0, 1\)"),
    (lambda: random_spans_noise_mask(10, mean_span_length=0.5), ">= 1"),
    (lambda: span_corrupt(torch.zeros(2, 3, dtype=torch.long), SENTINELS), "1-D"),
    (lambda: span_corrupt(torch.rand(5), SENTINELS), "token ids"),
    (lambda: span_corrupt(torch.tensor([], dtype=torch.long), SENTINELS), "non-empty"),
    (lambda: span_corrupt(torch.arange(5), SENTINELS, noise_mask=torch.ones(4, dtype=torch.bool)),
     r"shape \(5,\)"),
    (lambda: span_corrupt(torch.arange(5), SENTINELS, noise_mask=torch.ones(5)), "bool"),
    (lambda: span_corrupt(torch.arange(300), SENTINELS[:3]), "only 3 sentinel"),
    (lambda: span_corrupt(torch.arange(3), SENTINELS, noise_mask=torch.tensor([True, False, False])),
     "start with a kept token"),
    (lambda: span_corrupt_batch(torch.arange(5), SENTINELS, EOS), r"\(batch, length\)"),
    (lambda: t5_sentinel_ids(10, 20), "count"),
    (lambda: t5_sentinel_ids(10.0, 3), r"len\(tokenizer\)"),
    (lambda: t5_sentinel_ids(object(), 3), "integers"),
    (lambda: t5_raw_length(1), ">= 2"),
])
def test_bad_input_gives_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_batch_corruption_reads_nothing_back_from_the_device():
    """On the meta device any host read (a data-dependent shape, .item()) or CPU-made tensor fails:
    span_corrupt_batch must run there, as it runs in a GPU training loop without syncs."""
    ids = torch.zeros(3, 128, dtype=torch.long, device="meta")
    inputs, targets = span_corrupt_batch(ids, SENTINELS, EOS)
    assert inputs.device.type == "meta" and (inputs.shape[1], targets.shape[1]) == t5_lengths(128)
