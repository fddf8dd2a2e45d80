import math

import pytest
import torch
from torch import nn

from tfm_course.train import History, constant, noam, train, warmup_cosine, warmup_times_cosine


def _regression_problem():
    torch.manual_seed(0)
    w_true = torch.randn(4, 1)
    model = nn.Linear(4, 1)

    def make_batch(step):
        x = torch.randn(64, 4)
        return x, x @ w_true

    def loss_fn(m, batch):
        x, y = batch
        return nn.functional.mse_loss(m(x), y)

    return model, make_batch, loss_fn


def test_train_reduces_the_loss_and_records_history():
    model, make_batch, loss_fn = _regression_problem()
    evals = []

    def eval_fn(m):
        evals.append(m.training)
        return {"mse": loss_fn(m, make_batch(0)).item()}

    history = train(model, make_batch, loss_fn, steps=200, lr=0.05, eval_fn=eval_fn, eval_every=50,
                    progress=False)
    assert isinstance(history, History)
    assert len(history.loss) == len(history.steps) == len(history.lr) == 200
    assert history.loss[-1] < 0.01 * history.loss[0]
    assert [s for s, _ in history.metrics["mse"]] == [49, 99, 149, 199]
    assert evals and not any(evals), "evaluation runs in eval mode"
    assert history.last("mse") == history.metrics["mse"][-1][1]
    assert not model.training


def test_schedule_sets_the_learning_rate_each_step():
    model, make_batch, loss_fn = _regression_problem()
    history = train(model, make_batch, loss_fn, steps=20, lr=0.1, schedule=warmup_cosine(5, 20),
                    progress=False)
    assert history.lr[0] == pytest.approx(0.1 / 5)
    assert history.lr[4] == pytest.approx(0.1)
    assert history.lr[-1] < history.lr[5]


def test_time_limit_stops_early():
    model, make_batch, loss_fn = _regression_problem()
    history = train(model, make_batch, loss_fn, steps=10_000, time_limit_s=0.0, progress=False)
    assert len(history.loss) == 1


def test_invalid_steps_raise():
    model, make_batch, loss_fn = _regression_problem()
    with pytest.raises(ValueError, match="steps"):
        train(model, make_batch, loss_fn, steps=0)


def test_noam_matches_the_paper_formula_and_peaks_at_warmup():
    d_model, warmup = 512, 4000
    schedule = noam(d_model, warmup)
    for step in (0, 100, 3999, 4000, 20000):
        s = step + 1
        assert schedule(step) == pytest.approx(d_model**-0.5 * min(s**-0.5, s * warmup**-1.5))
    values = [schedule(s) for s in range(10_000)]
    assert max(range(10_000), key=values.__getitem__) == warmup - 1


def test_warmup_cosine_and_constant_shapes():
    schedule = warmup_cosine(10, 110, floor=0.1)
    assert schedule(0) == pytest.approx(0.1)
    assert schedule(9) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule(500) == pytest.approx(0.1)
    assert constant()(123) == 1.0


def test_warmup_times_cosine_differs_from_no_warmup_only_during_warmup():
    total, floor = 100, 0.1
    cold = warmup_times_cosine(0, total, floor)
    cosine = [floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * s / total)) for s in range(total)]
    assert [cold(s) for s in range(total)] == pytest.approx(cosine)
    assert [cold(s) for s in range(total)] == pytest.approx([warmup_cosine(0, total, floor)(s) for s in range(total)])
    for warmup in (1, 10, 25):
        warm = warmup_times_cosine(warmup, total, floor)
        assert [warm(s) for s in range(warmup - 1, total)] == pytest.approx(cosine[warmup - 1:])  # same decay
        for s in range(warmup - 1):                                   # linear ramp times the cosine
            assert warm(s) == pytest.approx((s + 1) / warmup * cosine[s])
            assert warm(s) < cold(s)
    assert cold(total) == pytest.approx(floor) and cold(10 * total) == pytest.approx(floor)
    # warmup_cosine starts its cosine only after the warm-up: a later, different decay
    assert warmup_cosine(25, total, floor)(50) > warmup_times_cosine(25, total, floor)(50)


def test_warmup_times_cosine_rejects_bad_arguments():
    with pytest.raises(ValueError, match="warmup"):
        warmup_times_cosine(-1, 100)
    with pytest.raises(ValueError, match="total"):
        warmup_times_cosine(10, 0)


def test_without_a_live_front_end_training_prints_one_summary_line(capsys):
    model, make_batch, loss_fn = _regression_problem()
    history = train(model, make_batch, loss_fn, steps=30, desc="fit")
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"fit: 30 steps in {history.seconds:.1f} s, final loss {history.loss[-1]:.4f}"]
