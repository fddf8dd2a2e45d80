"""Count-based language models: tfm_course.ngram."""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from tfm_course.data.mlm import unigram_cross_entropy
from tfm_course.ngram import FALLBACK_DISCOUNTS, KneserNey, Unigram, modified_discounts

HAND_DOCS = [[0, 1, 0, 1], [1, 2]]


def markov_docs(n_docs=40, vocab=12, seed=0):
    """Documents from a random second-order Markov chain: structure that higher orders can use."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(vocab, vocab, vocab, generator=g) ** 4
    docs = []
    for _ in range(n_docs):
        doc = torch.randint(0, vocab, (2,), generator=g).tolist()
        for _ in range(int(torch.randint(3, 60, (1,), generator=g))):
            doc.append(int(torch.multinomial(table[doc[-2], doc[-1]], 1, generator=g)))
        docs.append(doc)
    return docs


def reference_kn(docs, order, vocab, discount=None):
    """Slow dict-based interpolated (modified) KN, written straight from the recursion."""
    raw = [defaultdict(int) for _ in range(order + 1)]  # raw[j][ngram tuple]
    before = [defaultdict(set) for _ in range(order + 1)]  # distinct predecessors, "BOS" at a doc start
    for doc in docs:
        for i in range(len(doc)):
            for j in range(1, order + 1):
                if i - j + 1 >= 0:
                    gram = tuple(doc[i - j + 1: i + 1])
                    raw[j][gram] += 1
                    before[j][gram].add(doc[i - j] if i - j >= 0 else "BOS")

    def disc(counts):
        return modified_discounts(np.array(list(counts), dtype=np.int64)) if discount is None else [discount] * 3

    tables = {}
    for j in range(1, order + 1):
        tables[j, "raw"] = dict(raw[j])
        tables[j, "cont"] = {g: len(s) for g, s in before[j].items()}
    discounts = {key: disc(t.values()) for key, t in tables.items()}

    def prob(context, w, top):
        p = 1.0 / vocab
        for j in range(1, top + 1):
            kind = "raw" if j == top else "cont"
            t, d = tables[j, kind], discounts[j, kind]
            h = tuple(context[len(context) - (j - 1):]) if j > 1 else ()
            row = {g[-1]: c for g, c in t.items() if g[:-1] == h}
            if not row:
                continue
            total = sum(row.values())
            gamma = sum(d[min(c, 3) - 1] for c in row.values())
            c = row.get(w, 0)
            p = ((c - d[min(c, 3) - 1] if c else 0.0) + gamma * p) / total
        return p

    return lambda context, w: prob(list(context)[-(order - 1):] if order > 1 else [], w,
                                   min(order, len(context) + 1))


def test_hand_computed_bigram():
    # V = 3, D = 0.5, documents [0 1 0 1] and [1 2].
    # Continuation counts (distinct predecessors, a document start counting as one):
    #   0: {doc start, 1} = 2; 1: {0, doc start} = 2; 2: {1} = 1; total 5.
    #   p_cont(w) = (c - 0.5 + gamma / 3) / 5 with gamma = 3 * 0.5: (c - 0.5 + 0.5) / 5 = 0.4, 0.4, 0.2
    # Bigram counts after 1: (1 0) = 1, (1 2) = 1; total 2, gamma = 2 * 0.5 = 1:
    #   p(0|1) = (0.5 + 0.4) / 2 = 0.45, p(1|1) = 0.4 / 2 = 0.2, p(2|1) = (0.5 + 0.2) / 2 = 0.35
    # After 0: (0 1) = 2; gamma = 0.5: p(1|0) = (1.5 + 0.2) / 2 = 0.85, p(0|0) = 0.1, p(2|0) = 0.05
    # After 2: never seen, the continuation unigram.  Raw unigram (top order 1): c / 6.
    lm = KneserNey(2, 3, discount=0.5).fit(HAND_DOCS)
    expected = {(1,): [0.45, 0.2, 0.35], (0,): [0.1, 0.85, 0.05], (2,): [0.4, 0.4, 0.2], (): [2 / 6, 3 / 6, 1 / 6]}
    for context, probs in expected.items():
        assert torch.allclose(lm.distribution(context), torch.tensor(probs, dtype=torch.float64))
    assert math.isclose(lm.log_prob([0, 1], 2), math.log(0.35))
    # a window [1 0 1]: position 0 is the raw unigram, then p(0|1), p(1|0)
    nll = lm.score_windows(torch.tensor([[1, 0, 1]]))
    assert torch.allclose(nll, -torch.tensor([[3 / 6, 0.45, 0.85]], dtype=torch.float64).log())


def test_modified_discounts_by_hand():
    # n1 = 4, n2 = 2, n3 = 1, n4 = 1: Y = 4 / (4 + 2 * 2) = 0.5,
    # D1 = 1 - 2 * 0.5 * 2 / 4 = 0.5, D2 = 2 - 3 * 0.5 * 1 / 2 = 1.25, D3+ = 3 - 4 * 0.5 * 1 / 1 = 1.0
    assert np.allclose(modified_discounts(np.array([1, 1, 1, 1, 2, 2, 3, 4, 9])), [0.5, 1.25, 1.0])
    assert np.allclose(modified_discounts(np.array([1, 1, 2])), FALLBACK_DISCOUNTS)  # n3 = n4 = 0


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("discount", [None, 0.75])
def test_matches_dict_reference(order, discount):
    docs = markov_docs(n_docs=15, vocab=6)
    lm = KneserNey(order, 6, discount=discount).fit(docs)
    ref = reference_kn(docs, order, 6, discount)
    for context in ([], [0], [3, 1], [2, 2, 5], [5, 5, 5, 5], docs[0][:3], docs[1][:5]):
        got = lm.distribution(context)
        assert torch.allclose(got, torch.tensor([ref(context, w) for w in range(6)], dtype=torch.float64))


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_distributions_sum_to_one_everywhere(order):
    docs = markov_docs(vocab=10)
    lm = KneserNey(order, 12).fit(docs)  # tokens 10 and 11 never occur
    g = torch.Generator().manual_seed(1)
    contexts = [[]] + [torch.randint(0, 12, (n,), generator=g).tolist() for n in (1, 2, 3, 3, 5)]
    contexts += [docs[0][:3], [11, 11, 11]]  # a seen context, an unseen one
    for context in contexts:
        d = lm.distribution(context)
        assert d.shape == (12,) and d.dtype == torch.float64
        assert abs(float(d.sum()) - 1) < 1e-12 and float(d.min()) > 0


def test_frequency_unigram_equals_mlm_baseline():
    docs = markov_docs(vocab=10)
    train = torch.tensor([t for d in docs for t in d])
    windows = torch.tensor(markov_docs(n_docs=8, seed=3)[0][:30]).view(3, 10)
    uni = Unigram(12).fit(docs)
    assert math.isclose(uni.cross_entropy(windows), unigram_cross_entropy(train, windows, 12), rel_tol=1e-12)
    # KN of order 1 is a frequency unigram too (raw counts at the top order), discounted toward uniform
    kn1 = KneserNey(1, 12).fit(docs).distribution()
    freq = torch.bincount(train, minlength=12).double() / len(train)
    assert (kn1 - freq).abs().max() < 0.01 and kn1[10] > 0


def test_higher_order_never_worse_on_training_data():
    docs = markov_docs()
    ces = []
    for order in (1, 2, 3, 4):
        lm = KneserNey(order, 12).fit(docs)
        ces.append(sum(float(lm.score_windows(torch.tensor([d])).sum()) for d in docs))
    assert all(b < a for a, b in zip(ces, ces[1:])), ces


def test_score_windows_uses_only_in_window_context():
    docs = markov_docs()
    lm = KneserNey(4, 12).fit(docs)
    stream = torch.tensor([t for d in docs for t in d])
    windows = stream[: 20 * 16].view(20, 16)
    nll = lm.score_windows(windows)
    # changing every token before a window (the previous window) never changes its scores
    changed = windows.clone()
    changed[4] = (changed[4] + 1) % 12
    assert torch.equal(lm.score_windows(changed)[5], nll[5])
    # position 0 is the unigram; position t < 3 what a KN model of order t + 1 gives
    assert torch.allclose(nll[:, 0], -lm.distribution([])[windows[:, 0]].log())
    for t in (0, 1, 2):
        assert torch.allclose(nll[:, t], KneserNey(t + 1, 12).fit(docs).score_windows(windows)[:, t])
    # position t is log_prob of the window's own prefix, not of the stream before it
    assert math.isclose(-nll[5, 1], lm.log_prob(windows[5, :1].tolist(), int(windows[5, 1])))
    assert not math.isclose(-nll[5, 1], lm.log_prob(stream[5 * 16 - 2: 5 * 16 + 1].tolist(), int(windows[5, 1])))
    # the next-token layout (inputs, targets) scores the same tokens from the same contexts
    shifted = lm.score_windows(windows[:, :-1], targets=windows[:, 1:])
    assert torch.allclose(shifted, nll[:, 1:])
    # context_limit: 0 is the unigram everywhere, 1 a bigram
    assert torch.allclose(lm.score_windows(windows, context_limit=0), -lm.distribution([])[windows].log())
    assert torch.allclose(lm.score_windows(windows, context_limit=1)[:, 1:],
                          KneserNey(2, 12).fit(docs).score_windows(windows)[:, 1:])
    assert math.isclose(lm.cross_entropy(windows), float(nll.mean()))


def test_two_sided_bigram():
    docs = markov_docs(vocab=8)
    lm = KneserNey(3, 8).fit(docs)
    bigram = KneserNey(2, 8).fit(docs)
    a, b = 3, 5
    candidates = torch.tensor([[a, x, b] for x in range(8)])
    nll = lm.two_sided(candidates)
    # by hand from the bigram distributions: p(x|a) p(b|x) / sum_w p(w|a) p(b|w)
    score = torch.stack([bigram.distribution([a])[x] * bigram.distribution([x])[b] for x in range(8)])
    assert torch.allclose(nll[:, 1], -(score / score.sum()).log())
    assert abs(float(torch.exp(-nll[:, 1]).sum()) - 1) < 1e-12
    # first position: the unigram on the left; last position: the plain bigram p(x | left)
    first = torch.stack([bigram.distribution()[x] * bigram.distribution([x])[a] for x in range(8)])
    assert torch.allclose(lm.two_sided(torch.tensor([[x, a] for x in range(8)]))[:, 0], -(first / first.sum()).log())
    assert torch.allclose(nll[:, 2], -torch.stack([bigram.distribution([x])[b] for x in range(8)]).log())
    with pytest.raises(ValueError, match="order >= 2"):
        KneserNey(1, 8).fit(docs).two_sided(candidates)


def test_bad_input_names_expected_and_actual():
    with pytest.raises(ValueError, match=r"order must be an int in 1\.\.4, got 5"):
        KneserNey(5, 10)
    with pytest.raises(ValueError, match="got 0"):
        KneserNey(0, 10)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got \[0, 7\]"):
        KneserNey(2, 3).fit([[0, 1, 7]])
    with pytest.raises(ValueError, match="must be fitted first"):
        KneserNey(2, 3).score_windows(torch.zeros(2, 4, dtype=torch.long))
    lm = KneserNey(2, 3).fit(HAND_DOCS)
    with pytest.raises(ValueError, match=r"windows must be 2-D, got shape \(4,\)"):
        lm.score_windows(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"windows must be 2-D, got shape \(1, 2, 4\)"):
        lm.score_windows(torch.zeros(1, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"windows must lie in \[0, 3\), got \[0, 3\]"):
        lm.score_windows(torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="integer token ids, got dtype float32"):
        lm.score_windows(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"windows' shape \(2, 4\), got \(2, 3\)"):
        lm.score_windows(torch.zeros(2, 4, dtype=torch.long), targets=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="sequence 1 must be 1-D"):
        KneserNey(2, 3).fit([[0, 1], [[0, 1]]])
    with pytest.raises(ValueError, match="non-empty"):
        KneserNey(2, 3).fit([[], []])
    with pytest.raises(ValueError, match="context_limit"):
        lm.score_windows(torch.zeros(2, 4, dtype=torch.long), context_limit=-1)
