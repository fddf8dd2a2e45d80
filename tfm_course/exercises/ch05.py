"""Checkers for chapter 5, "The encoder-decoder Transformer".

>>> from tfm_course.exercises import ch05
>>> ch05.check_target_mask(my_target_mask)      # fn(tgt (B, T), pad_id) -> bool (B, 1, T, T)
>>> ch05.check_shift_targets(my_shift)          # fn(target (B, T+1)) -> (decoder input, labels)
>>> ch05.check_label_smoothed_loss(my_loss)     # fn(logits, target, pad_id=0, label_smoothing=0.0)
>>> ch05.check_greedy_search(my_greedy)         # fn(next_logits, batch_size, bos_id, eos_id, max_len, pad_id=0)

Each prints what is wrong in words and returns True or False; none raises because of your answer.
Masks follow the book's convention: bool, True = may attend.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import causal_mask
from ..data.translation import shift_targets
from ..decoding import greedy_search
from ..models.transformer import sequence_loss, target_mask
from ._checking import Failed, attempt, close, expect_tensor, run_checks, seeded

__all__ = ["check_target_mask", "check_shift_targets", "check_label_smoothed_loss",
           "check_greedy_search"]


# --------------------------------------------------------------------------- target mask
def _mask_cases() -> list[tuple[str, Tensor, int]]:
    right = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 2, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 5, 2], [1, 4, 5, 6, 2]])
    other_pad = torch.tensor([[1, 5, 6, 3, 3], [1, 4, 2, 3, 3]])  # pad_id = 3
    return [("right-padded batch", right, 0), ("left-padded batch", left, 0),
            ("pad_id = 3", other_pad, 3), ("no padding", torch.tensor([[1, 4, 5, 2]]), 0)]


def check_target_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """``fn(tgt, pad_id)`` must return the bool ``(B, 1, T, T)`` causal + key-padding mask."""

    def case(tgt: Tensor, pad_id: int) -> Callable[[], None]:
        def check() -> None:
            want = target_mask(tgt, pad_id)
            got = attempt(fn, tgt.clone(), pad_id)
            B, T = tgt.shape
            if isinstance(got, Tensor) and got.shape == (B, T, T):
                raise Failed(f"shape (B, T, T) = {tuple(got.shape)}: add the head axis, "
                             f"(B, 1, T, T) = {tuple(want.shape)}, so it broadcasts over heads")
            expect_tensor(got, want, "the target mask")
            if got.dtype != torch.bool:
                raise Failed(f"the mask must be a bool tensor (True = may attend), got {got.dtype}")
            got = got.cpu()
            if torch.equal(got, want):
                return
            causal = causal_mask(T)
            keys = (tgt != pad_id)[:, None, None, :]
            queries = (tgt != pad_id)[:, None, :, None]
            if torch.equal(got, ~want):
                raise Failed("mask convention reversed: True must mean may attend")
            if torch.equal(got, queries & causal):
                raise Failed("you masked padded *query rows* (B, 1, T, 1) instead of padded *key "
                             "columns* (B, 1, 1, T) — the `(tgt != 0).unsqueeze(1).unsqueeze(3)` "
                             "line of many from-scratch Transformers: real queries can then read "
                             "padding (see the left-padded batch), and padded rows are left with "
                             "no key at all")
            if torch.equal(got, keys & causal.T):
                raise Failed("upper triangle: query t reads the future keys t..T-1 — keep tril")
            if torch.equal(got, keys.expand_as(want)):
                raise Failed("the future is visible: combine the padding mask with the causal "
                             "(lower-triangular) mask")
            if pad_id != 0 and torch.equal(got, target_mask(tgt, 0)):
                raise Failed("use the pad_id argument, not a hard-coded 0")
            if torch.equal(got, causal.expand_as(want)):
                raise Failed("padded keys are not masked: a real query may read <pad> tokens "
                             "(with left padding the causal mask does not hide them)")
            if torch.equal(got, keys & causal.tril(-1)):
                raise Failed("the diagonal is missing: position t may attend to itself")
            where = (got != want).nonzero()[0].tolist()
            raise Failed(f"entry [batch {where[0]}, query {where[2]}, key {where[3]}] is "
                         f"{bool(got[tuple(where)])}, expected {bool(want[tuple(where)])}: query t "
                         "may attend keys s <= t that are not padding")
        return check

    return run_checks("target mask", [(name, case(t, p)) for name, t, p in _mask_cases()])


# --------------------------------------------------------------------------- shift targets
def check_shift_targets(fn: Callable[[Tensor], tuple[Tensor, Tensor]]) -> bool:
    """``fn(target)`` with target ``<bos> y1 … yn <eos> <pad>…`` must return (input, labels)."""

    def case(target: Tensor) -> Callable[[], None]:
        def check() -> None:
            want_in, want_out = shift_targets(target)
            got = attempt(fn, target.clone())
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Failed("return a pair (decoder_input, labels)")
            got_in, got_out = got
            if isinstance(got_in, Tensor) and isinstance(got_out, Tensor):
                if torch.equal(got_in, got_out):
                    raise Failed("the decoder input and the labels are the same tensor: the "
                                 "model would learn to copy its input. Labels are the input "
                                 "shifted one step to the left")
                if got_in.shape == want_in.shape and torch.equal(got_in, want_out) \
                        and torch.equal(got_out, want_in):
                    raise Failed("input and labels are swapped: the decoder input starts with "
                                 "<bos>, the labels end with <eos>")
            expect_tensor(got_in, want_in, "the decoder input")
            expect_tensor(got_out, want_out, "the labels")
            if not torch.equal(got_in.cpu(), want_in):
                raise Failed("the decoder input should be target[:, :-1] (everything but the last "
                             "position; it starts with <bos>)")
            if not torch.equal(got_out.cpu(), want_out):
                raise Failed("the labels should be target[:, 1:] (everything but <bos>)")
        return check

    cases = [torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]]), torch.tensor([[1, 4, 2]]),
             torch.tensor([[1, 9, 9, 2, 0, 0], [1, 3, 4, 5, 6, 2], [1, 2, 0, 0, 0, 0]])]
    return run_checks("shift targets", [(f"target of shape {tuple(t.shape)}", case(t)) for t in cases])


# --------------------------------------------------------------------------- label smoothing
def check_label_smoothed_loss(fn: Callable[..., Tensor]) -> bool:
    """``fn(logits (B, T, V), target (B, T), pad_id=0, label_smoothing=0.0)`` -> scalar mean loss."""

    def case(seed: int, eps: float, pad_id: int) -> Callable[[], None]:
        def check() -> None:
            g = seeded(seed)
            B, T, V = 3, 5, 7
            logits = torch.randn(B, T, V, generator=g) * 2
            target = torch.randint(0, V, (B, T), generator=g)
            target[target == pad_id] = (pad_id + 1) % V
            target[1, 3:] = pad_id
            target[2, 1:] = pad_id
            want = sequence_loss(logits, target, pad_id=pad_id, label_smoothing=eps)
            got = attempt(fn, logits.clone(), target.clone(), pad_id=pad_id, label_smoothing=eps)
            if isinstance(got, Tensor) and got.numel() == B * T:
                raise Failed(f"return one number (the mean over real tokens), not a tensor of "
                             f"shape {tuple(got.shape)}")
            if not isinstance(got, Tensor) or got.numel() != 1:
                raise Failed(f"the loss should be a scalar tensor, got {type(got).__name__}")
            got = got.detach().reshape(()).cpu()
            if close(got, want, atol=1e-5):
                return
            flat, flat_t = logits.reshape(-1, V), target.reshape(-1)
            keep = flat_t != pad_id
            logp = F.log_softmax(flat, -1)
            nll = -logp.gather(1, flat_t[:, None]).squeeze(1)
            if close(got, F.cross_entropy(flat, flat_t, label_smoothing=eps), atol=1e-5):
                raise Failed("padding positions are counted: average only over target != pad_id")
            if close(got, (nll * keep).sum() / flat_t.numel(), atol=1e-5) or close(
                    got, sequence_loss(logits, target, pad_id, eps) * keep.sum() / flat_t.numel(),
                    atol=1e-5):
                raise Failed("you divided by every position, padding included: divide by the "
                             "number of real tokens")
            if close(got, want * keep.sum(), atol=1e-4):
                raise Failed("you summed the per-token losses: take the mean over real tokens")
            if eps > 0 and close(got, sequence_loss(logits, target, pad_id, 0.0), atol=1e-5):
                raise Failed(f"label_smoothing={eps} has no effect: mix ε · (mean over the classes "
                             "of −log p) into the loss")
            others = (-logp.sum(1) - nll) / (V - 1)
            if eps > 0 and close(got, (((1 - eps) * nll + eps * others) * keep).sum() / keep.sum(),
                                 atol=1e-5):
                raise Failed("you spread ε over the V − 1 wrong classes; this book (and "
                             "PyTorch's label_smoothing) spreads ε/V over all V classes, so the "
                             "right class gets 1 − ε + ε/V")
            if eps > 0 and close(got, ((1 - eps) * nll * keep).sum() / keep.sum(), atol=1e-5):
                raise Failed("only (1 − ε) · NLL: the smoothing term ε · mean over classes of "
                             "−log p is missing")
            raise Failed(f"loss {float(got):.5f}, expected {float(want):.5f} for "
                         f"label_smoothing={eps}, pad_id={pad_id}")
        return check

    cases = [(0, 0.0, 0), (1, 0.1, 0), (2, 0.3, 0), (3, 0.2, 4)]
    return run_checks("label-smoothed loss",
                      [(f"ε = {e}, pad_id = {p}", case(s, e, p)) for s, e, p in cases])


# --------------------------------------------------------------------------- greedy search
class _ScriptedDecoder:
    """A stand-in decoder: while a row's prefix follows its script it favours the next scripted
    token; off script it favours a 'wrong' token and never says <eos>."""

    PAD, BOS, EOS, V = 0, 1, 2, 9

    def __init__(self, scripts: list[list[int]]) -> None:
        self.scripts = scripts

    def __call__(self, prefix: Tensor) -> Tensor:
        if prefix.dim() != 2 or prefix.shape[0] != len(self.scripts):
            raise ValueError(f"next_logits takes the whole prefix (batch={len(self.scripts)}, t), "
                             f"got {tuple(prefix.shape)}")
        logits = torch.zeros(len(self.scripts), self.V)
        t = prefix.shape[1] - 1  # tokens generated so far
        for row, script in enumerate(self.scripts):
            on_script = prefix[row, 0] == self.BOS and prefix[row, 1:].tolist() == script[:t]
            favourite = script[t] if on_script and t < len(script) else 3 + (t + row) % 5
            logits[row] = torch.linspace(0, 1, self.V)  # a gentle slope, so argmin != argmax
            logits[row, favourite] = 5.0
        return logits


def check_greedy_search(fn: Callable[..., Tensor]) -> bool:
    """``fn(next_logits, batch_size, bos_id, eos_id, max_len, pad_id=0)`` -> ``(batch, L)`` tokens."""
    D = _ScriptedDecoder

    def case(scripts: list[list[int]], max_len: int) -> Callable[[], None]:
        def check() -> None:
            decoder = D(scripts)
            want = greedy_search(decoder, len(scripts), D.BOS, D.EOS, max_len, D.PAD)
            got = attempt(fn, D(scripts), len(scripts), D.BOS, D.EOS, max_len, pad_id=D.PAD)
            if not isinstance(got, Tensor) or got.dim() != 2 or got.shape[0] != len(scripts):
                shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
                raise Failed(f"return a (batch={len(scripts)}, L) tensor of tokens, got {shape}")
            got = got.cpu().long()
            if bool((got[:, 0] == D.BOS).all()):
                raise Failed("the output starts with <bos>: return only the generated tokens")
            if got.shape[1] > max_len:
                raise Failed(f"{got.shape[1]} tokens generated but max_len={max_len}")
            full = torch.full((len(scripts), max_len), D.PAD)
            full[:, :got.shape[1]] = got
            full_want = torch.full((len(scripts), max_len), D.PAD)
            full_want[:, :want.shape[1]] = want
            if torch.equal(full, full_want):
                return
            if not torch.equal(full[:, 0], full_want[:, 0]):
                raise Failed("the first token is not the most likely one: take the argmax of the "
                             "logits over the vocabulary")
            after = ((full_want == D.EOS).cumsum(1) > 0) & (full_want == D.PAD)
            cut = (full == D.PAD) & (full_want != D.PAD)
            if bool(cut.any()):
                raise Failed("some sequences stop before their <eos>: keep going until *every* "
                             "sequence has finished (or max_len is reached)")
            if bool((full != full_want)[~after].any()):
                raise Failed("the first token is right but later ones are not: append each "
                             "chosen token to the prefix and call next_logits on the longer prefix")
            raise Failed("tokens after <eos>: once a sequence has produced <eos> it is "
                         "finished — fill the rest of its row with pad_id")
        return check

    E = D.EOS
    cases = [([[4, 5, E], [6, E], [7, 7, 8, E]], 8), ([[3, 3, 3, 3, E]], 3),
             ([[E], [5, 4, 3, 6, E]], 10)]
    return run_checks("greedy search", [(f"{len(s)} sequence(s), max_len={m}", case(s, m))
                                        for s, m in cases])
