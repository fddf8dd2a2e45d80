"""tfm_course.experiments.bert_recipe: chapter 7's pretraining and fine-tuning recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_course.data.mlm import IGNORE, mask_tokens
from tfm_course.experiments import bert_recipe as R
from tfm_course.models.bert import BertForPreTraining

SIZES = dict(R.SIZES["cpu"], d_model=16, num_heads=2, d_ff=32, batch=8, n_valid=16, ft_batch=8)


@pytest.fixture(scope="module")
def mlm():
    return R.mlm_data(SIZES)


@pytest.mark.parametrize("p", [0.15, 0.4, 0.6, 0.9])
def test_mlm_loss_drops_no_label_at_any_rate(mlm, p):
    """The bound k_max = max_chosen(p, T) covers every row, so the gathered loss equals the loss over
    all positions (the old constant round(p * (T - 2)) dropped labels at some rates)."""
    torch.manual_seed(0)
    model = BertForPreTraining(R.model_config(mlm, SIZES)).eval()
    rows = mlm.train_rows[:32]
    batch = mask_tokens(rows, mlm.is_special(rows), mlm.vocab_size, mlm.id("[MASK]"), p=p,
                        generator=torch.Generator().manual_seed(1), special_ids=mlm.special_ids)
    full = F.cross_entropy(model(batch[0])[0].flatten(0, 1), batch[1].flatten(), ignore_index=IGNORE)
    k, fullest = R.max_chosen(p, rows.shape[1]), int((batch[1] != IGNORE).sum(1).max())
    assert fullest <= k
    torch.testing.assert_close(R.mlm_loss(model, batch, k), full)
    torch.testing.assert_close(R.mlm_loss(model, batch), full)  # counted from the batch
    if fullest > 1:  # a bound below the fullest row drops labels, and the loss changes
        assert not torch.equal(R.mlm_loss(model, batch, fullest - 1), full)


def test_pretraining_prefix_is_reproducible(mlm):
    """The first steps of a longer run (total_steps) are the same run: what the page replays."""
    _, short = R.pretrain(mlm, SIZES, steps=4, seed=3, total_steps=40, evaluations=10, progress=False)
    _, long = R.pretrain(mlm, SIZES, steps=8, seed=3, total_steps=40, evaluations=10, progress=False)
    assert short.loss == long.loss[:4]
    _, other = R.pretrain(mlm, SIZES, steps=4, seed=3, progress=False)  # its own, shorter schedule
    assert other.loss[1:] != short.loss[1:]


def test_all_mask_replaces_every_chosen_token(mlm, monkeypatch):
    seen = []
    original = R.mlm_loss
    monkeypatch.setattr(R, "mlm_loss", lambda m, b, k=None: seen.append(b) or original(m, b, k))
    R.pretrain(mlm, SIZES, steps=2, all_mask=True, progress=False)
    inputs, labels = seen[0]
    assert (inputs[labels != IGNORE] == mlm.id("[MASK]")).all()


def test_task_splits_hold_out_whole_modules(mlm):
    from tfm_course.data.docstring_tasks import class_or_function

    task = R.task_data(mlm)
    texts, _, modules = class_or_function("train", with_modules=True)
    module_of = dict(zip(texts, modules))
    train_modules = {module_of[t] for t in task.train.texts}
    dev_modules = {module_of[t] for t in task.dev.texts}
    assert train_modules and dev_modules and not train_modules & dev_modules
    assert len(task.train.y) + len(task.dev.y) == len(texts)
    assert (task.train.x[:, 0] == mlm.id("[CLS]")).all() and task.train.mask[:, 0].all()


def test_stratified_subset():
    y = torch.tensor([0] * 30 + [1] * 10)
    pick = R.stratified_subset(y, 16, seed=0)
    assert len(pick) == 16 == len(set(pick.tolist())) and int(y[pick].sum()) == 8
    assert torch.equal(pick, R.stratified_subset(y, 16, seed=0))
    assert not torch.equal(pick, R.stratified_subset(y, 16, seed=1))
    assert len(R.stratified_subset(y, 17, seed=0)) == 17
    assert torch.equal(R.stratified_subset(y, None, 0), torch.arange(40))
    with pytest.raises(ValueError, match="at least 2"):
        R.stratified_subset(y, 1, seed=0)


def test_fine_tune_is_deterministic_and_seeded(mlm):
    task = R.task_data(mlm)
    encoder = R.fresh_bert(mlm, SIZES, 0)
    pick = R.stratified_subset(task.train.y, 16, 0)
    a = R.fine_tune(encoder, task, SIZES, lr=1e-3, seed=0, subset=pick, steps=3)
    b = R.fine_tune(encoder, task, SIZES, lr=1e-3, seed=0, subset=pick, steps=3)
    assert a == b and a["n_train"] == 16
    assert 0.0 <= a["validation"]["balanced"] <= 1.0
    scores = R.baseline_scores(task, mlm.vocab_size, pick)
    assert scores["majority"]["validation"] == 0.5  # a constant guess, balanced
    assert scores["bag of tokens"]["validation"] > 0.5
