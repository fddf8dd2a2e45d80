"""Chapter 7 checkers: each accepts the package's answer (and one by hand) and rejects typical
mistakes with the right words."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from checker_helpers import rejects, verdict
from tfm_course.data.mlm import build_pair, mask_tokens
from tfm_course.exercises import ch07
from tfm_course.models.bert import BertConfig, MaskedLMHead
from tfm_course.models.transformer import source_mask


def accepts(checker, fn, capsys) -> None:
    ok, out = verdict(checker, fn, capsys)
    assert ok and "✅" in out, out


# --------------------------------------------------------------------------- the input
def input_by_hand(model, ids, segments):
    positions = torch.arange(ids.shape[1])
    x = model.token_embedding(ids) + model.segment_embedding(segments) + model.position_embedding(positions)
    return model.embedding_norm(x)


@pytest.mark.parametrize("fn", [lambda m, i, s: m.embed(i, s), input_by_hand], ids=["package", "by hand"])
def test_bert_input_accepts(fn, capsys):
    accepts(ch07.check_bert_input, fn, capsys)


def _input(model, ids, segments, segment=True, position=True, norm=True, start=0):
    x = model.token_embedding(ids)
    if segment:
        x = x + model.segment_embedding(segments)
    if position:
        x = x + model.position_embedding(torch.arange(start, start + ids.shape[1]))
    return model.embedding_norm(x) if norm else x


@pytest.mark.parametrize("fn, message", [
    (lambda m, i, s: _input(m, i, s, segment=False), "segment embeddings are missing"),
    (lambda m, i, s: _input(m, i, s, position=False), "position embeddings are missing"),
    (lambda m, i, s: _input(m, i, s, norm=False), "LayerNorm is missing"),
    (lambda m, i, s: _input(m, i, s, start=1), "positions start at 0"),
    (lambda m, i, s: m.embedding_norm(m.token_embedding(i) + m.segment_embedding(s)
                                      + m.position_embedding(torch.arange(i.shape[0]))[:, None]),
     "indexed by the batch index"),
    (lambda m, i, s: _input(m, i, s) * math.sqrt(12), "no √d scaling"),
    (lambda m, i, s: torch.cat([m.token_embedding(i), m.segment_embedding(s)], -1), "has shape"),
], ids=["no segments (ERRATA 3)", "no positions", "no norm", "positions from 1", "batch positions",
        "scaled", "concatenated"])
def test_bert_input_rejects(fn, message, capsys):
    rejects(ch07.check_bert_input, fn, message, capsys)


# --------------------------------------------------------------------------- a pair
def pair_by_hand(a, b, cls_id, sep_id):
    ids = torch.tensor([cls_id] + a + [sep_id] + b + [sep_id])
    segments = torch.zeros_like(ids)
    segments[len(a) + 2:] = 1
    return ids, segments


@pytest.mark.parametrize("fn", [build_pair, pair_by_hand], ids=["package", "tensors by hand"])
def test_pair_accepts(fn, capsys):
    accepts(ch07.check_pair, fn, capsys)


@pytest.mark.parametrize("fn, message", [
    (lambda a, b, c, s: ([c, *a, s, *b], [0] * (len(a) + 2) + [1] * len(b)), "final [SEP] is missing"),
    (lambda a, b, c, s: ([*a, s, *b, s], [0] * (len(a) + 1) + [1] * (len(b) + 1)), "starts with [CLS]"),
    (lambda a, b, c, s: ([c, *a, s, *b, s], [0] * (len(a) + 1) + [1] * (len(b) + 2)),
     "closes a belongs to segment 0"),
    (lambda a, b, c, s: ([c, *a, s, *b, s], [0] * (len(a) + 2) + [1] * len(b) + [0]),
     "final [SEP] belongs to segment 1"),
    (lambda a, b, c, s: ([c, *a, s, *b, s], [1] * (len(a) + 2) + [2] * (len(b) + 1)), "0 for the first"),
    (lambda a, b, c, s: ([c, *a, s, *b, s], [0] * (len(a) + len(b) + 3)), "every token is in segment 0"),
    (lambda a, b, c, s: [c, *a, s, *b, s], "return two things"),
], ids=["no final sep", "no cls", "first sep in b", "last sep in a", "segments 1/2", "all zeros",
        "ids only"])
def test_pair_rejects(fn, message, capsys):
    rejects(ch07.check_pair, fn, message, capsys)


# --------------------------------------------------------------------------- attention mask
@pytest.mark.parametrize("fn", [source_mask,
                                lambda ids, pad: (ids != pad)[:, None, None, :].expand(-1, 4, ids.shape[1], -1)],
                         ids=["package", "fully expanded"])
def test_attention_mask_accepts(fn, capsys):
    accepts(ch07.check_attention_mask, fn, capsys)


@pytest.mark.parametrize("fn, message", [
    (lambda ids, pad: (ids == pad)[:, None, None, :], "reversed"),
    (lambda ids, pad: (ids != pad)[:, None, :, None], "padded *query rows*"),
    (lambda ids, pad: ids != pad, "would line the batch axis up"),
    (lambda ids, pad: (ids != pad)[:, None, None, :].float(), "must be bool"),
    (lambda ids, pad: torch.zeros(ids.shape).masked_fill(ids == pad, -math.inf)[:, None, None, :],
     "additive"),
    (lambda ids, pad: (ids != 0)[:, None, None, :], "hard-coded 0"),
    (lambda ids, pad: (ids != pad)[:, None, :], "does not broadcast"),
], ids=["reversed", "query rows", "2-D", "float", "additive", "pad 0", "3-D"])
def test_attention_mask_rejects(fn, message, capsys):
    rejects(ch07.check_attention_mask, fn, message, capsys)


# --------------------------------------------------------------------------- masking
def mask_bernoulli(ids, special_mask, vocab_size, mask_id, p=0.15, generator=None):
    """Hugging Face's way (a coin per position) plus the at-least-one fix: also correct."""
    chosen = (torch.rand(ids.shape, generator=generator) < p) & ~special_mask
    none = chosen.sum(1) == 0
    first_real = (~special_mask).float().argmax(1)
    chosen[none, first_real[none]] = True
    chosen &= ~special_mask
    u = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (u < 0.8)] = mask_id
    random_ids = torch.randint(4, vocab_size, ids.shape, generator=generator)
    swap = chosen & (u >= 0.8) & (u < 0.9)
    inputs[swap] = random_ids[swap]
    return inputs, torch.where(chosen, ids, torch.full_like(ids, -100))


@pytest.mark.parametrize("fn", [mask_tokens, mask_bernoulli], ids=["package", "bernoulli"])
def test_mask_tokens_accepts(fn, capsys):
    accepts(ch07.check_mask_tokens, fn, capsys)


def wrong_masking(*, all_mask=False, specials=False, vocab_random=False, inverted=False,
                  at_least_one=True, labels_from_inputs=False, only_masked_labelled=False,
                  fixed_p=None, in_place=False, all_labels=False, no_swap=False):
    def fn(ids, special_mask, vocab_size, mask_id, p=0.15, generator=None):
        p = fixed_p or p
        allowed = torch.ones_like(special_mask) if specials else ~special_mask
        chosen = (torch.rand(ids.shape, generator=generator) < p) & allowed
        if at_least_one:
            none = chosen.sum(1) == 0
            chosen[none, allowed.float().argmax(1)[none]] = True
        u = torch.rand(ids.shape, generator=generator)
        if all_mask:
            u = torch.zeros_like(u)
        target = ids if in_place else ids.clone()
        low = 0 if vocab_random else 4
        random_ids = torch.randint(low, vocab_size, ids.shape, generator=generator)
        swap = chosen & (u >= 0.8) & (u < 0.9) & (not no_swap)
        if only_masked_labelled:
            chosen = chosen & (u < 0.8)
        target[chosen & (u < 0.8)] = mask_id
        target[swap] = random_ids[swap]
        source = target if labels_from_inputs else ids
        if all_labels:
            return target, ids.clone()
        if inverted:
            return target, torch.where(chosen, torch.full_like(ids, -100), source)
        return target, torch.where(chosen, source, torch.full_like(ids, -100))
    return fn


@pytest.mark.parametrize("kwargs, message", [
    (dict(all_mask=True), "every chosen position became [MASK]"),
    (dict(specials=True), "special positions"),
    (dict(vocab_random=True), "random replacement is a special token"),
    (dict(inverted=True), "is it inverted"),
    (dict(all_labels=True), "is it inverted"),
    (dict(at_least_one=False), "got no chosen position"),
    (dict(labels_from_inputs=True), "original"),
    (dict(only_masked_labelled=True), "only the [MASK]ed positions have labels"),
    (dict(only_masked_labelled=True, no_swap=True), "only the [MASK]ed positions have labels"),
    (dict(fixed_p=0.15), "is p ignored"),
    (dict(in_place=True), "modified in place"),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_mask_tokens_rejects(kwargs, message, capsys):
    rejects(ch07.check_mask_tokens, wrong_masking(**kwargs), message, capsys)


# --------------------------------------------------------------------------- whole words
def whole_words_package(ids, special_mask, word_starts, p=0.15, generator=None):
    return mask_tokens(ids, special_mask, len(word_starts), 3, p=p, generator=generator,
                       word_starts=word_starts)[1] != -100


def whole_words_by_hand(ids, special_mask, word_starts, p=0.15, generator=None, first_only=False,
                        stop_at_misfit=False, overshoot=False, left_to_right=False, no_reset=False):
    """The chapter's solution, with switches for typical mistakes."""
    chosen = torch.zeros_like(special_mask)
    for row in range(ids.shape[0]):
        words, current = [], None
        for t in range(ids.shape[1]):
            if special_mask[row, t]:
                current = None if not no_reset else current
            elif current is None or word_starts[ids[row, t]]:
                current = [t]
                words.append(current)
            else:
                current.append(t)
        n = int((~special_mask[row]).sum())
        left = min(n, max(1, round(p * n)))
        order = range(len(words)) if left_to_right else torch.randperm(len(words), generator=generator).tolist()
        for w in order:
            if len(words[w]) <= left or (overshoot and left > 0):
                chosen[row, words[w][:1] if first_only else words[w]] = True
                left -= len(words[w])
            elif stop_at_misfit:
                break
    return chosen


def every_token_a_word(ids, special_mask, word_starts, p=0.15, generator=None):
    return mask_tokens(ids, special_mask, len(word_starts), 3, p=p, generator=generator)[1] != -100


def with_specials(ids, special_mask, word_starts, p=0.15, generator=None):
    return whole_words_package(ids, special_mask, word_starts, p, generator) | (ids == 1)  # [CLS] too


@pytest.mark.parametrize("fn", [whole_words_package, whole_words_by_hand], ids=["package", "by hand"])
def test_whole_word_mask_accepts(fn, capsys):
    accepts(ch07.check_whole_word_mask, fn, capsys)


@pytest.mark.parametrize("fn, message", [
    (lambda *a, **k: whole_words_by_hand(*a, **k, first_only=True), "only the first piece"),
    (every_token_a_word, "treat every token as a word"),
    (with_specials, "special positions"),
    (lambda *a, **k: whole_words_by_hand(*a, **k, overshoot=True), "more than its budget"),
    (lambda *a, **k: whole_words_by_hand(*a, **k, stop_at_misfit=True), "although it fits"),
    (lambda *a, **k: whole_words_by_hand(*a, **k, left_to_right=True), "random order"),
    (lambda *a, **k: whole_words_by_hand(*a, **k, no_reset=True), "a word ends at a special token"),
    (lambda ids, special, starts, p=0.15, generator=None: whole_words_package(ids, special, starts, p).long(),
     "bool tensor"),
], ids=["first piece only", "every token a word", "specials", "overshoot", "stops at a misfit",
        "left to right", "word crosses a special", "not bool"])
def test_whole_word_mask_rejects(fn, message, capsys):
    rejects(ch07.check_whole_word_mask, fn, message, capsys)


# --------------------------------------------------------------------------- MLM decoder
def decoder_package(hidden, dense, norm, embedding, bias):
    config = BertConfig(vocab_size=embedding.num_embeddings, d_model=embedding.embedding_dim,
                        num_heads=1, num_layers=1, d_ff=4, max_positions=8)
    head = MaskedLMHead(config, embedding)
    head.dense, head.norm = dense, norm
    head.decoder.bias = nn.Parameter(bias)
    return head(hidden)


@pytest.mark.parametrize("fn", [decoder_package,
                                lambda h, dense, norm, emb, b: F.linear(norm(F.gelu(dense(h))), emb.weight, b)],
                         ids=["package", "functional"])
def test_mlm_decoder_accepts(fn, capsys):
    accepts(ch07.check_mlm_decoder, fn, capsys)


@pytest.mark.parametrize("fn, message", [
    (lambda h, dense, norm, emb, b: h @ emb.weight.T + b, "transform is skipped"),
    (lambda h, dense, norm, emb, b: norm(dense(h)) @ emb.weight.T + b, "GELU is missing"),
    (lambda h, dense, norm, emb, b: norm(F.gelu(dense(h), approximate="tanh")) @ emb.weight.T + b,
     "tanh approximation of GELU: the original BERT code used it"),
    (lambda h, dense, norm, emb, b: F.gelu(norm(dense(h))) @ emb.weight.T + b, "dense → GELU → LayerNorm"),
    (lambda h, dense, norm, emb, b: norm(F.gelu(dense(h))) @ emb.weight.T, "output bias is missing"),
    (lambda h, dense, norm, emb, b: (norm(F.gelu(dense(h))) @ emb.weight.T + b).softmax(-1),
     "not probabilities"),
    (lambda h, dense, norm, emb, b: norm(F.gelu(dense(h))), "score against the"),
    (lambda h, dense, norm, emb, b: nn.Linear(h.shape[-1], emb.num_embeddings)(norm(F.gelu(dense(h)))),
     "differs from the expected"),
], ids=["no transform", "no gelu", "tanh gelu", "norm first", "no bias", "softmax", "no decoder",
        "untied new linear"])
def test_mlm_decoder_rejects(fn, message, capsys):
    rejects(ch07.check_mlm_decoder, fn, message, capsys)
