"""Chapter 10 checkers: each accepts correct answers and rejects typical mistakes with the right words."""

from __future__ import annotations

import math

import pytest
import torch

from checker_helpers import rejects, verdict
from tfm_course.efficient.flash import online_softmax_step
from tfm_course.efficient.linformer import linformer_attention
from tfm_course.efficient.performer import positive_random_features
from tfm_course.efficient.sparse import sliding_window_mask
from tfm_course.exercises import ch10


# --------------------------------------------------------------------------- online softmax
def step_by_hand(m, l, acc, scores, values):
    m_new = torch.maximum(m, scores.max(dim=-1, keepdim=True).values)
    p = torch.exp(scores - m_new)
    correction = torch.exp(m - m_new)
    return m_new, correction * l + p.sum(-1, keepdim=True), correction * acc + p @ values


@pytest.mark.parametrize("fn", [online_softmax_step, step_by_hand], ids=["package", "by hand"])
def test_online_softmax_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch10.check_online_softmax, fn, capsys)
    assert ok and "✅" in out, out


def _variant(rescale_l=True, rescale_acc=True, new_max=True, subtract=True, running=True):
    def step(m, l, acc, scores, values):
        tile_max = scores.amax(-1, keepdim=True)
        m_new = torch.maximum(m, tile_max) if running else tile_max
        shift = (m_new if new_max else m) if subtract else 0.0
        p = torch.exp(scores - shift)
        factor = torch.exp(m - m_new) if subtract else 1.0
        return (m_new, (factor * l if rescale_l else l) + p.sum(-1, keepdim=True),
                (factor * acc if rescale_acc else acc) + p @ values)
    return step


ONLINE_WRONG = {
    "acc not rescaled": (_variant(rescale_acc=False), "acc is not rescaled"),
    "l not rescaled": (_variant(rescale_l=False), "l is not rescaled"),
    "nothing rescaled": (_variant(rescale_l=False, rescale_acc=False), "neither l nor acc"),
    "old maximum in exp": (_variant(new_max=False), "did you use the old m"),
    "no max subtraction": (_variant(subtract=False), "no maximum subtracted"),
    "no max at all": (lambda m, l, acc, s, v: (m, l + torch.exp(s).sum(-1, keepdim=True),
                                               acc + torch.exp(s) @ v), "running maximum"),
    "tile max only": (_variant(running=False), "only the last tile's maximum"),
    "per-tile softmax": (lambda m, l, acc, s, v: (torch.maximum(m, s.amax(-1, keepdim=True)), l + 1,
                                                  acc + torch.softmax(s, -1) @ v),
                         "normalised on its own"),
    "returns m only": (lambda m, l, acc, s, v: step_by_hand(m, l, acc, s, v)[0],
                       "return the new state as a tuple of three tensors"),
    "m without keepdim": (lambda m, l, acc, s, v: (s.amax(-1),) + step_by_hand(m, l, acc, s, v)[1:],
                          "keep m and l as (n_q, 1)"),
    "crashes": (lambda m, l, acc, s, v: s @ v.T, "your function raised RuntimeError"),
}


@pytest.mark.parametrize("name", ONLINE_WRONG)
def test_online_softmax_rejects_typical_mistakes(name, capsys):
    fn, message = ONLINE_WRONG[name]
    rejects(ch10.check_online_softmax, fn, message, capsys)


# --------------------------------------------------------------------------- sliding window
def window_by_hand(n, window):
    i = torch.arange(n)
    return (i[:, None] - i[None, :]).abs() <= window


@pytest.mark.parametrize("fn", [sliding_window_mask, window_by_hand,
                                lambda n, w: torch.ones(n, n, dtype=torch.bool).triu(-w).tril(w)],
                         ids=["package", "by hand", "triu/tril"])
def test_sliding_window_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch10.check_sliding_window_mask, fn, capsys)
    assert ok and "✅" in out, out


WINDOW_WRONG = {
    "strict inequality": (lambda n, w: (torch.arange(n)[:, None] - torch.arange(n)).abs() < w,
                          "off by one"),
    "causal": (lambda n, w: window_by_hand(n, w).tril(), "causal window"),
    "inverted": (lambda n, w: ~window_by_hand(n, w), "inverted"),
    "half width": (lambda n, w: window_by_hand(n, w // 2), "half-width"),
    "float mask": (lambda n, w: window_by_hand(n, w).float(), "bool tensor"),
    "wrong shape": (lambda n, w: window_by_hand(n, w)[0], "has shape"),
    "one-sided future": (lambda n, w: window_by_hand(n, w).triu(), "differ from |i − j| ≤"),
}


@pytest.mark.parametrize("name", WINDOW_WRONG)
def test_sliding_window_rejects_typical_mistakes(name, capsys):
    fn, message = WINDOW_WRONG[name]
    rejects(ch10.check_sliding_window_mask, fn, message, capsys)


# --------------------------------------------------------------------------- Linformer
def linformer_by_hand(q, k, v, E, F):
    n = q.shape[-2]
    k_low, v_low = E[:, :n] @ k, F[:, :n] @ v  # (batch, heads, k_proj, d)
    weights = torch.softmax(q @ k_low.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v_low


@pytest.mark.parametrize("fn", [linformer_attention, linformer_by_hand], ids=["package", "by hand"])
def test_linformer_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch10.check_linformer_attention, fn, capsys)
    assert ok and "✅" in out, out


def _lin(scale=None, swap=False, same=False, dim=-1, slice_=True):
    def fn(q, k, v, E, F):
        n, d = q.shape[-2], q.shape[-1]
        if swap:
            E, F = F, E
        if same:
            F = E
        if slice_:
            E, F = E[:, :n], F[:, :n]
        s = q @ (E @ k).transpose(-2, -1) * (d ** -0.5 if scale is None else scale(d, E.shape[0]))
        return torch.softmax(s, dim=dim) @ (F @ v)
    return fn


def _project_queries(q, k, v, E, F):
    n = q.shape[-2]
    E, F = E[:, :n], F[:, :n]
    weights = torch.softmax((E @ q) @ (E @ k).transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ (F @ v)  # (batch, heads, k_proj, d_v)


LINFORMER_WRONG = {
    "no scale": (_lin(scale=lambda d, k: 1.0), "not scaled"),
    "scale by sqrt k": (_lin(scale=lambda d, k: k ** -0.5), "scaled by √k_proj"),
    "scale by d": (_lin(scale=lambda d, k: 1 / d), "instead of √d"),
    "E and F swapped": (_lin(swap=True), "swapped"),
    "values through E": (_lin(same=True), "use F for the values"),
    "softmax over queries": (_lin(dim=-2), "wrong axis"),
    "queries projected too": (lambda q, k, v, E, F: _project_queries(q, k, v, E, F),
                              "only the keys and values are projected"),
    "E not sliced": (_lin(slice_=False), "use E[:, :n]"),
}


@pytest.mark.parametrize("name", LINFORMER_WRONG)
def test_linformer_rejects_typical_mistakes(name, capsys):
    fn, message = LINFORMER_WRONG[name]
    rejects(ch10.check_linformer_attention, fn, message, capsys)


# --------------------------------------------------------------------------- positive features
def features_by_hand(x, omega):
    x = x / x.shape[-1] ** 0.25
    return torch.exp(x @ omega.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(omega.shape[0])


@pytest.mark.parametrize("fn", [
    features_by_hand,
    lambda x, omega: positive_random_features(x, omega, is_query=True, stabilise=False),
], ids=["by hand", "package"])
def test_positive_features_accept_correct_answers(fn, capsys):
    ok, out = verdict(ch10.check_positive_features, fn, capsys)
    assert ok and "✅" in out, out


def _phi(x_scale=None, sign=-1.0, squared=True, divide=None, per_row=True):
    def fn(x, omega):
        d, m = x.shape[-1], omega.shape[0]
        x = x * (d ** -0.25 if x_scale is None else x_scale(d))
        norm = (x * x).sum(-1, keepdim=True).sqrt() if per_row else (x * x).sum().sqrt()
        return torch.exp(x @ omega.T + sign * (norm ** 2 if squared else norm) / 2) / (
            math.sqrt(m) if divide is None else divide(m))
    return fn


def trigonometric(x, omega):
    x = x / x.shape[-1] ** 0.25
    proj = x @ omega.T
    scale = torch.exp((x * x).sum(-1, keepdim=True) / 2) / math.sqrt(omega.shape[0])
    return scale * torch.cat([torch.sin(proj), torch.cos(proj)], dim=-1)


FEATURES_WRONG = {
    "no d^-1/4": (_phi(x_scale=lambda d: 1.0), "x is not scaled"),
    "1/sqrt(d)": (_phi(x_scale=lambda d: d ** -0.5), "scaled by 1/√d"),
    "no norm term": (_phi(sign=0.0), "−‖x'‖²/2 term is missing"),
    "plus norm": (_phi(sign=1.0), "sign of the norm term"),
    "norm not squared": (_phi(squared=False), "squared norm"),
    "no 1/sqrt(m)": (_phi(divide=lambda m: 1.0), "divide by √m"),
    "1/m": (_phi(divide=float), "divided by m"),
    "norm of the whole tensor": (_phi(per_row=False), "squared norm of each row"),
    "stabilised by a row maximum": (
        lambda x, o: positive_random_features(x, o, is_query=True), "maximum was subtracted"),
    "trigonometric": (trigonometric, "trigonometric features"),
    "cosine only": (lambda x, o: trigonometric(x, o)[..., o.shape[0]:] * 0 + torch.cos(x @ o.T),
                    "negative"),
}


@pytest.mark.parametrize("name", FEATURES_WRONG)
def test_positive_features_reject_typical_mistakes(name, capsys):
    fn, message = FEATURES_WRONG[name]
    rejects(ch10.check_positive_features, fn, message, capsys)
