"""Chapter 13's checkers accept the reference answers and name the typical mistakes."""

import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

from tfm_course.exercises import ch13
from tfm_course.models.llama_hf import hf_name


def _run(check, fn):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ok = check(fn)
    return ok, out.getvalue()


def test_rmsnorm_checker():
    assert _run(ch13.check_rmsnorm, lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)[0]
    for wrong, says in [
        (lambda x, w, eps: F.layer_norm(x, (x.shape[-1],), w, None, eps), "subtracted the mean"),
        (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w, "outside the square root"),
        (lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), "weight is missing"),
        (lambda x, w, eps: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w, "*sum* of squares"),
    ]:
        ok, out = _run(ch13.check_rmsnorm, wrong)
        assert not ok and says in out, out


def _swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def test_swiglu_checker():
    assert _run(ch13.check_swiglu, _swiglu)[0]
    for wrong, says in [
        (lambda x, g, u, d: _swiglu(x, u, g, d), "wrong branch"),
        (lambda x, g, u, d: (F.gelu(x @ g.T) * (x @ u.T)) @ d.T, "GeGLU"),
        (lambda x, g, u, d: F.silu(x @ g.T) @ d.T, "up branch is missing"),
    ]:
        ok, out = _run(ch13.check_swiglu, wrong)
        assert not ok and says in out, out


def test_kv_head_checker():
    assert _run(ch13.check_kv_head_of, lambda h, k: [i // (h // k) for i in range(h)])[0]
    assert _run(ch13.check_kv_head_of, lambda h, k: torch.arange(h) // (h // k))[0]
    ok, out = _run(ch13.check_kv_head_of, lambda h, k: [i % k for i in range(h)])
    assert not ok and "interleaved" in out
    ok, out = _run(ch13.check_kv_head_of, lambda h, k: [i // k for i in range(h)])
    assert not ok and "group size" in out


def test_hf_name_checker():
    assert _run(ch13.check_hf_name, hf_name)[0]
    ok, out = _run(ch13.check_hf_name, lambda n: hf_name(n).removeprefix("model."))
    assert not ok and "under `model.`" in out
    ok, out = _run(ch13.check_hf_name, lambda n: hf_name(n).replace("gate_proj", "X").replace("up_proj", "gate_proj").replace("X", "up_proj"))
    assert not ok and "swapped" in out
    ok, out = _run(ch13.check_hf_name, lambda n: (_ for _ in ()).throw(NotImplementedError()))
    assert not ok and "not attempted" in out


@pytest.mark.parametrize("check", [ch13.check_rmsnorm, ch13.check_swiglu, ch13.check_kv_head_of, ch13.check_hf_name])
def test_a_stub_is_not_attempted(check):
    def stub(*args):
        raise NotImplementedError
    ok, out = _run(check, stub)
    assert not ok and "not attempted" in out
