"""Chapter 11 checkers: each accepts correct answers and rejects typical mistakes with the right words."""

from __future__ import annotations

import pytest
import torch

from checker_helpers import rejects, verdict
from tfm_course.efficient.retnet import decay_mask, retention, retention_step
from tfm_course.exercises import ch11


def accepts(checker, fn, capsys):
    ok, out = verdict(checker, fn, capsys)
    assert ok and "✅" in out, out


# --------------------------------------------------------------------------- parallel retention
def retention_loops(q, k, v, gamma):
    """out_n = Σ_{m ≤ n} γ^(n−m) (q_n · k_m) v_m, with loops."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for n in range(q.shape[2]):
        for m in range(n + 1):
            weight = (q[:, :, n] * k[:, :, m]).sum(-1) * gamma ** (n - m)  # (b, h)
            out[:, :, n] += weight[..., None] * v[:, :, m]
    return out


@pytest.mark.parametrize("fn", [lambda q, k, v, g: retention(q, k, v, g), retention_loops,
                                lambda q, k, v, g: retention(q, k, v, g, mode="recurrent")],
                         ids=["package", "loops", "recurrent"])
def test_parallel_retention_accepts(fn, capsys):
    accepts(ch11.check_parallel_retention, fn, capsys)


def _scores(q, k):
    return q @ k.transpose(-2, -1)


PARALLEL_WRONG = {
    "matrix product (ERRATA 14)": (lambda q, k, v, g: _scores(q, k) @ decay_mask(g, q.shape[2]) @ v,
                                   "applied element-wise"),
    "not causal": (lambda q, k, v, g: (_scores(q, k) * g[:, None, None] ** (
        torch.arange(q.shape[2])[:, None] - torch.arange(q.shape[2])[None, :]).abs()) @ v, "not causal"),
    "transposed": (lambda q, k, v, g: (_scores(q, k) * decay_mask(g, q.shape[2]).mT) @ v, "transposed"),
    "no decay": (lambda q, k, v, g: (_scores(q, k) * (decay_mask(g, q.shape[2]) > 0)) @ v, "no decay"),
    "softmax": (lambda q, k, v, g: torch.softmax(
        (_scores(q, k) * decay_mask(g, q.shape[2])).masked_fill(decay_mask(g, q.shape[2]) == 0, float("-inf")),
        -1) @ v, "softmax"),
    "wrong shape": (lambda q, k, v, g: retention(q, k, v, g).sum(1), "has shape"),
    "crashes": (lambda q, k, v, g: q @ v, "your function raised"),
}


@pytest.mark.parametrize("name", PARALLEL_WRONG)
def test_parallel_retention_rejects(name, capsys):
    fn, message = PARALLEL_WRONG[name]
    rejects(ch11.check_parallel_retention, fn, message, capsys)


# --------------------------------------------------------------------------- one retention step
def step_by_hand(q_t, k_t, v_t, gamma, state):
    new = gamma[:, None, None] * state + torch.einsum("bhi,bhj->bhij", k_t, v_t)
    return torch.einsum("bhi,bhij->bhj", q_t, new), new


@pytest.mark.parametrize("fn", [retention_step, step_by_hand], ids=["package", "einsum"])
def test_retention_step_accepts(fn, capsys):
    accepts(ch11.check_retention_step, fn, capsys)


def _outer(k, v):
    return k[..., :, None] * v[..., None, :]


def _read(q, state):
    """(out_t, state) with out_t = q_t state."""
    return (q[..., None, :] @ state).squeeze(-2), state


STEP_WRONG = {
    "no decay": (lambda q, k, v, g, s: _read(q, s + _outer(k, v)), "not decayed"),
    "decays the update": (lambda q, k, v, g, s: _read(q, g[:, None, None] * (s + _outer(k, v))),
                          "only the old state decays"),
    "outer product reversed": (lambda q, k, v, g, s: (None, g[:, None, None] * s.mT + _outer(v, k)),
                               "wrong way round"),
    "reads the old state": (lambda q, k, v, g, s: ((q[..., None, :] @ s).squeeze(-2), step_by_hand(q, k, v, g, s)[1]),
                            "reads the old state"),
    "swapped pair": (lambda q, k, v, g, s: step_by_hand(q, k, v, g, s)[::-1], "wrong order"),
    "not a pair": (lambda q, k, v, g, s: step_by_hand(q, k, v, g, s)[0], "should return a pair"),
}


@pytest.mark.parametrize("name", STEP_WRONG)
def test_retention_step_rejects(name, capsys):
    fn, message = STEP_WRONG[name]
    rejects(ch11.check_retention_step, fn, message, capsys)


# --------------------------------------------------------------------------- cross-chunk term
def cross_chunk(q, state, gamma):
    j = torch.arange(q.shape[2], dtype=q.dtype)
    xi = gamma[:, None] ** (j + 1)  # (heads, B)
    return (q @ state) * xi[..., None]


def cross_chunk_via_package(q, state, gamma):
    """The package's chunkwise retention of [previous chunk; this chunk] minus the inner part."""
    return torch.einsum("bhjk,bhkv->bhjv", q, state) * torch.stack(
        [gamma ** (j + 1) for j in range(q.shape[2])], -1)[..., None]


@pytest.mark.parametrize("fn", [cross_chunk, cross_chunk_via_package], ids=["matmul", "einsum"])
def test_cross_chunk_accepts(fn, capsys):
    accepts(ch11.check_cross_chunk, fn, capsys)


def _power(q, gamma, exponent):
    j = torch.arange(q.shape[2], dtype=q.dtype)
    return gamma[:, None, None] ** exponent(j, q.shape[2])[:, None]


CROSS_WRONG = {
    "gamma^j": (lambda q, s, g: (q @ s) * _power(q, g, lambda j, B: j), "off by one"),
    "zeta": (lambda q, s, g: (q @ s) * _power(q, g, lambda j, B: B - 1 - j), "ζ_j"),
    "no decay": (lambda q, s, g: q @ s, "no decay"),
    "gamma^B": (lambda q, s, g: (q @ s) * _power(q, g, lambda j, B: B + 0 * j), "γ^B"),
    "wrong shape": (lambda q, s, g: (q @ s).sum(2), "has shape"),
}


@pytest.mark.parametrize("name", CROSS_WRONG)
def test_cross_chunk_rejects(name, capsys):
    fn, message = CROSS_WRONG[name]
    rejects(ch11.check_cross_chunk, fn, message, capsys)


def test_cross_chunk_is_what_chunkwise_retention_adds():
    """The checked term is the package's: chunkwise output of chunk 2 = inner part + this term."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 8, 4, generator=g, dtype=torch.float64)
    gamma = torch.tensor([0.9, 0.7], dtype=torch.float64)
    full = retention(q, k, v, gamma, mode="chunkwise", chunk_size=4)
    inner = retention(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], gamma)
    zeta = gamma[:, None, None] ** (3 - torch.arange(4, dtype=torch.float64))[:, None]
    state = k[:, :, :4].mT @ (v[:, :, :4] * zeta)  # R_0
    torch.testing.assert_close(full[:, :, 4:], inner + cross_chunk(q[:, :, 4:], state, gamma))


# --------------------------------------------------------------------------- discretisation
def discretise(delta, A, B):
    return torch.exp(delta[..., None] * A), delta[..., None] * B[:, :, None, :]


def discretise_einsum(delta, A, B):
    return torch.exp(torch.einsum("bld,dn->bldn", delta, A)), torch.einsum("bld,bln->bldn", delta, B)


@pytest.mark.parametrize("fn", [discretise, discretise_einsum], ids=["broadcast", "einsum"])
def test_discretisation_accepts(fn, capsys):
    accepts(ch11.check_discretisation, fn, capsys)


DISC_WRONG = {
    "euler A": (lambda d, A, B: (1 + d[..., None] * A, discretise(d, A, B)[1]), "Euler"),
    "no delta in A": (lambda d, A, B: (torch.exp(A).expand(*d.shape, A.shape[1]), discretise(d, A, B)[1]),
                      "Δ is missing"),
    "no exp": (lambda d, A, B: (d[..., None] * A, discretise(d, A, B)[1]), "exponential is missing"),
    "no delta in B": (lambda d, A, B: (discretise(d, A, B)[0], B[:, :, None, :].expand(*d.shape, B.shape[-1])),
                      "Δ is missing: B_bar"),
    "exact ZOH B": (lambda d, A, B: (discretise(d, A, B)[0],
                                     (torch.exp(d[..., None] * A) - 1) / A * B[:, :, None, :]),
                    "exact zero-order-hold"),
    "swapped pair": (lambda d, A, B: discretise(d, A, B)[::-1], "differs"),
}


@pytest.mark.parametrize("name", DISC_WRONG)
def test_discretisation_rejects(name, capsys):
    fn, message = DISC_WRONG[name]
    rejects(ch11.check_discretisation, fn, message, capsys)


# --------------------------------------------------------------------------- selective-scan step
def scan_step(h, x, delta, A, B, C, D):
    new_h = torch.exp(delta[..., None] * A) * h + (delta * x)[..., None] * B[:, None, :]
    return (new_h * C[:, None, :]).sum(-1) + D * x, new_h


def scan_step_via_package(h, x, delta, A, B, C, D):
    """By linearity: the package's one-token scan from a zero state, plus the decayed old state."""
    from tfm_course.efficient.mamba import selective_scan
    y_from_zero = selective_scan(x[:, None], delta[:, None], A, B[:, None], C[:, None], D)[:, 0]
    decayed = torch.exp(delta[..., None] * A) * h
    new_h = decayed + (delta * x)[..., None] * B[:, None, :]
    return y_from_zero + (decayed * C[:, None, :]).sum(-1), new_h


@pytest.mark.parametrize("fn", [scan_step, scan_step_via_package], ids=["by hand", "package scan"])
def test_selective_scan_step_accepts(fn, capsys):
    accepts(ch11.check_selective_scan_step, fn, capsys)


def _with(h=None, y=None):
    """A wrong step: the right answer with the new state or the output replaced."""
    def fn(hh, x, d, A, B, C, D):
        y_ok, h_ok = scan_step(hh, x, d, A, B, C, D)
        new_h = h(hh, x, d, A, B, C, D) if h else h_ok
        return (y(new_h, hh, x, d, A, B, C, D) if y else y_ok), new_h
    return fn


SCAN_WRONG = {
    "exp(A)": (_with(h=lambda h, x, d, A, B, C, D: torch.exp(A) * h + (d * x)[..., None] * B[:, None, :]),
               "not exp(A)"),
    "euler decay": (_with(h=lambda h, x, d, A, B, C, D: (1 + d[..., None] * A) * h + (d * x)[..., None] * B[:, None, :]),
                    "Euler"),
    "input not scaled": (_with(h=lambda h, x, d, A, B, C, D: torch.exp(d[..., None] * A) * h + x[..., None] * B[:, None, :]),
                         "not scaled by Δ_t"),
    "B and C swapped": (_with(h=lambda h, x, d, A, B, C, D: torch.exp(d[..., None] * A) * h + (d * x)[..., None] * C[:, None, :]),
                        "B and C are swapped"),
    "no D": (_with(y=lambda nh, h, x, d, A, B, C, D: (nh * C[:, None, :]).sum(-1)), "D x_t is missing"),
    "old state": (_with(y=lambda nh, h, x, d, A, B, C, D: (h * C[:, None, :]).sum(-1) + D * x), "old state"),
    "swapped pair": (lambda *a: scan_step(*a)[::-1], "wrong order"),
}


@pytest.mark.parametrize("name", SCAN_WRONG)
def test_selective_scan_step_rejects(name, capsys):
    fn, message = SCAN_WRONG[name]
    rejects(ch11.check_selective_scan_step, fn, message, capsys)


def test_checkers_accept_the_package_and_report_stubs(capsys):
    def stub(*args):
        raise NotImplementedError

    for checker in (getattr(ch11, name) for name in ch11.__all__):
        ok, out = verdict(checker, stub, capsys)
        assert ok is False and "not attempted yet" in out
