"""tfm_course.data: vocabulary, number words, dates, disjoint splits, teacher-forcing batches."""

import datetime as dt

import pytest
import torch
from cuda_helpers import needs_cuda

from tfm_course.data.translation import (NUMBER_WORDS, dates_task, number_pairs, number_to_words,
                                         numbers_task, shift_targets)
from tfm_course.data.vocab import Vocab


# --------------------------------------------------------------------------- vocab
def test_vocab_specials_and_roundtrip():
    v = Vocab(list("abc") + ["a"])  # duplicates are ignored
    assert len(v) == 6 and (v.pad_id, v.bos_id, v.eos_id) == (0, 1, 2)
    ids = v.encode(list("cab"), bos=True, eos=True)
    assert ids[0] == v.bos_id and ids[-1] == v.eos_id
    assert v.decode(ids) == list("cab")
    assert v.decode(ids + [v.pad_id, v.pad_id]) == list("cab")
    assert v.decode(ids, strip=False)[0] == "<bos>"
    assert v.decode([3, 2, 4]) == ["a"], "decoding stops at <eos>"


def test_vocab_pad():
    v = Vocab(list("ab"))
    t = v.pad([[3, 4, 2], [4, 2]])
    assert t.tolist() == [[3, 4, 2], [4, 2, v.pad_id]] and t.dtype == torch.long
    assert v.pad([[3]], length=3).shape == (1, 3)


def test_vocab_bad_input():
    v = Vocab(list("ab"))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.encode(["a", "z"])
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        v.decode([3, 5])
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        v.decode(torch.tensor([-1]))
    with pytest.raises(ValueError, match="integers"):
        v.check_ids(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="one sequence"):
        v.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="does not fit"):
        v.pad([[3, 4, 2]], length=2)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        v.pad([[3, 9]])
    with pytest.raises(ValueError, match="non-empty strings"):
        Vocab(["a", ""])


# --------------------------------------------------------------------------- numbers
def _words_to_number(text: str) -> int:
    """An independent parser: the inverse of number_to_words, used to check it."""
    small = {w: i for i, w in enumerate(NUMBER_WORDS[:20])}
    small.update({w: 10 * (i + 2) for i, w in enumerate(NUMBER_WORDS[20:28])})
    total, current = 0, 0
    for word in text.split():
        if word in small:
            current += small[word]
        elif word == "hundred":
            current *= 100
        else:
            total += current * {"thousand": 1000, "million": 10**6}[word]
            current = 0
    return total + current


def test_number_to_words_examples():
    assert number_to_words(4021) == "four thousand twenty one"
    assert number_to_words(0) == "zero"
    assert number_to_words(15) == "fifteen"
    assert number_to_words(40) == "forty"
    assert number_to_words(100) == "one hundred"
    assert number_to_words(110) == "one hundred ten"
    assert number_to_words(20_000) == "twenty thousand"
    assert number_to_words(1_000_001) == "one million one"


def test_number_to_words_inverts():
    g = torch.Generator().manual_seed(0)
    for n in list(range(2000)) + torch.randint(0, 10**9, (2000,), generator=g).tolist():
        words = number_to_words(n)
        assert _words_to_number(words) == n, (n, words)
        assert set(words.split()) <= set(NUMBER_WORDS)


@pytest.mark.parametrize("bad", [-1, 10**9, 3.0, "12", True])
def test_number_to_words_bad_input(bad):
    with pytest.raises(ValueError):
        number_to_words(bad)


def test_numbers_task_splits_are_disjoint_complete_and_deterministic():
    task = numbers_task(max_value=3000, n_valid=200, n_test=300, seed=0)
    train, valid, test = ({s for s, _ in split} for split in (task.train, task.valid, task.test))
    assert len(valid) == 200 and len(test) == 300 and len(train) == 2500
    assert not (train & valid or train & test or valid & test)
    assert train | valid | test == {str(n) for n in range(3000)}
    again = numbers_task(max_value=3000, n_valid=200, n_test=300, seed=0)
    assert again.test == task.test and again.train == task.train
    assert numbers_task(max_value=3000, n_valid=200, n_test=300, seed=1).test != task.test
    with pytest.raises(ValueError, match="leave training items"):
        numbers_task(max_value=100, n_valid=50, n_test=50)
    with pytest.raises(ValueError, match="max_value"):
        numbers_task(max_value=5)


def test_number_pairs_for_longer_inputs():
    pairs = number_pairs(10_000, 100_000, 50, seed=0)
    assert len({s for s, _ in pairs}) == 50
    assert all(len(s) == 5 and number_to_words(int(s)) == t for s, t in pairs)
    big = number_pairs(10**8, 10**9, 5)
    assert all(len(s) == 9 for s, _ in big)
    with pytest.raises(ValueError):
        number_pairs(0, 10, 11)


def test_batches_for_teacher_forcing():
    task = numbers_task(max_value=1000, n_valid=10, n_test=10)
    batch = task.batch([("42", "forty two"), ("7", "seven")])
    v = task.tgt_vocab
    assert batch.src.tolist()[1] == task.src_vocab.encode(["7"], eos=True) + [0]
    assert batch.tgt_in[0].tolist() == [v.bos_id] + v.encode(["forty", "two"])
    assert batch.tgt_out[0].tolist() == v.encode(["forty", "two"], eos=True)
    assert torch.equal(batch.tgt_in[:, 1:], batch.tgt_out[:, :-1]), "labels are inputs shifted by one"
    assert task.decode_targets(batch.tgt_out) == ["forty two", "seven"]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        task.batch([("4x", "four")])
    with pytest.raises(ValueError, match="empty"):
        task.batch([])
    with pytest.raises(ValueError, match=r"\(batch, L\)"):
        task.decode_targets(torch.tensor([3, 4]))


def test_shift_targets():
    full = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    tgt_in, tgt_out = shift_targets(full)
    assert tgt_in.tolist() == [[1, 5, 6], [1, 7, 2]] and tgt_out.tolist() == [[5, 6, 2], [7, 2, 0]]
    with pytest.raises(ValueError):
        shift_targets(torch.tensor([1, 2, 3]))


def test_sampler_is_deterministic_and_uses_training_pairs():
    task = numbers_task(max_value=500, n_valid=50, n_test=50)
    a, b = task.sampler(16, seed=3), task.sampler(16, seed=3)
    first, again = a(0), b(0)
    assert torch.equal(first.src, again.src) and first.src.shape[0] == 16
    train_sources = {s for s, _ in task.train}
    sources = ["".join(task.src_vocab.decode(row)) for row in first.src]
    assert set(sources) <= train_sources


def test_sampler_draws_on_the_cpu_as_before():
    """CPU batches are the rows a seeded CPU generator draws: reproducible across versions."""
    task = numbers_task(max_value=500, n_valid=50, n_test=50)
    whole = task.batch(task.train)
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(whole.src.shape[0], (8,), generator=g) for _ in range(3)]
    make_batch = task.sampler(8, seed=5)
    for step, want in enumerate(rows):
        got = make_batch(step)
        assert torch.equal(got.src, whole.src[want]) and torch.equal(got.tgt_out, whole.tgt_out[want])


@needs_cuda
def test_sampler_draws_on_the_gpu_and_vocab_reads_gpu_ids():
    task = numbers_task(max_value=500, n_valid=50, n_test=50)
    a, b = task.sampler(16, device="cuda", seed=3), task.sampler(16, device="cuda", seed=3)
    first, again = a(0), b(0)
    assert first.src.is_cuda and torch.equal(first.src, again.src)
    ids = task.encode_targets(["four hundred"]).cuda()[0]
    assert task.tgt_vocab.decode(ids) == ["four", "hundred"]
    with pytest.raises(ValueError, match=r"\[0, "):
        task.tgt_vocab.check_ids(torch.tensor([0, 99], device="cuda"))


# --------------------------------------------------------------------------- dates
def test_dates_task():
    task = dates_task(first_year=1990, last_year=1999, n_valid=100, n_test=200, seed=0)
    n_days = (dt.date(1999, 12, 31) - dt.date(1990, 1, 1)).days + 1
    assert len(task.train) + len(task.valid) + len(task.test) == n_days
    targets = [{t for _, t in split} for split in (task.train, task.valid, task.test)]
    assert not (targets[0] & targets[1] or targets[0] & targets[2] or targets[1] & targets[2])
    for source, target in task.test[:50]:  # each source spells the same day as its ISO target
        day = dt.date.fromisoformat(target)
        words = source.replace(",", "").replace("/", " ").split()
        assert str(day.day) in {w.lstrip("0") for w in words}
        assert str(day.year)[-2:] in source
    batch = task.batch(task.test[:4])
    assert task.decode_targets(batch.tgt_out) == [t for _, t in task.test[:4]]
    with pytest.raises(ValueError, match="100 years"):
        dates_task(first_year=1900, last_year=2049)
