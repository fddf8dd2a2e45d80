"""Who uses context? The same two questions put to every pretraining objective and to counts.

    q = context_questions(valid_stream, n=2048, left=16, right=16, generator=g)   # fixed questions
    refs = count_references(train_documents, q, vocab_size=tok.vocab_size)      # KN n-grams
    scores = answer_questions("prefix LM", model, q, specials)                  # loss / accuracy

A question is a position of the validation stream with ``left`` tokens before it and ``right``
after it. **Next token**: predict it from the left context alone. **Infilling**: predict it from
both sides. The model's answer (:func:`~tfm_course.experiments.encdec_objectives.ask_next_token`,
:func:`~tfm_course.experiments.encdec_objectives.ask_infill`) is scored over the text tokens only:
the ids that are never text (pad, ``[MASK]``, sentinels) are removed from its softmax, so a model
is not charged for the format of its own objective.

The references count the training documents (:class:`tfm_course.ngram.KneserNey`): the unigram,
the bigram and the 4-gram for the next token, and the two-sided bigram
p(x | left neighbour, right neighbour) for infilling. A model that beats the bigram is reading its
context; the causal and prefix LMs cannot see the right side, so their infilling answer is their
next-token answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ngram import KneserNey, Unigram
from .encdec_objectives import ask_infill, ask_next_token
from .objectives import Specials, ban

__all__ = ["Questions", "context_questions", "split_documents", "count_references", "answer_questions"]


@dataclass
class Questions:
    """``left (n, l)``, ``target (n,)``, ``right (n, r)`` token ids (one device)."""

    left: Tensor
    target: Tensor
    right: Tensor

    def __len__(self) -> int:
        return len(self.target)

    def take(self, rows: slice) -> "Questions":
        return Questions(self.left[rows], self.target[rows], self.right[rows])


def context_questions(stream: Tensor, n: int, left: int, right: int, generator: torch.Generator,
                      eos: int | None = None) -> Questions:
    """``n`` random positions of ``stream (N,)`` with ``left`` tokens before and ``right`` after.
    With ``eos``, positions whose target is EOS are skipped (a question about text, not about
    where a docstring ends)."""
    if stream.dim() != 1 or stream.numel() <= left + right + 1:
        raise ValueError(f"stream must be 1-D and longer than left + right + 1 = {left + right + 1}, "
                         f"got {tuple(stream.shape)}")
    if n < 1 or left < 1 or right < 1:
        raise ValueError(f"n, left and right must be >= 1, got n={n}, left={left}, right={right}")
    device = generator.device
    found: list[Tensor] = []
    while sum(len(f) for f in found) < n:
        pos = torch.randint(left, stream.numel() - right, (2 * n,), generator=generator, device=device)
        pos = pos.to(stream.device)
        if eos is not None:
            pos = pos[stream[pos] != eos]
        found.append(pos)
    pos = torch.cat(found)[:n]
    return Questions(stream[pos[:, None] + torch.arange(-left, 0, device=stream.device)], stream[pos],
                     stream[pos[:, None] + torch.arange(1, right + 1, device=stream.device)])


def split_documents(stream: Tensor, eos: int) -> list[Tensor]:
    """The stream cut after each EOS: one 1-D tensor per document (EOS kept at its end)."""
    ends = (stream == eos).nonzero().flatten().tolist()
    starts = [0] + [e + 1 for e in ends]
    return [stream[s:e + 1] for s, e in zip(starts, ends + [stream.numel() - 1]) if e >= s]


def count_references(documents: Sequence[Tensor], questions: Questions, vocab_size: int) -> dict[str, float]:
    """Mean NLL (nats) and accuracy of the count-based answers to ``questions``: ``{"next token:
    unigram" | "next token: KN bigram" | "next token: KN 4-gram" | "infill: KN two-sided bigram":
    {"loss", "accuracy"}}`` (``vocab_size``: the text tokens'; every id in the questions below it)."""
    docs = [d.cpu().numpy() for d in documents]
    left, target, right = (t.cpu() for t in (questions.left, questions.target, questions.right))
    windows = torch.cat([left, target[:, None]], 1)
    out: dict[str, dict[str, float]] = {}
    uni = Unigram(vocab_size).fit(docs)
    p_uni = uni.distribution()
    out["next token: unigram"] = {"loss": float(-p_uni.log()[target].mean()),
                                  "accuracy": float((p_uni.argmax() == target).double().mean())}
    for order, name in ((2, "KN bigram"), (4, "KN 4-gram")):
        lm = KneserNey(order, vocab_size).fit(docs)
        loss = lm.score_windows(windows)[:, -1]
        # argmax of p(. | last order-1 tokens) per question: through the bigram matrix for order 2
        if order == 2:
            guess = lm.bigram_matrix()[left[:, -1]].argmax(1)
        else:
            guess = torch.stack([lm.distribution(ctx.tolist()).argmax() for ctx in left[:, -(order - 1):]])
        out[f"next token: {name}"] = {"loss": float(loss.mean()), "accuracy": float((guess == target).double().mean())}
        if order == 2:
            trio = torch.stack([left[:, -1], target, right[:, 0]], 1)
            two = lm.two_sided(trio)[:, 1]
            P = lm.bigram_matrix()
            scores = P[left[:, -1]] * P[:, right[:, 0]].T  # (n, V): p(w | a) p(b | w)
            out["infill: KN two-sided bigram"] = {
                "loss": float(two.mean()), "accuracy": float((scores.argmax(1) == target).double().mean())}
    return out


@torch.no_grad()
def answer_questions(objective: str, model, questions: Questions, specials: Specials,
                     batch: int = 512, cut: int | None = None) -> dict[str, dict[str, float]]:
    """``{"next token" | "infill": {"loss": mean NLL (nats), "accuracy": top-1}}`` of ``model``,
    asked as ``objective`` trained it, scored over the text tokens only (see the module).
    ``cut``: the prefix LM's next-token question with the context cut there
    (:func:`~tfm_course.experiments.encdec_objectives.ask_next_token`)."""
    model.eval()
    never = [specials.pad, specials.mask] + specials.sentinels
    sums = {"next token": [0.0, 0.0], "infill": [0.0, 0.0]}
    for start in range(0, len(questions), batch):
        q = questions.take(slice(start, start + batch))
        for name, logits in (("next token", ask_next_token(objective, model, q.left, specials, cut=cut)),
                             ("infill", ask_infill(objective, model, q.left, q.right, specials))):
            logits = ban(logits.float(), never)
            sums[name][0] += F.cross_entropy(logits, q.target, reduction="sum").item()
            sums[name][1] += (logits.argmax(-1) == q.target).sum().item()
    return {name: {"loss": s[0] / len(questions), "accuracy": s[1] / len(questions)} for name, s in sums.items()}
