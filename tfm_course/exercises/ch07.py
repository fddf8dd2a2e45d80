"""Checkers for chapter 7, "BERT".

>>> from tfm_course.exercises import ch07
>>> ch07.check_bert_input(my_input)          # fn(model, ids, segment_ids) -> (batch, seq, d)
>>> ch07.check_pair(my_pair)                 # fn(a, b, cls_id, sep_id) -> (ids, segment_ids)
>>> ch07.check_attention_mask(my_mask)       # fn(ids, pad_id) -> bool, broadcasts to (b, h, s, s)
>>> ch07.check_mask_tokens(my_mask_tokens)   # fn(ids, special_mask, vocab_size, mask_id, p, generator)
>>> ch07.check_whole_word_mask(my_choice)     # fn(ids, special_mask, word_starts, p, generator) -> bool
>>> ch07.check_mlm_decoder(my_decoder)       # fn(hidden, dense, norm, embedding, bias) -> logits

Each prints what is wrong in words and returns True or False; none raises because of your answer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import LayerNorm
from ..models.bert import Bert, BertConfig
from ._checking import Failed, attempt, compare_with_mistakes, expect_tensor, run_checks, seeded

__all__ = ["check_bert_input", "check_pair", "check_attention_mask", "check_mask_tokens",
           "check_whole_word_mask", "check_mlm_decoder"]

IGNORE = -100


# --------------------------------------------------------------------------- the input
def _random_bert(seed: int, type_vocab_size: int = 2) -> Bert:
    torch.manual_seed(seed)
    model = Bert(BertConfig(vocab_size=30, max_positions=16, type_vocab_size=type_vocab_size,
                            d_model=12, num_layers=1, num_heads=2, d_ff=24))
    with torch.no_grad():  # embeddings of similar size, and a norm that is not the identity
        for table in (model.token_embedding, model.segment_embedding, model.position_embedding):
            table.weight.normal_(0.0, 1.0)
        model.embedding_norm.weight.normal_(1.0, 0.3)
        model.embedding_norm.bias.normal_(0.0, 0.3)
    return model.eval()


def check_bert_input(fn: Callable[[Bert, Tensor, Tensor], Tensor]) -> bool:
    """``fn(model, ids, segment_ids)``: BERT's input representation ``(batch, seq, d_model)``.

    Use ``model.token_embedding``, ``model.segment_embedding``, ``model.position_embedding``
    (positions 0, 1, …) and ``model.embedding_norm``; the model is in eval mode (no dropout).
    """

    def case(seed: int, batch: int, seq: int) -> Callable[[], None]:
        def check() -> None:
            model = _random_bert(seed)
            g = seeded(seed)
            ids = torch.randint(0, 30, (batch, seq), generator=g)
            segments = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).clone()
            tok, seg = model.token_embedding(ids), model.segment_embedding(segments)
            pos = model.position_embedding(torch.arange(seq))
            norm = model.embedding_norm
            with torch.no_grad():
                want = norm(tok + seg + pos)
                got = attempt(fn, model, ids.clone(), segments.clone())
                mistakes = [
                    (lambda: norm(tok + pos), "the segment embeddings are missing: BERT sums "
                     "token + segment + position embeddings (segment 0 for A, 1 for B)"),
                    (lambda: norm(tok + seg), "the position embeddings are missing: without them "
                     "the encoder cannot tell word order"),
                    (lambda: tok + seg + pos, "the LayerNorm is missing: normalise the sum with "
                     "model.embedding_norm"),
                    (lambda: norm(tok) + seg + pos, "the LayerNorm comes after the sum of all three "
                     "embeddings, not on the token embedding alone"),
                    (lambda: norm(tok + seg + model.position_embedding(torch.arange(1, seq + 1))),
                     "positions start at 0: use torch.arange(seq), not arange(1, seq + 1)"),
                    (lambda: norm(tok + seg + model.position_embedding(torch.arange(batch))[:, None]),
                     "the positions are indexed by the batch index: use torch.arange(seq) over "
                     "the sequence axis (dim 1)"),
                    (lambda: norm(tok + seg + pos) * math.sqrt(12), "no √d scaling in BERT: the "
                     "three embeddings are summed as they are"),
                    (lambda: norm(tok * math.sqrt(12) + seg + pos), "no √d scaling in BERT: the "
                     "three embeddings are summed as they are"),
                ]
            compare_with_mistakes(got, want, mistakes, "the input representation")
        return check

    return run_checks("BERT input", [("batch 2, length 7", case(0, 2, 7)),
                                     ("batch 3, length 10", case(1, 3, 10)),
                                     ("batch 1, length 2", case(2, 1, 2))])


# --------------------------------------------------------------------------- a pair
def _as_list(x: object, what: str) -> list[int]:
    try:
        return [int(v) for v in torch.as_tensor(x).flatten().tolist()]
    except (TypeError, ValueError, RuntimeError):
        raise Failed(f"{what} should be a list or 1-D tensor of integers, got {type(x).__name__}") from None


def check_pair(fn: Callable[[list[int], list[int], int, int], tuple]) -> bool:
    """``fn(a, b, cls_id, sep_id) -> (ids, segment_ids)`` for ``[CLS] a [SEP] b [SEP]``."""
    CLS, SEP = 101, 102

    def case(a: list[int], b: list[int]) -> Callable[[], None]:
        def check() -> None:
            got = attempt(fn, list(a), list(b), CLS, SEP)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Failed("return two things: (ids, segment_ids)")
            ids, segments = _as_list(got[0], "ids"), _as_list(got[1], "segment_ids")
            want_ids = [CLS, *a, SEP, *b, SEP]
            want_segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            if ids != want_ids:
                if ids[:1] != [CLS]:
                    raise Failed("the pair starts with [CLS] (cls_id): its final hidden state is "
                                 "what the NSP head and classifiers read")
                if ids == [CLS, *a, SEP, *b]:
                    raise Failed("the final [SEP] is missing: each segment ends with [SEP]")
                if ids == [CLS, *a, *b, SEP]:
                    raise Failed("the [SEP] between the segments is missing")
                raise Failed(f"ids should be [CLS] a [SEP] b [SEP] = {want_ids}, got {ids}")
            if len(segments) != len(ids):
                raise Failed(f"segment_ids must have one entry per token ({len(ids)}), "
                             f"got {len(segments)}")
            if segments == want_segments:
                return
            if set(segments) == {1, 2} or segments == [s + 1 for s in want_segments]:
                raise Failed("segment ids are 0 for the first segment and 1 for the second "
                             "(they index a table with type_vocab_size = 2 rows)")
            if segments == [0] * len(ids):
                raise Failed("every token is in segment 0: the tokens of b and the final [SEP] "
                             "are segment 1")
            if segments == [0] * (len(a) + 1) + [1] * (len(b) + 2):
                raise Failed("the [SEP] that closes a belongs to segment 0, with a")
            if segments == [0] * (len(a) + 2) + [1] * len(b) + [0]:
                raise Failed("the final [SEP] belongs to segment 1, with b")
            if segments == [1] + want_segments[1:]:
                raise Failed("[CLS] is in segment 0")
            raise Failed(f"segment_ids should be {want_segments}, got {segments}")
        return check

    return run_checks("sentence pair", [("a = [7, 8, 9], b = [20, 21]", case([7, 8, 9], [20, 21])),
                                        ("a = [5], b = [6, 6, 6, 6]", case([5], [6, 6, 6, 6])),
                                        ("a = [3, 4], b = [] (empty)", case([3, 4], []))])


# --------------------------------------------------------------------------- attention mask
def check_attention_mask(fn: Callable[[Tensor, int], Tensor]) -> bool:
    """``fn(ids, pad_id)``: a bool mask, True = may attend, that broadcasts to the scores
    ``(batch, heads, seq, seq)`` and hides the padded *keys* from every query."""
    HEADS = 4

    def case(ids: Tensor, pad_id: int) -> Callable[[], None]:
        def check() -> None:
            batch, seq = ids.shape
            scores = (batch, HEADS, seq, seq)
            real = ids != pad_id
            want = real[:, None, None, :].expand(scores)
            got = attempt(fn, ids.clone(), pad_id)
            if not isinstance(got, Tensor):
                raise Failed(f"return a torch.Tensor, got {type(got).__name__}")
            if got.dtype != torch.bool:
                raise Failed(f"the mask must be bool, True = may attend (not 0/1 numbers or an "
                             f"additive 0 / −inf mask), got {got.dtype}")
            if tuple(got.shape) == (batch, seq):
                raise Failed(f"shape (batch, seq) = {tuple(got.shape)} would line the batch axis up "
                             "with the queries: add the head and query axes, "
                             "mask[:, None, None, :] -> (batch, 1, 1, seq)")
            try:
                fits = torch.broadcast_shapes(tuple(got.shape), scores) == scores
            except RuntimeError:
                fits = False
            if not fits:
                raise Failed(f"shape {tuple(got.shape)} does not broadcast to the scores "
                             f"(batch, heads, seq, seq) = {scores}; use (batch, 1, 1, seq)")
            got = got.cpu().expand(scores)
            if torch.equal(got, want):
                return
            if torch.equal(got, ~want):
                raise Failed("reversed: True must mark the real tokens (may attend), False the padding")
            if torch.equal(got, real[:, None, :, None].expand(scores)):
                raise Failed("you masked the padded *query rows* (batch, 1, seq, 1); mask the padded "
                             "*keys* instead, (batch, 1, 1, seq): no query may read padding")
            if pad_id != 0 and torch.equal(got, (ids != 0)[:, None, None, :].expand(scores)):
                raise Failed("use the pad_id argument, not a hard-coded 0")
            raise Failed("the mask differs from the key-padding mask (ids != pad_id)[:, None, None, :]")
        return check

    right = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 2, 0, 0, 0]])
    other = torch.tensor([[1, 5, 6, 2, 3, 3], [1, 4, 4, 4, 4, 2], [1, 2, 3, 3, 3, 3]])
    return run_checks("attention mask from padding", [
        ("pad_id = 0", case(right, 0)), ("pad_id = 3", case(other, 3)),
        ("one row, no padding", case(torch.tensor([[1, 9, 9, 2]]), 0))])


# --------------------------------------------------------------------------- masking
PAD, CLS, SEP, MASK = 0, 1, 2, 3
VOCAB = 50
Z = 5.0  # bounds at five standard deviations
ONLY_MASKED = ("only the [MASK]ed positions have labels: the 10 % replaced by a random token and "
               "the 10 % left unchanged were chosen too, and need labels")


def _mask_batch(batch: int, seq: int, min_len: int, max_len: int, seed: int) -> tuple[Tensor, Tensor]:
    g = seeded(seed)
    ids = torch.randint(4, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=g)
    pos = torch.arange(seq)[None, :]
    ids[:, 0] = CLS
    ids[pos == lengths[:, None] - 1] = SEP
    ids[pos >= lengths[:, None]] = PAD
    return ids, ids <= SEP


def _near(count: int, trials: int, p: float) -> bool:
    return trials > 0 and abs(count - trials * p) <= Z * math.sqrt(trials * p * (1 - p)) + 1


def _check_masking(ids: Tensor, special: Tensor, inputs: Tensor, labels: Tensor, p: float,
                   statistics: bool) -> None:
    chosen = labels != IGNORE
    n_real, n_chosen = int((~special).sum()), int(chosen.sum())
    if n_chosen > 0.6 * n_real:
        raise Failed(f"{n_chosen / n_real:.0%} of the positions have a label: labels are -100 "
                     "everywhere except at the chosen positions (is it inverted?)")
    if (chosen & special).any():
        raise Failed("special positions ([CLS], [SEP], padding: special_mask True) were chosen; "
                     "choose only among the non-special positions")
    if not (labels[chosen] == ids[chosen]).all():
        if torch.equal(labels[chosen], inputs[chosen]):
            raise Failed("labels hold the corrupted inputs; they must hold the *original* ids")
        raise Failed("at a chosen position the label must be the original id ids[i, t]")
    if not torch.equal(inputs[~chosen], ids[~chosen]):
        if torch.equal(chosen, inputs == MASK):
            raise Failed(ONLY_MASKED)
        raise Failed("inputs changed at positions whose label is -100: only chosen positions "
                     "may be corrupted")
    masked = int((inputs[chosen] == MASK).sum())
    if statistics and masked == n_chosen and abs(n_chosen - 0.8 * p * n_real) < abs(n_chosen - p * n_real):
        raise Failed(ONLY_MASKED)
    if (chosen.sum(1) == 0).any():
        raise Failed("a sequence got no chosen position: choose at least one per sequence "
                     "(short sequences often get none from 15 % alone)")
    if not statistics:
        return
    if not _near(n_chosen, n_real, p):
        raise Failed(f"{n_chosen / n_real:.1%} of the non-special positions were chosen, expected "
                     f"about p = {p:.0%} (is p ignored or applied twice?)")
    if masked == n_chosen:
        raise Failed("every chosen position became [MASK]: 80 % become [MASK], 10 % a random "
                     "token and 10 % stay unchanged, so the model cannot trust an unmasked token")
    replaced = (inputs != ids) & (inputs != MASK) & chosen
    if (replaced & (inputs <= MASK)).any():
        raise Failed("a random replacement is a special token ([PAD], [CLS], [SEP] or [MASK]); "
                     "draw the random tokens from the non-special ids only")
    n_replaced, n_kept = int(replaced.sum()), int(((inputs == ids) & chosen).sum())
    drawable = VOCAB - 4  # a random draw equal to the original token counts as unchanged
    for name, count, share in (("[MASK]", masked, 0.8),
                               ("a random token", n_replaced, 0.1 * (1 - 1 / drawable)),
                               ("unchanged", n_kept, 0.1 + 0.1 / drawable)):
        if not _near(count, n_chosen, share):
            raise Failed(f"{count / n_chosen:.1%} of the chosen positions became {name}, expected "
                         f"about {share:.0%} (80 / 10 / 10)")


def check_mask_tokens(fn: Callable[..., tuple[Tensor, Tensor]]) -> bool:
    """``fn(ids, special_mask, vocab_size, mask_id, p=0.15, generator=None) -> (inputs, labels)``.

    The special ids are 0-3 (``[PAD]``, ``[CLS]``, ``[SEP]``, ``[MASK]`` = ``mask_id``); every
    other id below ``vocab_size`` is an ordinary token.
    """

    def case(batch: int, seq: int, min_len: int, max_len: int, p: float, seed: int,
             statistics: bool) -> Callable[[], None]:
        def check() -> None:
            ids, special = _mask_batch(batch, seq, min_len, max_len, seed)
            original = ids.clone()
            got = attempt(fn, ids, special.clone(), VOCAB, MASK, p=p, generator=seeded(seed))
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Failed("return two tensors: (inputs, labels)")
            inputs = expect_tensor(got[0], ids, "inputs").cpu()
            labels = expect_tensor(got[1], ids, "labels").cpu()
            if not torch.equal(ids, original):
                raise Failed("ids was modified in place: work on a copy (ids.clone()), the caller "
                             "still needs the original")
            if labels.is_floating_point() or inputs.is_floating_point():
                raise Failed("inputs and labels must hold integer token ids (torch.long)")
            _check_masking(ids, special, inputs, labels, p, statistics)
        return check

    return run_checks("masking (MLM)", [
        ("128 sequences of up to 64 tokens, p = 0.15", case(128, 64, 20, 64, 0.15, 0, True)),
        ("128 sequences, p = 0.3", case(128, 64, 20, 64, 0.3, 1, True)),
        ("short sequences of 2 to 4 ordinary tokens", case(64, 8, 4, 6, 0.15, 2, False)),
    ])


# --------------------------------------------------------------------------- whole words
def _words(ids: Tensor, special: Tensor, table: Tensor) -> list[list[list[int]]]:
    """Per row, its words as lists of positions: a start and the ordinary tokens after it."""
    rows = []
    for row_ids, row_special in zip(ids.tolist(), special.tolist()):
        words: list[list[int]] = []
        current = None
        for t, (i, s) in enumerate(zip(row_ids, row_special)):
            if s:
                current = None
            elif current is None or bool(table[i]):
                current = [t]
                words.append(current)
            else:
                current.append(t)
        rows.append(words)
    return rows


def _check_whole_words(ids: Tensor, special: Tensor, table: Tensor, chosen: Tensor, p: float) -> None:
    if (chosen & special).any():
        raise Failed("special positions ([CLS], [SEP], padding: special_mask True) were chosen; "
                     "a special token is never part of a word")
    n_real = (~special).sum(1)
    k = torch.round(p * n_real).clamp(min=1).minimum(n_real)
    all_words = _words(ids, special, table)
    partial = [(row, word) for row, words in enumerate(all_words) for word in words
               if chosen[row, word].any() and not chosen[row, word].all()]
    if partial:
        row, word = partial[0]
        if any(not chosen[r, w[0]] for r, w in partial):
            raise Failed(f"row {row}: the word at positions {word} was chosen in part (pieces without "
                         "their start): did you treat every token as a word? Group a start "
                         "(word_starts[id] True, a row's first token, a token after a special one) "
                         "with the tokens that follow it, and choose them together")
        if all(not chosen[r, w[1:]].any() for r, w in partial):
            raise Failed(f"row {row}: only the first piece of the word at positions {word} was "
                         "chosen; a word is its start and every token after it up to the next "
                         "start, and all of them are chosen together")
        raise Failed(f"row {row}: the word at positions {word} was chosen in part; choose all its "
                     "tokens or none")
    for row, words in enumerate(all_words):
        n = int(chosen[row].sum())
        if n > int(k[row]):
            raise Failed(f"row {row}: {n} tokens chosen, more than its budget k = max(1, round(p · n)) "
                         f"= {int(k[row])} tokens; skip a word that does not fit")
        left = int(k[row]) - n
        for word in words:
            if not chosen[row, word].any() and len(word) <= left:
                raise Failed(f"row {row}: {left} tokens of the budget are left, and the word at "
                             f"positions {word} ({len(word)} tokens) was not chosen although it fits; "
                             "skip only the words that do not fit, and go on with the next")


def check_whole_word_mask(fn: Callable[..., Tensor]) -> bool:
    """``fn(ids, special_mask, word_starts, p=0.15, generator=None) -> chosen``, bool ``(batch, seq)``.

    ``word_starts`` is a bool table ``(vocab,)``: True for the ids that begin a word. A word is a
    start (an id marked in the table, a row's first token, a token right after a special one) and
    the ordinary tokens after it up to the next start. Each row's budget is
    ``k = max(1, round(p · n))`` of its ``n`` non-special tokens; its words are taken in a random
    order (drawn with ``generator``), each chosen whole if it fits in what is left of ``k``.
    """

    def data(seed: int, batch: int, seq: int) -> tuple[Tensor, Tensor, Tensor]:
        ids, special = _mask_batch(batch, seq, seq // 2, seq, seed)
        g = seeded(seed + 100)
        table = torch.rand(VOCAB, generator=g) < 0.5
        table[:4] = True
        return ids, special, table

    def run(ids: Tensor, special: Tensor, table: Tensor, p: float, seed: int) -> Tensor:
        got = attempt(fn, ids.clone(), special.clone(), table.clone(), p=p, generator=seeded(seed))
        got = expect_tensor(got, ids, "chosen").cpu()
        if got.dtype != torch.bool:
            raise Failed(f"return a bool tensor, True at the chosen positions; got {got.dtype}")
        return got

    def case(seed: int, batch: int, seq: int, p: float) -> Callable[[], None]:
        def check() -> None:
            ids, special, table = data(seed, batch, seq)
            _check_whole_words(ids, special, table, run(ids, special, table, p, seed), p)
        return check

    def after_special() -> None:
        ids = torch.tensor([[CLS, 10, 11, SEP, 12, 13, SEP, PAD]])
        special = ids <= SEP
        table = torch.zeros(VOCAB, dtype=torch.bool)  # no id begins a word: only positions do
        table[:4] = True
        for seed in range(20):
            try:
                _check_whole_words(ids, special, table, run(ids, special, table, 0.5, seed), 0.5)
            except Failed as problem:
                raise Failed(f"{problem}. Here no id begins a word, so the words are [10, 11] after "
                             "[CLS] and [12, 13] after [SEP]: a word ends at a special token, and the "
                             "token after one begins a new word") from None

    def random_order() -> None:
        ids, special, table = data(7, 64, 32)
        draws = [run(ids, special, table, 0.15, seed) for seed in range(30)]
        if all(torch.equal(draws[0], d) for d in draws[1:]):
            raise Failed("every generator seed gave the same choice: draw the order of the words "
                         "at random (torch.randperm or torch.rand with generator=generator)")
        often = torch.stack(draws).float().mean(0)[~special]
        first = torch.zeros_like(special)
        first[:, 1] = True
        if (often[first[~special]] > 0.9).all():
            raise Failed("the first word of every row is almost always chosen: take the words in a "
                         "random order, not left to right")

    return run_checks("whole-word masking", [
        ("64 rows of up to 32 tokens, p = 0.15", case(0, 64, 32, 0.15)),
        ("64 rows, p = 0.4", case(1, 64, 32, 0.4)),
        ("a word starts after [CLS] and [SEP]", after_special),
        ("the words are drawn in a random order", random_order),
    ])


# --------------------------------------------------------------------------- MLM decoder
def check_mlm_decoder(fn: Callable[..., Tensor]) -> bool:
    """``fn(hidden, dense, norm, embedding, bias) -> logits (batch, seq, vocab)``.

    BERT's MLM head: ``norm(GELU(dense(hidden)))``, then scores against every token's *input*
    embedding (the decoder is tied to ``embedding.weight``, shape ``(vocab, d)``), plus ``bias``.
    """

    def case(batch: int, seq: int, d: int, vocab: int, seed: int) -> Callable[[], None]:
        def check() -> None:
            torch.manual_seed(seed)
            hidden = torch.randn(batch, seq, d)
            dense, embedding, norm = nn.Linear(d, d), nn.Embedding(vocab, d), LayerNorm(d, eps=1e-12)
            bias = torch.randn(vocab)
            with torch.no_grad():
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(0.0, 0.3)
                E = embedding.weight
                h = dense(hidden)
                want = norm(F.gelu(h)) @ E.T + bias
                got = attempt(fn, hidden.clone(), dense, norm, embedding, bias.clone())
                mistakes = [
                    (lambda: hidden @ E.T + bias, "the transform is skipped: apply dense, GELU and "
                     "LayerNorm before scoring against the embeddings"),
                    (lambda: norm(h) @ E.T + bias, "the GELU is missing: norm(GELU(dense(hidden)))"),
                    (lambda: norm(F.gelu(h, approximate="tanh")) @ E.T + bias,
                     "that is the tanh approximation of GELU: the original BERT code used it, but "
                     "this course's BERT, like Hugging Face's hidden_act='gelu', uses the exact, "
                     "erf-based one (F.gelu's default)"),
                    (lambda: norm(F.relu(h)) @ E.T + bias, "ReLU instead of GELU"),
                    (lambda: F.gelu(norm(h)) @ E.T + bias, "the order is dense → GELU → LayerNorm"),
                    (lambda: F.gelu(h) @ E.T + bias, "the LayerNorm is missing: norm(GELU(dense(hidden)))"),
                    (lambda: norm(F.gelu(h)) @ E.T, "the output bias is missing: add bias, one "
                     "number per vocabulary entry"),
                    (lambda: (norm(F.gelu(h)) @ E.T + bias).softmax(-1), "return logits, not "
                     "probabilities: the loss (cross-entropy) applies the softmax itself"),
                    (lambda: (norm(F.gelu(h)) @ E.T + bias).log_softmax(-1), "return logits, not "
                     "log-probabilities: the loss (cross-entropy) normalises itself"),
                ]
            if isinstance(got, Tensor) and got.shape[-1] == d and d != vocab:
                raise Failed(f"the last axis has {d} = d_model entries: score against the "
                             f"{vocab} token embeddings, h @ embedding.weight.T")
            compare_with_mistakes(got, want, mistakes, "the logits", atol=1e-4)
        return check

    return run_checks("tied MLM decoder", [("batch 2, length 5, d 8, vocab 13", case(2, 5, 8, 13, 0)),
                                           ("batch 1, length 3, d 16, vocab 40", case(1, 3, 16, 40, 1))])
