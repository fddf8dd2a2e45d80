"""Chapter 12's checkers accept the reference answers and name the typical mistakes."""

import contextlib
import io

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tfm_course.accumulation import accumulate_gradients
from tfm_course.exercises import ch12
from tfm_course.experiments.memory import training_state_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(check, fn):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ok = check(fn)
    return ok, out.getvalue()


def _accumulate(scale):
    def fn(model, micro_batches):
        total = sum((t != -100).sum() for _, t in micro_batches)
        with_padding = sum(t.numel() for _, t in micro_batches)
        for ids, targets in micro_batches:
            n = (targets != -100).sum()
            loss_sum = F.cross_entropy(model(ids)[0].flatten(0, 1), targets.flatten(), ignore_index=-100,
                                       reduction="sum")
            (loss_sum / scale(total, n, len(micro_batches), with_padding)).backward()
    return fn


def test_accumulation_checker_accepts_the_fix():
    assert _run(ch12.check_accumulation, lambda m, mb: accumulate_gradients(m, mb, "tokens"))[0]
    assert _run(ch12.check_accumulation, _accumulate(lambda total, n, k, pad: total))[0]


@pytest.mark.parametrize("scale, message", [
    (lambda total, n, k, pad: n * k, "mean losses"),
    (lambda total, n, k, pad: 1, "summed, not averaged"),
    (lambda total, n, k, pad: n, "own token count"),
    (lambda total, n, k, pad: pad, "includes padding"),
    (lambda total, n, k, pad: 2 * total, "differ from the whole batch"),
])
def test_accumulation_checker_names_the_mistake(scale, message):
    ok, said = _run(ch12.check_accumulation, _accumulate(scale))
    assert not ok and message in said, said


def test_accumulation_checker_reports_no_backward_and_not_attempted():
    ok, said = _run(ch12.check_accumulation, lambda m, mb: None)
    assert not ok and "all zero" in said
    def stub(m, mb):
        raise NotImplementedError
    ok, said = _run(ch12.check_accumulation, stub)
    assert not ok and "not attempted" in said


def test_state_bytes_checker():
    assert _run(ch12.check_state_bytes, lambda m, opt: training_state_bytes(m, opt, "fp32")["total"])[0]
    states = {"adamw": 2, "sgd_momentum": 1, "sgd": 0}
    cases = [
        (lambda m, opt: 4 * sum(t.numel() for t in m.state_dict().values()) * (2 + states[opt]), "twice"),
        (lambda m, opt: 4 * sum(p.numel() for p in m.parameters()) * (1 + states[opt]), "gradients"),
        (lambda m, opt: 32 * sum(p.numel() for p in m.parameters()) * (2 + states[opt]), "bits"),
        (lambda m, opt: sum(p.numel() for p in m.parameters()) * (2 + states[opt]), "numbers, not bytes"),
        (lambda m, opt: 4 * sum(p.numel() for p in m.parameters()) * 3, "one of AdamW's two states"),
        (lambda m, opt: "many", "return a number"),
    ]
    for fn, message in cases:
        ok, said = _run(ch12.check_state_bytes, fn)
        assert not ok and message in said, (message, said)


def test_checkpointed_block_checker():
    assert _run(ch12.check_checkpointed_block, lambda b, x: checkpoint(b, x, use_reentrant=False))[0]
    cases = [
        (lambda b, x: b(x), "still saves"),
        (lambda b, x: b(x.detach()), "no gradient reached x"),
        (lambda b, x: b(x) * 2, "differs from block(x)"),
        (lambda b, x: x[:, :1], "shape"),
    ]
    for fn, message in cases:
        ok, said = _run(ch12.check_checkpointed_block, fn)
        assert not ok and message in said, (message, said)

    def under_no_grad(b, x):
        with torch.no_grad():
            return b(x)
    ok, said = _run(ch12.check_checkpointed_block, under_no_grad)
    assert not ok and "no_grad" in said
