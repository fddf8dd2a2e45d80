"""tfm_course.experiments.t5_transfer: chapter 9's text-to-text fine-tuning on "class or function?"."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course import baselines
from tfm_course.experiments import t5_transfer as T
from tfm_course.experiments.objectives import Specials, build_model, text_to_text_loss
from tfm_course.models.t5 import shift_right

WORDS = ["<eos>", "class", "fun", "red", "blue", "a", "b", "c", "d", "e", "f", "g", "h", "ction"]


class WordTokenizer:
    """One id per word of WORDS, but "function" is two tokens (as in the course's BPE), so the two
    label targets differ in length."""

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) for w in text.replace("function", "fun ction").split()]


TOK = WordTokenizer()
SPECIALS = Specials.after(len(WORDS), eos=0, n_sentinels=8)


def toy_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Trivially separable: the first word says the label ("red" = class); the rest is noise,
    and every text is different."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        label = "class" if i % 2 else "function"
        noise = [WORDS[5 + int(j)] for j in torch.randint(0, 8, (5,), generator=g)]
        pairs.append((" ".join(["red" if label == "class" else "blue", *noise, WORDS[5 + i % 8]]), label))
    return list(dict(pairs).items())  # unique texts


def toy_task() -> T.KindTask:
    return T.KindTask(T.kind_split(TOK, toy_pairs(64, 0), SPECIALS, max_input=12),
                      T.kind_split(TOK, toy_pairs(40, 1), SPECIALS, max_input=12), SPECIALS)


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model("span corruption", SPECIALS, d_model=16, num_heads=2, num_layers=2, d_ff=32).eval()


def force_sentinel(model, split, sentinel: int) -> None:
    """Point the (tied) row of ``sentinel`` along the decoder's first hidden state: it then wins the
    first output by a wide margin. The sentinel never appears in the inputs, so the hidden states
    are unchanged."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0][:, 0]))
    T.sentinel_prior(model, split, SPECIALS)
    hook.remove()
    with torch.no_grad():
        direction = seen[0].mean(0)
        model.shared.weight[sentinel] = 200 * direction / direction.norm()


def test_kind_split_encodes_the_labels_as_their_words():
    split = toy_task().train
    pad = SPECIALS.pad
    assert split.label_targets.tolist() == [[2, 13, 0], [1, 0, pad]]  # function EOS, class EOS pad
    assert torch.equal(split.targets, split.label_targets[split.labels])
    assert split.labels.tolist() == [1 if y == "class" else 0 for _, y in toy_pairs(64, 0)]


def test_kind_task_on_the_corpus_is_balanced_and_encoded():
    from tfm_course.tokenizers import default_tokenizer

    tok = default_tokenizer(4096).truncated(1024)
    specials = Specials.after(tok.vocab_size, eos=tok.special_ids["<|endoftext|>"], n_sentinels=16)
    task = T.kind_task(tok, specials)
    assert task.specials == specials
    for split in (task.train, task.validation):
        assert split.labels.float().mean() == 0.5 and split.inputs.shape[1] == 48
        assert torch.equal(split.targets, split.label_targets[split.labels])
        assert (split.inputs == specials.eos).sum(1).eq(1).all()  # every input ends with one EOS
    assert [tok.decode(row[row < tok.vocab_size - 1].tolist()) for row in task.train.label_targets] == \
        ["function", "class"]


def test_label_log_probs_equal_a_full_teacher_forced_pass():
    task, model = toy_task(), tiny_model()
    split = task.validation
    for banned in ((), T.never_answers(SPECIALS)):
        got = T.label_log_probs(model, split.inputs, split.label_targets, SPECIALS, banned, batch_size=7)
        for k, row in enumerate(split.label_targets):
            target = row[None].expand(len(split), -1)
            logits = model(split.inputs, shift_right(target, SPECIALS.pad), split.inputs != SPECIALS.pad)
            if banned:
                logits[..., banned] = float("-inf")
            labels = target.masked_fill(target == SPECIALS.pad, -100)  # the pad after EOS is no token
            expected = -F.cross_entropy(logits.transpose(1, 2), labels, reduction="none").sum(1)
            torch.testing.assert_close(got[:, k], expected)
    # unmasked: the mean over the rows of label 1 is text_to_text_loss times the 2 target tokens
    ones = split.labels == 1
    loss = text_to_text_loss(model, split.inputs[ones], split.targets[ones], SPECIALS)
    torch.testing.assert_close(-T.label_log_probs(model, split.inputs, split.label_targets, SPECIALS)[ones, 1].mean(),
                               2 * loss)


def test_greedy_equals_generate_when_nothing_is_banned():
    task, model = toy_task(), tiny_model(1)
    x = task.validation.inputs
    assert torch.equal(T.greedy(model, x, SPECIALS, 6), model.generate(x, x != SPECIALS.pad, 6))


def test_banned_logits_never_produce_a_sentinel():
    task, model = toy_task(), tiny_model(2)
    split = task.validation
    force_sentinel(model, split, SPECIALS.sentinels[0])
    x = split.inputs
    plain = model.generate(x, x != SPECIALS.pad, 4)
    assert (plain[:, 0] == SPECIALS.sentinels[0]).all()  # the forced model starts with it
    masked = T.greedy(model, x, SPECIALS, 4, T.never_answers(SPECIALS))
    assert not torch.isin(masked, torch.tensor(SPECIALS.sentinels + [SPECIALS.mask])).any()
    assert T.kind_accuracy(model, split, SPECIALS)["exact match"] == 0.0


def test_sentinel_prior_forced_uniform_and_random():
    task, model = toy_task(), tiny_model(3)
    split, expected = task.validation, SPECIALS.n_sentinels / SPECIALS.vocab_size
    assert 0.25 * expected < T.sentinel_prior(model, split, SPECIALS) < 4 * expected  # random weights
    uniform = tiny_model(3)
    with torch.no_grad():
        uniform.decoder.final_norm.weight.zero_()  # every logit 0
    assert T.sentinel_prior(uniform, split, SPECIALS) == pytest.approx(expected, abs=1e-6)
    force_sentinel(model, split, SPECIALS.sentinels[3])
    assert T.sentinel_prior(model, split, SPECIALS) > 0.99


def test_fine_tuning_learns_a_separable_split_and_leaves_the_model():
    task, model = toy_task(), tiny_model(4)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = T.kind_accuracy(model, task.validation, SPECIALS)["accuracy"]
    result = T.fine_tune_kind(model, task, n_labels=16, seed=0, steps=40, lr=1e-2, batch=16)
    assert result["n_train"] == 16
    assert result["validation"]["accuracy"] >= 0.9 > before + 0.2
    assert result["loss"][-1] < result["loss"][0]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # a copy was trained
    assert result["sentinel prior before"] == pytest.approx(T.sentinel_prior(model, task.validation, SPECIALS))


def test_masking_removes_the_sentinel_prior_cost():
    """A model forced to start with a sentinel: the masked loss is far lower than the plain one, and
    masked scoring cannot be hurt by the sentinel."""
    task, model = toy_task(), tiny_model(5)
    force_sentinel(model, task.train, SPECIALS.sentinels[0])
    batch = (task.train.inputs, task.train.targets)
    plain = T.kind_loss(model, batch, SPECIALS)
    masked = T.kind_loss(model, batch, SPECIALS, T.never_answers(SPECIALS))
    torch.testing.assert_close(plain, text_to_text_loss(model, *batch, SPECIALS))
    assert masked < plain - 10


def test_fine_tuning_and_baselines_train_on_the_same_examples(monkeypatch):
    task = toy_task()
    seen_rows, seen_texts = set(), []
    loss = T.kind_loss
    monkeypatch.setattr(T, "kind_loss", lambda m, b, s, banned=(): seen_rows.update(map(tuple, b[0].tolist()))
                        or loss(m, b, s, banned))
    rule = baselines.first_word_rule
    monkeypatch.setattr(baselines, "first_word_rule", lambda x, y, *a: seen_texts.append(list(x)) or rule(x, y, *a))
    T.fine_tune_kind(tiny_model(), task, n_labels=6, seed=3, steps=20, lr=1e-3, batch=8)
    scores = T.kind_baselines(task, n_labels=6, seed=3, vocab_size=len(WORDS))
    rows = {tuple(task.train.inputs[task.train.texts.index(t)].tolist()) for t in seen_texts[0]}
    assert len(rows) == 6 and seen_rows == rows  # 160 draws of 6 rows: all seen
    assert set(scores) == {"majority", "first-word rule", "bag of tokens"}
    assert scores["majority"] == 0.5 and scores["first-word rule"] == 1.0
    T.kind_baselines(task, n_labels=6, seed=4, vocab_size=len(WORDS))
    assert seen_texts[1] != seen_texts[0]  # the seed draws the subset


def test_baselines_can_score_a_subset_of_the_validation_examples():
    task = toy_task()
    rows = torch.arange(0, len(task.validation), 2)
    part = T.kind_baselines(task, None, 0, len(WORDS), valid_rows=rows)
    labels = task.validation.labels[rows]
    want = max(int((labels == c).sum()) for c in (0, 1)) / len(rows)
    assert part["majority"] == pytest.approx(want)
    whole = T.kind_baselines(task, None, 0, len(WORDS))
    assert set(part) == set(whole)


def test_bad_input_raises():
    task, model = toy_task(), tiny_model()
    for n in (1, 0, 2.5):
        with pytest.raises(ValueError, match=f"int >= 2.*got n_labels={n}"):
            T.fine_tune_kind(model, task, n_labels=n, seed=0, steps=1, lr=1e-3)
        with pytest.raises(ValueError, match="got n_labels"):
            T.kind_baselines(task, n_labels=n, seed=0, vocab_size=len(WORDS))
    split = task.validation
    with pytest.raises(ValueError, match=r"labels must be \(40,\), got \(39,\)"):
        T.KindSplit(split.texts, split.labels[:-1], split.inputs, split.targets, split.label_targets)
    with pytest.raises(ValueError, match=r"targets must be \(40, 3\), got \(40, 4\)"):
        T.KindSplit(split.texts, split.labels, split.inputs, F.pad(split.targets, (0, 1)), split.label_targets)
    with pytest.raises(ValueError, match=r"label_targets must be \(2, T\), got \(3, 3\)"):
        T.KindSplit(split.texts, split.labels, split.inputs, split.targets, split.label_targets[[0, 1, 1]])
    with pytest.raises(ValueError, match="labels must be among"):
        T.kind_split(TOK, [("red a", "method")], SPECIALS)
    other = build_model("span corruption", Specials.after(len(WORDS), eos=0, n_sentinels=4), d_model=16,
                        num_heads=2, num_layers=2, d_ff=32)
    with pytest.raises(ValueError, match=f"specials.vocab_size = {SPECIALS.vocab_size}, got"):
        T.fine_tune_kind(other, task, n_labels=4, seed=0, steps=1, lr=1e-3)


def test_fine_tuning_masks_the_loss_and_the_scoring():
    """From a model forced to start with a sentinel: the plain loss pays for it, the masked one
    does not; the masked run learns the task while its sentinel prior stays high (the model's
    logits are masked, not changed), and the scores it returns are the masked ones."""
    task = toy_task()
    runs = {}
    for mask in (False, True):
        model = tiny_model(4)
        force_sentinel(model, task.validation, SPECIALS.sentinels[0])
        runs[mask] = T.fine_tune_kind(model, task, n_labels=16, seed=0, steps=40, lr=1e-2,
                                      mask_specials=mask, copy_model=False), model
    assert runs[False][0]["loss"][0] > runs[True][0]["loss"][0] + 10
    result, model = runs[True]
    assert result["sentinel prior after"] > 0.9
    assert result["validation"]["exact match"] >= 0.9
    assert result["validation"] == T.kind_accuracy(model, task.validation, SPECIALS, mask_specials=True)
    assert T.kind_accuracy(model, task.validation, SPECIALS)["exact match"] == 0.0  # unmasked: a sentinel
