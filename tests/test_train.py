import math

import pytest
import torch
from torch import nn

from cuda_helpers import needs_cuda
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


# --------------------------------------------------------------------------- host syncs
HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy")


def _count_host_reads_by_train(monkeypatch) -> list[str]:
    """Patch the Tensor methods that copy a value to the host (on CUDA: wait for the GPU) and
    record those called by tfm_course/train.py itself (directly, or through Tensor.__format__)."""
    import sys
    from pathlib import Path

    import tfm_course.train as train_module

    train_file = Path(train_module.__file__).resolve()
    reads: list[str] = []
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            frame = sys._getframe(1)
            while frame is not None and Path(frame.f_code.co_filename).name == "_tensor.py":
                frame = frame.f_back  # f"{loss:.4f}" reads through Tensor.__format__
            if frame is not None and Path(frame.f_code.co_filename).resolve() == train_file:
                reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.mark.parametrize("loss_every", [1, 10, 50])
def test_losses_are_read_every_loss_every_steps_not_at_every_step(monkeypatch, loss_every):
    model, make_batch, loss_fn = _regression_problem()
    reads = _count_host_reads_by_train(monkeypatch)
    history = train(model, make_batch, loss_fn, steps=100, lr=0.05, loss_every=loss_every,
                    progress=False)
    assert len(reads) == math.ceil(100 / loss_every), reads
    assert len(history.loss) == len(history.steps) == 100  # still one loss per step
    assert all(isinstance(x, float) for x in history.loss)


def test_evaluations_read_the_pending_losses_so_stop_when_sees_them(monkeypatch):
    model, make_batch, loss_fn = _regression_problem()
    reads = _count_host_reads_by_train(monkeypatch)
    seen = []

    def stop_when(history):
        seen.append((len(history.steps), len(history.loss)))
        return history.loss[-1] < 1e-3

    history = train(model, make_batch, loss_fn, steps=1000, lr=0.05, loss_every=100,
                    eval_fn=lambda m: {"zero": 0.0}, eval_every=30, stop_when=stop_when,
                    progress=False)
    assert seen and all(n_steps == n_loss for n_steps, n_loss in seen)
    assert len(history.steps) < 1000 and history.loss[-1] < 1e-3
    evaluations = len(history.metrics["zero"])
    assert len(reads) <= evaluations + len(history.steps) // 100 + 1, (reads, evaluations)


def test_the_losses_read_together_equal_the_per_step_losses():
    torch.manual_seed(1)
    model, make_batch, loss_fn = _regression_problem()
    expected = []

    def recording_loss(m, batch):
        loss = loss_fn(m, batch)
        expected.append(loss.detach().clone())
        return loss

    history = train(model, make_batch, recording_loss, steps=37, loss_every=8, progress=False)
    assert history.loss == torch.stack(expected).tolist()


def test_time_limit_still_checked_at_every_step_and_losses_complete():
    model, make_batch, loss_fn = _regression_problem()
    history = train(model, make_batch, loss_fn, steps=10_000, time_limit_s=0.0, loss_every=50,
                    progress=False)
    assert len(history.steps) == len(history.loss) == 1


def test_loss_every_must_be_positive():
    model, make_batch, loss_fn = _regression_problem()
    with pytest.raises(ValueError, match="loss_every"):
        train(model, make_batch, loss_fn, steps=10, loss_every=0)


# --------------------------------------------------------------------------- on a real GPU
def _cuda_regression(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1)).to(device)
    x = torch.randn(256, 32, device=device)
    y = x.sum(-1, keepdim=True)
    return model, (lambda step: (x, y)), (lambda m, b: nn.functional.mse_loss(m(b[0]).float(), b[1]))


@needs_cuda
@pytest.mark.parametrize("amp", [False, True])
def test_training_steps_never_wait_for_the_gpu(monkeypatch, amp):
    """Every step after the first runs with CUDA's sync debugger set to raise: no .item(), no
    bool(tensor), no device-to-host copy anywhere in forward, backward, clipping or AdamW."""
    import tfm_course.train as train_module

    device = torch.device("cuda")
    dtype, _ = train_module.mixed_precision(device, amp)
    if dtype == torch.float16:
        pytest.skip("fp16 needs a GradScaler, whose step() syncs by design (test_mixed_precision)")
    model, make_batch, loss_fn = _cuda_regression(device)
    real_step, checked = train_module._step, []

    def step_that_must_not_sync(*args, **kwargs):
        if not checked:  # the first step allocates the optimizer's state
            checked.append(False)
            return real_step(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = real_step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        checked.append(True)
        return loss

    monkeypatch.setattr(train_module, "_step", step_that_must_not_sync)
    history = train(model, make_batch, loss_fn, steps=40, lr=1e-2, amp=amp, loss_every=10,
                    progress=False)
    assert sum(checked) == 39
    assert len(history.loss) == 40 and history.loss[-1] < 0.5 * history.loss[0]
