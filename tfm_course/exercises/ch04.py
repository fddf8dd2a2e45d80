"""Checkers for chapter 4, "Feed-forward blocks, normalisation and the encoder layer".

>>> from tfm_course.exercises import ch04
>>> ch04.check_layer_norm(my_layer_norm)      # fn(x, weight, bias, eps) -> (..., d)
>>> ch04.check_rms_norm(my_rms_norm)          # fn(x, weight, eps) -> (..., d)
>>> ch04.check_swiglu(my_swiglu)              # fn(x, w_gate, w_up, w_down) -> (..., d)
>>> ch04.check_post_ln_layer(my_post_ln)      # fn(layer, x, mask=None) -> (batch, seq, d)
>>> ch04.check_pre_ln_layer(my_pre_ln)        # fn(layer, x, mask=None) -> (batch, seq, d)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import padding_mask
from ..layers import EncoderLayer
from ._checking import Failed, attempt, compare_with_mistakes, run_checks, seeded

__all__ = ["check_layer_norm", "check_rms_norm", "check_swiglu", "check_post_ln_layer",
           "check_pre_ln_layer"]

UNBIASED = ("you divided by d − 1 (the *unbiased* variance, which torch.var and torch.std use by "
            "default); LayerNorm divides by d — pass unbiased=False (or correction=0)")
EPS_OUTSIDE = ("eps is added outside the square root: divide by sqrt(var + eps), not "
               "sqrt(var) + eps")
NO_EPS = "eps is missing: divide by sqrt(var + eps), so that a near-constant vector does not explode"
WRONG_AXIS = ("normalised over the wrong axis: each position's feature vector is normalised on its "
              "own, i.e. over the last dim (dim=-1, keepdim=True), never across positions or the batch")


def _last_dim_cases() -> list[tuple[str, Tensor, float]]:
    g = seeded(0)
    shifted = 3 * torch.randn(2, 5, 8, generator=g) + 2                 # mean and scale far from 0/1
    flat = torch.randn(4, 16, generator=g) * 2 - 1
    near_constant = 1 + 1e-3 * torch.randn(3, 6, generator=g)           # eps matters here
    return [("x of shape (2, 5, 8)", shifted, 1e-5), ("x of shape (4, 16)", flat, 1e-5),
            ("a nearly constant x of shape (3, 6), eps = 0.01", near_constant, 1e-2)]


# --------------------------------------------------------------------------- LayerNorm
def _layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float, dim=-1, unbiased: bool = False,
                eps_outside: bool = False, centre: bool = True) -> Tensor:
    mean = x.mean(dim=dim, keepdim=True) if centre else torch.zeros(())
    if centre:
        var = x.var(dim=dim, keepdim=True, unbiased=unbiased)
    else:
        var = x.pow(2).mean(dim=dim, keepdim=True)
    scale = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    return (x - mean) / scale * w + b


def check_layer_norm(fn: Callable[[Tensor, Tensor, Tensor, float], Tensor]) -> bool:
    """``fn(x, weight, bias, eps)`` must normalise ``x`` over its last dim, then scale and shift."""

    def case(x: Tensor, eps: float) -> Callable[[], None]:
        def check() -> None:
            d = x.shape[-1]
            g = seeded(d)
            w, b = 1 + 0.5 * torch.randn(d, generator=g), torch.randn(d, generator=g)
            want = F.layer_norm(x, (d,), w, b, eps)
            got = attempt(fn, x.clone(), w.clone(), b.clone(), eps)
            plain = F.layer_norm(x, (d,), eps=eps)
            other_axes = [dim for dim in range(x.dim() - 1)]
            mistakes = [
                (lambda: _layer_norm(x, w, b, eps, unbiased=True), UNBIASED),
                (lambda: _layer_norm(x, w, b, eps, eps_outside=True), EPS_OUTSIDE),
                (lambda: _layer_norm(x, w, b, 0.0), NO_EPS),
                (lambda: _layer_norm(x, w, b, eps, centre=False),
                 "the mean is not subtracted: that is RMSNorm; LayerNorm centres first, x − mean(x)"),
                (lambda: plain, "weight and bias are not applied: after normalising, multiply by "
                                "weight and add bias (the learned per-feature scale and shift)"),
                (lambda: plain * w, "bias is not added: y · weight + bias"),
                (lambda: plain + b, "weight is not applied: y · weight + bias"),
                *[(lambda dim=dim: _layer_norm(x, w, b, eps, dim=dim), WRONG_AXIS) for dim in other_axes],
                (lambda: _layer_norm(x, w, b, eps, dim=tuple(range(x.dim()))), WRONG_AXIS),
                (lambda: _layer_norm(x, w, b, eps, dim=tuple(range(1, x.dim()))), WRONG_AXIS),
            ]
            compare_with_mistakes(got, want, mistakes, "the normalised output")
        return check

    return run_checks("LayerNorm", [(name, case(x, eps)) for name, x, eps in _last_dim_cases()])


# --------------------------------------------------------------------------- RMSNorm
def _rms_norm(x: Tensor, w: Tensor, eps: float, dim=-1, eps_outside: bool = False) -> Tensor:
    ms = x.pow(2).mean(dim=dim, keepdim=True)
    return x / (ms.sqrt() + eps if eps_outside else (ms + eps).sqrt()) * w


def check_rms_norm(fn: Callable[[Tensor, Tensor, float], Tensor]) -> bool:
    """``fn(x, weight, eps)`` must return x / sqrt(mean(x², last dim) + eps) · weight."""

    def case(x: Tensor, eps: float) -> Callable[[], None]:
        def check() -> None:
            d = x.shape[-1]
            w = 1 + 0.5 * torch.randn(d, generator=seeded(d))
            want = _rms_norm(x, w, eps)
            got = attempt(fn, x.clone(), w.clone(), eps)
            mistakes = [
                (lambda: _layer_norm(x, w, 0.0, eps),
                 "you subtracted the mean: RMSNorm does not centre — divide x itself by its root "
                 "mean square, sqrt(mean(x²) + eps)"),
                (lambda: _layer_norm(x, w, 0.0, eps, unbiased=True),
                 "you subtracted the mean (and used the unbiased variance): RMSNorm does not "
                 "centre — divide x by sqrt(mean(x²) + eps)"),
                (lambda: x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w,
                 f"off by a factor √d = {d ** 0.5:.3g}: divide by the root *mean* square "
                 "sqrt(mean(x²)), not by the L2 norm sqrt(sum(x²))"),
                (lambda: x / x.norm(dim=-1, keepdim=True) * w,
                 f"off by a factor √d = {d ** 0.5:.3g}: divide by the root *mean* square "
                 "sqrt(mean(x²) + eps), not by the L2 norm"),
                (lambda: _rms_norm(x, w, eps, eps_outside=True), EPS_OUTSIDE.replace("var", "mean(x²)")),
                (lambda: _rms_norm(x, w, 0.0), NO_EPS.replace("var", "mean(x²)")),
                (lambda: _rms_norm(x, 1.0, eps), "weight is not applied: multiply by weight at the end"),
                *[(lambda dim=dim: _rms_norm(x, w, eps, dim=dim), WRONG_AXIS) for dim in range(x.dim() - 1)],
                (lambda: _rms_norm(x, w, eps, dim=tuple(range(x.dim()))), WRONG_AXIS),
            ]
            compare_with_mistakes(got, want, mistakes, "the normalised output")
        return check

    return run_checks("RMSNorm", [(name, case(x, eps)) for name, x, eps in _last_dim_cases()])


# --------------------------------------------------------------------------- SwiGLU
def check_swiglu(fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> bool:
    """``fn(x, w_gate, w_up, w_down)`` must return (SiLU(x w_gate) ⊙ (x w_up)) w_down.

    ``w_gate``, ``w_up``: (d, d_ff); ``w_down``: (d_ff, d). The names are those of
    :class:`tfm_course.layers.FeedForward` and Hugging Face LLaMA (``gate_proj``, ``up_proj``,
    ``down_proj``): the gate is the branch through the SiLU.
    """

    def case(shape: tuple[int, ...], d_ff: int) -> Callable[[], None]:
        def check() -> None:
            g = seeded(sum(shape))
            d = shape[-1]
            x = torch.randn(*shape, generator=g)
            w_gate = torch.randn(d, d_ff, generator=g) / d**0.5
            w_up = torch.randn(d, d_ff, generator=g) / d**0.5
            w_down = torch.randn(d_ff, d, generator=g) / d_ff**0.5
            want = (F.silu(x @ w_gate) * (x @ w_up)) @ w_down
            got = attempt(fn, x.clone(), w_gate.clone(), w_up.clone(), w_down.clone())
            if isinstance(got, Tensor) and got.shape == (*shape[:-1], d_ff):
                raise Failed(f"shape {tuple(got.shape)} ends in d_ff = {d_ff}: apply the output "
                             f"projection w_down to get back to d_model = {d}")
            mistakes = [
                (lambda: (F.silu(x @ w_up) * (x @ w_gate)) @ w_down,
                 "SiLU is applied to the wrong branch: the gate is SiLU(x w_gate), the up branch "
                 "x w_up stays linear"),
                (lambda: (torch.sigmoid(x @ w_gate) * (x @ w_up)) @ w_down,
                 "that is GLU (a sigmoid gate); SwiGLU's gate is SiLU / Swish: z · sigmoid(z)"),
                (lambda: (F.relu(x @ w_gate) * (x @ w_up)) @ w_down,
                 "that is ReGLU (a ReLU gate); SwiGLU uses SiLU"),
                (lambda: (F.gelu(x @ w_gate) * (x @ w_up)) @ w_down,
                 "that is GEGLU (a GELU gate); SwiGLU uses SiLU"),
                (lambda: F.silu(x @ w_gate) @ w_down,
                 "the up branch x w_up is missing: SwiGLU multiplies SiLU(x w_gate) element-wise "
                 "by x w_up"),
                (lambda: F.silu((x @ w_gate) * (x @ w_up)) @ w_down,
                 "SiLU is applied after the product: SiLU(x w_gate) ⊙ (x w_up), not "
                 "SiLU(x w_gate ⊙ x w_up)"),
            ]
            compare_with_mistakes(got, want, mistakes, "the SwiGLU output", atol=1e-4)
        return check

    return run_checks("SwiGLU", [
        ("x of shape (2, 5, 8), d_ff = 12", case((2, 5, 8), 12)),
        ("x of shape (3, 16), d_ff = 24", case((3, 16), 24)),
        ("x of shape (1, 1, 4), d_ff = 6", case((1, 1, 4), 6)),
    ])


# --------------------------------------------------------------------------- encoder layer
def _layer_cases(norm_first: bool) -> list[tuple[str, EncoderLayer, Tensor, Tensor | None]]:
    cases = []
    for name, seed, activation, lengths in (("no mask, ReLU", 0, "relu", None),
                                            ("key-padding mask, ReLU", 1, "relu", [6, 4, 2]),
                                            ("key-padding mask, GELU", 2, "gelu", [5, 6, 1])):
        torch.manual_seed(seed)
        layer = EncoderLayer(16, 4, 32, dropout=0.1, activation=activation, norm_first=norm_first)
        with torch.no_grad():  # random norm parameters, so that mixing norm1 and norm2 shows
            for norm in (layer.norm1, layer.norm2):
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(0.0, 0.3)
        layer.eval()
        x = torch.randn(3, 6, 16, generator=seeded(seed))
        mask = None if lengths is None else padding_mask(torch.tensor(lengths), 6)[:, None, None, :]
        cases.append((name, layer, x, mask))
    return cases


def _sublayers(layer: EncoderLayer, mask: Tensor | None):
    return (lambda h: layer.self_attn(h, mask=mask)), layer.ffn, layer.norm1, layer.norm2


def _post_ln(layer: EncoderLayer, x: Tensor, mask: Tensor | None) -> Tensor:
    attn, ffn, n1, n2 = _sublayers(layer, mask)
    x = n1(x + attn(x))
    return n2(x + ffn(x))


def _pre_ln(layer: EncoderLayer, x: Tensor, mask: Tensor | None) -> Tensor:
    attn, ffn, n1, n2 = _sublayers(layer, mask)
    x = x + attn(n1(x))
    return x + ffn(n2(x))


def _layer_mistakes(layer: EncoderLayer, x: Tensor, mask: Tensor | None,
                    norm_first: bool) -> list[tuple[Callable[[], Tensor], str]]:
    attn, ffn, n1, n2 = _sublayers(layer, mask)
    unmasked = _pre_ln if norm_first else _post_ln
    mistakes: list[tuple[Callable[[], Tensor], str]] = []
    if mask is not None:
        mistakes.append((lambda: unmasked(layer, x, None),
                         "the mask is ignored: pass it to the attention, layer.self_attn(h, mask=mask)"))
    if norm_first:
        mistakes += [
            (lambda: _post_ln(layer, x, mask),
             "that is the Post-LN order (normalise after adding the residual); Pre-LN normalises "
             "the input of each sublayer: x + attn(norm1(x)), then x + ffn(norm2(x))"),
            (lambda: ffn(n2(attn(n1(x)))), "both residual connections are missing: x + sublayer(norm(x))"),
            (lambda: ffn(n2(x + attn(n1(x)))), "the residual around the feed-forward block is "
             "missing: x + ffn(norm2(x))"),
            (lambda: (lambda h: h + ffn(n2(h)))(attn(n1(x))),
             "the residual around the attention is missing: x + attn(norm1(x))"),
            (lambda: (lambda h: h + ffn(n2(h)))(n1(x) + attn(n1(x))),
             "the residual carries the normalised x: add attn(norm1(x)) to x itself, not to "
             "norm1(x) — the residual stream is never normalised in Pre-LN"),
            (lambda: (lambda h: h + ffn(n1(h)))(x + attn(n2(x))),
             "norm1 and norm2 are swapped: norm1 goes with the attention, norm2 with the feed-forward"),
        ]
    else:
        mistakes += [
            (lambda: _pre_ln(layer, x, mask),
             "that is the Pre-LN order (normalise each sublayer's input); Post-LN normalises after "
             "adding the residual: norm1(x + attn(x)), then norm2(x + ffn(x))"),
            (lambda: n2(ffn(n1(attn(x)))), "both residual connections are missing: norm(x + sublayer(x))"),
            (lambda: n2(ffn(n1(x + attn(x)))),
             "the residual around the feed-forward block is missing: norm2(x + ffn(x))"),
            (lambda: (lambda h: n2(h + ffn(h)))(n1(attn(x))),
             "the residual around the attention is missing: norm1(x + attn(x))"),
            (lambda: (lambda h: h + ffn(h))(n1(x + attn(x))),
             "the final norm2 is missing: Post-LN ends with norm2(x + ffn(x))"),
            (lambda: (lambda h: n1(h + ffn(h)))(n2(x + attn(x))),
             "norm1 and norm2 are swapped: norm1 goes with the attention, norm2 with the feed-forward"),
        ]
    return mistakes


def _check_layer(fn: Callable[..., Tensor], norm_first: bool, title: str) -> bool:
    def case(layer: EncoderLayer, x: Tensor, mask: Tensor | None) -> Callable[[], None]:
        def check() -> None:
            with torch.no_grad():
                want = (_pre_ln if norm_first else _post_ln)(layer, x, mask)
                got = attempt(fn, layer, x.clone(), mask)
                compare_with_mistakes(got, want, _layer_mistakes(layer, x, mask, norm_first), "the layer's output",
                         atol=1e-4)
        return check

    return run_checks(title, [(name, case(layer, x, mask))
                              for name, layer, x, mask in _layer_cases(norm_first)])


def check_post_ln_layer(fn: Callable[..., Tensor]) -> bool:
    """``fn(layer, x, mask=None)``: the Post-LN encoder layer from ``layer``'s submodules.

    ``layer`` is a :class:`tfm_course.layers.EncoderLayer` in eval mode (dropout off); use
    ``layer.self_attn``, ``layer.ffn``, ``layer.norm1``, ``layer.norm2``.
    """
    return _check_layer(fn, norm_first=False, title="Post-LN encoder layer")


def check_pre_ln_layer(fn: Callable[..., Tensor]) -> bool:
    """``fn(layer, x, mask=None)``: the Pre-LN encoder layer from ``layer``'s submodules."""
    return _check_layer(fn, norm_first=True, title="Pre-LN encoder layer")
