"""Chapter 4 checkers: each accepts the reference and rejects typical mistakes with the right words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from checker_helpers import rejects, verdict
from tfm_course.exercises import ch04
from tfm_course.layers import FeedForward, LayerNorm, RMSNorm


# --------------------------------------------------------------------------- LayerNorm
def ln_package(x, w, b, eps):
    norm = LayerNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
        norm.bias.copy_(b)
    return norm(x)


def ln_by_hand(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


@pytest.mark.parametrize("fn", [ln_package, ln_by_hand,
                                lambda x, w, b, eps: F.layer_norm(x, x.shape[-1:], w, b, eps)],
                         ids=["package", "by hand", "functional"])
def test_layer_norm_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch04.check_layer_norm, fn, capsys)
    assert ok and "✅" in out


def _ln(x, w, b, eps, dim=-1, unbiased=False):
    mean = x.mean(dim, keepdim=True)
    return (x - mean) / (x.var(dim, keepdim=True, unbiased=unbiased) + eps).sqrt() * w + b


LN_WRONG = {
    "unbiased variance": (lambda x, w, b, eps: _ln(x, w, b, eps, unbiased=True), "unbiased"),
    "torch.std default": (lambda x, w, b, eps: (x - x.mean(-1, keepdim=True))
                          / (x.std(-1, keepdim=True) ** 2 + eps).sqrt() * w + b, "divided by d − 1"),
    "eps outside sqrt": (lambda x, w, b, eps: (x - x.mean(-1, keepdim=True))
                         / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps) * w + b,
                         "outside the square root"),
    "no eps": (lambda x, w, b, eps: _ln(x, w, b, 0.0), "eps is missing"),
    "axis 0": (lambda x, w, b, eps: _ln(x, w, b, eps, dim=0), "wrong axis"),
    "all axes": (lambda x, w, b, eps: _ln(x, w, b, eps, dim=tuple(range(x.dim()))), "wrong axis"),
    "no affine": (lambda x, w, b, eps: _ln(x, 1.0, 0.0, eps), "weight and bias are not applied"),
    "no bias": (lambda x, w, b, eps: _ln(x, w, 0.0, eps), "bias is not added"),
    "no centring": (lambda x, w, b, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b,
                    "the mean is not subtracted"),
    "bias and weight swapped": (lambda x, w, b, eps: _ln(x, b, w, eps), "differs from the expected"),
    "wrong shape": (lambda x, w, b, eps: _ln(x, w, b, eps).mean(-1), "has shape"),
    "crashes": (lambda x, w, b, eps: x.var(dim=5), "your function raised IndexError"),
}


@pytest.mark.parametrize("name", LN_WRONG)
def test_layer_norm_checker_rejects_typical_mistakes(name, capsys):
    fn, message = LN_WRONG[name]
    rejects(ch04.check_layer_norm, fn, message, capsys)


# --------------------------------------------------------------------------- RMSNorm
def rms_package(x, w, eps):
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x)


@pytest.mark.parametrize("fn", [rms_package,
                                lambda x, w, eps: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w,
                                lambda x, w, eps: F.rms_norm(x, x.shape[-1:], w, eps)],
                         ids=["package", "by hand", "functional"])
def test_rms_norm_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch04.check_rms_norm, fn, capsys)
    assert ok and "✅" in out


def _rms(x, w, eps, dim=-1):
    return x / (x.pow(2).mean(dim, keepdim=True) + eps).sqrt() * w


RMS_WRONG = {
    "subtracts the mean": (lambda x, w, eps: _rms(x - x.mean(-1, keepdim=True), w, eps),
                           "RMSNorm does not centre"),
    "L2 norm": (lambda x, w, eps: x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w, "off by a factor √d"),
    "torch.norm": (lambda x, w, eps: x / x.norm(dim=-1, keepdim=True) * w, "off by a factor √d"),
    "eps outside sqrt": (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w,
                         "outside the square root"),
    "no eps": (lambda x, w, eps: _rms(x, w, 0.0), "eps is missing"),
    "no weight": (lambda x, w, eps: _rms(x, 1.0, eps), "weight is not applied"),
    "axis 0": (lambda x, w, eps: _rms(x, w, eps, dim=0), "wrong axis"),
    "divides by the mean": (lambda x, w, eps: x / (x.abs().mean(-1, keepdim=True) + eps) * w,
                            "differs from the expected"),
}


@pytest.mark.parametrize("name", RMS_WRONG)
def test_rms_norm_checker_rejects_typical_mistakes(name, capsys):
    fn, message = RMS_WRONG[name]
    rejects(ch04.check_rms_norm, fn, message, capsys)


# --------------------------------------------------------------------------- SwiGLU
def swiglu_package(x, w_gate, w_up, w_down):
    d, d_ff = w_gate.shape
    ffn = FeedForward(d, d_ff, activation="swiglu", bias=False)
    with torch.no_grad():
        ffn.gate.weight.copy_(w_gate.T)
        ffn.up.weight.copy_(w_up.T)
        ffn.down.weight.copy_(w_down.T)
    return ffn(x)


@pytest.mark.parametrize("fn", [swiglu_package,
                                lambda x, wg, wu, wd: ((x @ wg) * torch.sigmoid(x @ wg) * (x @ wu)) @ wd],
                         ids=["package", "by hand"])
def test_swiglu_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch04.check_swiglu, fn, capsys)
    assert ok and "✅" in out


SWIGLU_WRONG = {
    "gate on the wrong branch": (lambda x, wg, wu, wd: (F.silu(x @ wu) * (x @ wg)) @ wd, "wrong branch"),
    "the old package layout (gate = up)": (
        lambda x, wg, wu, wd: _old_layout_package(x, wg, wu, wd), "wrong branch"),
    "sigmoid (GLU)": (lambda x, wg, wu, wd: (torch.sigmoid(x @ wg) * (x @ wu)) @ wd, "that is GLU"),
    "ReLU (ReGLU)": (lambda x, wg, wu, wd: (F.relu(x @ wg) * (x @ wu)) @ wd, "that is ReGLU"),
    "GELU (GEGLU)": (lambda x, wg, wu, wd: (F.gelu(x @ wg) * (x @ wu)) @ wd, "that is GEGLU"),
    "no up branch": (lambda x, wg, wu, wd: F.silu(x @ wg) @ wd, "the up branch x w_up is missing"),
    "SiLU after the product": (lambda x, wg, wu, wd: F.silu((x @ wg) * (x @ wu)) @ wd, "after the product"),
    "no output projection": (lambda x, wg, wu, wd: F.silu(x @ wg) * (x @ wu), "apply the output projection"),
    "transposed weights": (lambda x, wg, wu, wd: (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T,
                           "your function raised RuntimeError"),
    "returns None": (lambda x, wg, wu, wd: None, "should be a torch.Tensor"),
}


def _old_layout_package(x, w_gate, w_up, w_down):
    """Loading w_up into the package's ``gate``, as the package's old names invited: the SiLU
    then acts on x w_up."""
    d, d_ff = w_gate.shape
    ffn = FeedForward(d, d_ff, activation="swiglu", bias=False)
    with torch.no_grad():
        ffn.gate.weight.copy_(w_up.T)
        ffn.up.weight.copy_(w_gate.T)
        ffn.down.weight.copy_(w_down.T)
    return ffn(x)


@pytest.mark.parametrize("name", SWIGLU_WRONG)
def test_swiglu_checker_rejects_typical_mistakes(name, capsys):
    fn, message = SWIGLU_WRONG[name]
    rejects(ch04.check_swiglu, fn, message, capsys)


# --------------------------------------------------------------------------- encoder layers
def attn(layer, mask):
    return lambda h: layer.self_attn(h, mask=mask)


def post_ln(layer, x, mask=None):
    x = layer.norm1(x + layer.self_attn(x, mask=mask))
    return layer.norm2(x + layer.ffn(x))


def pre_ln(layer, x, mask=None):
    x = x + layer.self_attn(layer.norm1(x), mask=mask)
    return x + layer.ffn(layer.norm2(x))


@pytest.mark.parametrize("fn", [post_ln, lambda layer, x, mask=None: layer(x, mask=mask)],
                         ids=["by hand", "the layer itself"])
def test_post_ln_checker_accepts_correct_answers(fn, capsys):
    ok, out = verdict(ch04.check_post_ln_layer, fn, capsys)
    assert ok and "✅" in out


def test_pre_ln_checker_accepts_the_reference(capsys):
    ok, out = verdict(ch04.check_pre_ln_layer, pre_ln, capsys)
    assert ok and "✅" in out


POST_WRONG = {
    "pre-LN order": (pre_ln, "that is the Pre-LN order"),
    "no residuals": (lambda l, x, mask=None: l.norm2(l.ffn(l.norm1(l.self_attn(x, mask=mask)))),
                     "both residual connections are missing"),
    "no attention residual": (lambda l, x, mask=None: (lambda h: l.norm2(h + l.ffn(h)))(
        l.norm1(l.self_attn(x, mask=mask))), "the residual around the attention is missing"),
    "no ffn residual": (lambda l, x, mask=None: l.norm2(l.ffn(l.norm1(x + l.self_attn(x, mask=mask)))),
                        "the residual around the feed-forward block is missing"),
    "mask ignored": (lambda l, x, mask=None: post_ln(l, x, None), "the mask is ignored"),
    "norms swapped": (lambda l, x, mask=None: (lambda h: l.norm1(h + l.ffn(h)))(
        l.norm2(x + l.self_attn(x, mask=mask))), "norm1 and norm2 are swapped"),
    "no final norm": (lambda l, x, mask=None: (lambda h: h + l.ffn(h))(
        l.norm1(x + l.self_attn(x, mask=mask))), "the final norm2 is missing"),
    "mask reversed": (lambda l, x, mask=None: post_ln(l, x, None if mask is None else ~mask),
                      "differs from the expected"),
}


@pytest.mark.parametrize("name", POST_WRONG)
def test_post_ln_checker_rejects_typical_mistakes(name, capsys):
    fn, message = POST_WRONG[name]
    rejects(ch04.check_post_ln_layer, fn, message, capsys)


PRE_WRONG = {
    "post-LN order": (post_ln, "that is the Post-LN order"),
    "no residuals": (lambda l, x, mask=None: l.ffn(l.norm2(l.self_attn(l.norm1(x), mask=mask))),
                     "both residual connections are missing"),
    "residual carries normalised x": (
        lambda l, x, mask=None: (lambda h: h + l.ffn(l.norm2(h)))(
            l.norm1(x) + l.self_attn(l.norm1(x), mask=mask)),
        "the residual carries the normalised x"),
    "no ffn residual": (lambda l, x, mask=None: l.ffn(l.norm2(x + l.self_attn(l.norm1(x), mask=mask))),
                        "the residual around the feed-forward block is missing"),
    "mask ignored": (lambda l, x, mask=None: pre_ln(l, x, None), "the mask is ignored"),
    "norms swapped": (lambda l, x, mask=None: (lambda h: h + l.ffn(l.norm1(h)))(
        x + l.self_attn(l.norm2(x), mask=mask)), "norm1 and norm2 are swapped"),
}


@pytest.mark.parametrize("name", PRE_WRONG)
def test_pre_ln_checker_rejects_typical_mistakes(name, capsys):
    fn, message = PRE_WRONG[name]
    ok, out = verdict(ch04.check_pre_ln_layer, fn, capsys)
    assert not ok and message in out, out


def test_layer_checkers_do_not_leave_grad_or_train_mode_behind(capsys):
    """The checker's layers are in eval mode, so dropout cannot make a right answer look wrong."""
    seen = []

    def spy(layer, x, mask=None):
        seen.append((layer.training, layer.dropout1.p))
        return post_ln(layer, x, mask)

    assert ch04.check_post_ln_layer(spy)
    assert seen and all(not training and p > 0 for training, p in seen)
