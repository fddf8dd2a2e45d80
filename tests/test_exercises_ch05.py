"""Chapter 5 checkers: each accepts the reference and rejects typical mistakes with the right words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from checker_helpers import verdict
from tfm_course.data.translation import shift_targets
from tfm_course.decoding import greedy_search
from tfm_course.exercises import ch05
from tfm_course.models.transformer import sequence_loss, target_mask


def _tril(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


# --------------------------------------------------------------------------- target mask
def _target_mask_alternative(tgt, pad_id):
    T = tgt.shape[1]
    keep = tgt != pad_id
    return torch.stack([_tril(T) & row[None, :] for row in keep])[:, None]


@pytest.mark.parametrize("fn", [target_mask, _target_mask_alternative], ids=["package", "loop"])
def test_target_mask_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch05.check_target_mask, fn, capsys)
    assert ok and "✅" in out


TARGET_WRONG = {
    "seed's query padding": (
        lambda t, p: (t != p).unsqueeze(1).unsqueeze(3) & _tril(t.shape[1]), "query rows"),
    "reversed": (lambda t, p: ~target_mask(t, p), "reversed"),
    "no causal part": (
        lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1), "future is visible"),
    "causal only": (
        lambda t, p: _tril(t.shape[1]).expand(t.shape[0], 1, -1, -1), "padded keys are not masked"),
    "triu": (lambda t, p: (t != p)[:, None, None, :] & _tril(t.shape[1]).T, "upper triangle"),
    "no diagonal": (lambda t, p: (t != p)[:, None, None, :] & _tril(t.shape[1]).tril(-1),
                    "diagonal is missing"),
    "hard-coded pad 0": (lambda t, p: target_mask(t, 0), "pad_id argument"),
    "no head axis": (lambda t, p: target_mask(t, p)[:, 0], "add the head axis"),
    "float": (lambda t, p: target_mask(t, p).float(), "bool tensor"),
}


@pytest.mark.parametrize("name", TARGET_WRONG)
def test_target_mask_checker_rejects_typical_mistakes(name, capsys):
    fn, message = TARGET_WRONG[name]
    ok, out = verdict(ch05.check_target_mask, fn, capsys)
    assert not ok and "❌" in out and message in out, out


# --------------------------------------------------------------------------- shift targets
def test_shift_checker_accepts_the_reference(capsys):
    ok, out = verdict(ch05.check_shift_targets, shift_targets, capsys)
    assert ok and "✅" in out
    ok, _ = verdict(ch05.check_shift_targets, lambda t: (t[:, :-1].clone(), t[:, 1:].clone()), capsys)
    assert ok


SHIFT_WRONG = {
    "no shift": (lambda t: (t, t), "same tensor"),
    "swapped": (lambda t: (t[:, 1:], t[:, :-1]), "swapped"),
    "labels not shifted": (lambda t: (t[:, :-1], t[:, :-1]), "same tensor"),
    "input keeps everything": (lambda t: (t, t[:, 1:]), "decoder input has shape"),
    "labels drop two": (lambda t: (t[:, :-1], torch.cat([t[:, 2:], t[:, :1]], 1)),
                        "labels should be target[:, 1:]"),
    "single tensor": (lambda t: t, "return a pair"),
}


@pytest.mark.parametrize("name", SHIFT_WRONG)
def test_shift_checker_rejects_typical_mistakes(name, capsys):
    fn, message = SHIFT_WRONG[name]
    ok, out = verdict(ch05.check_shift_targets, fn, capsys)
    assert not ok and "❌" in out and message in out, out


# --------------------------------------------------------------------------- label smoothing
def _torch_loss(logits, target, pad_id=0, label_smoothing=0.0):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id,
                           label_smoothing=label_smoothing)


@pytest.mark.parametrize("fn", [sequence_loss, _torch_loss], ids=["package", "torch"])
def test_loss_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch05.check_label_smoothed_loss, fn, capsys)
    assert ok and "✅" in out


def _smoothed(logits, target, pad_id, eps, spread_over_others=False, drop_uniform=False,
              denominator="real", reduce="mean"):
    V = logits.shape[-1]
    logp = F.log_softmax(logits, -1)
    nll = -logp.gather(-1, target[..., None]).squeeze(-1)
    if spread_over_others:
        smooth = (-logp.sum(-1) - nll) / (V - 1)
    else:
        smooth = -logp.mean(-1)
    per = (1 - eps) * nll + (0 if drop_uniform else eps * smooth)
    keep = target != pad_id
    total = (per * keep).sum()
    if reduce == "sum":
        return total
    return total / (keep.sum() if denominator == "real" else target.numel())


LOSS_WRONG = {
    "ignores padding": (lambda lg, t, pad_id=0, label_smoothing=0.0: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), label_smoothing=label_smoothing), "padding positions"),
    "divides by all positions": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(
        lg, t, pad_id, label_smoothing, denominator="all"), "every position"),
    "sum": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(
        lg, t, pad_id, label_smoothing, reduce="sum"), "summed"),
    "no smoothing": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(lg, t, pad_id, 0.0),
                     "no effect"),
    "eps over V-1": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(
        lg, t, pad_id, label_smoothing, spread_over_others=True), "V − 1 wrong classes"),
    "forgot uniform term": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(
        lg, t, pad_id, label_smoothing, drop_uniform=True), "smoothing term"),
    "per-token tensor": (lambda lg, t, pad_id=0, label_smoothing=0.0: F.cross_entropy(
        lg.flatten(0, 1), t.flatten(), reduction="none"), "return one number"),
    "probabilities, not log": (lambda lg, t, pad_id=0, label_smoothing=0.0: _smoothed(
        lg.softmax(-1), t, pad_id, label_smoothing), "expected"),
}


@pytest.mark.parametrize("name", LOSS_WRONG)
def test_loss_checker_rejects_typical_mistakes(name, capsys):
    fn, message = LOSS_WRONG[name]
    ok, out = verdict(ch05.check_label_smoothed_loss, fn, capsys)
    assert not ok and "❌" in out and message in out, out


# --------------------------------------------------------------------------- greedy search
def _greedy_loop(next_logits, batch_size, bos_id, eos_id, max_len, pad_id=0):
    prefix = [[bos_id] for _ in range(batch_size)]
    for _ in range(max_len):  # no early stop: a correct answer too, padded to max_len
        nxt = next_logits(torch.tensor(prefix)).argmax(-1).tolist()
        for row, token in zip(prefix, nxt):
            row.append(pad_id if eos_id in row[1:] or pad_id in row[1:] else token)
    return torch.tensor(prefix)[:, 1:]


@pytest.mark.parametrize("fn", [greedy_search, _greedy_loop], ids=["package", "loop"])
def test_greedy_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch05.check_greedy_search, fn, capsys)
    assert ok and "✅" in out


def _greedy_variant(next_logits, batch_size, bos_id, eos_id, max_len, pad_id=0, *, pick="argmax",
                    feed_back=True, pad_after_eos=True, stop="all", keep_bos=False):
    prefix = torch.full((batch_size, 1), bos_id)
    done = torch.zeros(batch_size, dtype=torch.bool)
    for _ in range(max_len):
        logits = next_logits(prefix if feed_back else prefix[:, :1])
        token = logits.argmin(-1) if pick == "argmin" else logits.argmax(-1)
        if pad_after_eos:
            token = token.masked_fill(done, pad_id)
        prefix = torch.cat([prefix, token[:, None]], 1)
        done |= token == eos_id
        if (stop == "all" and done.all()) or (stop == "any" and done.any()):
            break
    return prefix if keep_bos else prefix[:, 1:]


GREEDY_WRONG = {
    "argmin": (dict(pick="argmin"), "argmax"),
    "no feedback": (dict(feed_back=False), "append each chosen token"),
    "no padding after eos": (dict(pad_after_eos=False), "tokens after <eos>"),
    "stops at first eos": (dict(stop="any"), "stop before their <eos>"),
    "keeps bos": (dict(keep_bos=True), "starts with <bos>"),
}


@pytest.mark.parametrize("name", GREEDY_WRONG)
def test_greedy_checker_rejects_typical_mistakes(name, capsys):
    options, message = GREEDY_WRONG[name]
    ok, out = verdict(ch05.check_greedy_search,
                      lambda *a, **k: _greedy_variant(*a, **k, **options), capsys)
    assert not ok and "❌" in out and message in out, out


def test_greedy_checker_survives_a_crash(capsys):
    ok, out = verdict(ch05.check_greedy_search, lambda *a, **k: a[0](torch.zeros(3)), capsys)
    assert not ok and "your function raised" in out
