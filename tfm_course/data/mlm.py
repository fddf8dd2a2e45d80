"""The data of BERT's two pretraining objectives: masked tokens (MLM) and sentence pairs (NSP).

    inputs, labels = mask_tokens(ids, special_mask, vocab_size, mask_id, generator=g)
    pairs = nsp_pairs(train_documents, seed=0)           # one split at a time
    batch = collate_pairs(pairs, cls_id, sep_id, pad_id, max_len=64)

A *document* is a list of *segments* (sentences, or fixed-size chunks from :func:`chunk`), and a
segment is a list of token ids. The corpus decides where documents start and end, and which
documents are training and which validation; these functions never mix documents of two splits,
because they only ever see one split.

**Whole-word masking** (``word_starts=``): BERT's later release and RoBERTa's fairseq code mask
every piece of a chosen word together, so the model cannot recover a piece from the rest of its
word. With a byte-level BPE the ids say where words begin: :func:`word_start_table` marks the
tokens whose bytes begin with whitespace or punctuation (fairseq's GPT-2 rule marks those that
begin with a space); a row's first token and the token after a special one begin a word too.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["IGNORE", "mask_tokens", "word_start_table", "word_starts_of", "chunk", "nsp_pairs", "build_pair", "collate_pairs",
           "pack_documents", "unigram_cross_entropy"]

IGNORE = -100  # label value that ``F.cross_entropy`` skips


# --------------------------------------------------------------------------- MLM
def mask_tokens(ids: Tensor, special_mask: Tensor, vocab_size: int, mask_id: int, p: float = 0.15,
                generator: torch.Generator | None = None,
                special_ids: Sequence[int] = (),
                word_starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """BERT's masking: returns ``(inputs, labels)``, both ``(batch, seq)`` like ``ids``.

    * In each row, ``max(1, round(p · n))`` of its ``n`` non-special positions are chosen at
      random (a row with no non-special position gets none). BERT's data code also fixes the
      count per row, but takes ``n`` as the full length, ``[CLS]`` and ``[SEP]`` included, and caps
      it at ``max_predictions_per_seq``; Hugging Face's collator draws each token independently. Special
      positions (``special_mask`` True: ``[CLS]``, ``[SEP]``, padding) are never chosen.
    * Each chosen position independently becomes ``mask_id`` with probability 0.8, a random
      *non-special* token with probability 0.1, and stays unchanged with probability 0.1.
    * ``labels`` holds the original id at chosen positions and ``IGNORE`` (-100) elsewhere, so
      the loss is computed only where the model had to predict.

    Which ids are special, for the random replacement: ``mask_id``, every id found under
    ``special_mask`` in this batch, and ``special_ids`` (pass your tokenizer's special ids when
    some of them may be absent from a batch, e.g. ``[UNK]``). A random replacement may equal the
    original token, as in BERT.

    **Whole words** (``word_starts`` given: a bool table ``(vocab_size,)``, True for the ids that
    begin a word, e.g. :func:`word_start_table`, or a bool ``(batch, seq)``, True at the positions
    that begin one): a word is a start and the non-special tokens after it up to the next start.
    A row's first position and every position after a special one begin a word whatever the table
    says. The budget is the same ``k = max(1, round(p · n))`` *tokens*; the row's words are taken
    in a random order, each chosen whole if it fits in what is left of the budget and skipped
    otherwise (the rule of BERT's ``create_pretraining_data.py`` with ``do_whole_word_mask``). So a
    row gets at most ``k`` tokens, exactly ``k`` unless every word left over is longer than the
    remainder, and no unchosen word is shorter than or equal to ``k`` minus the tokens chosen (it
    may get none if all its words are longer than ``k``). fairseq's RoBERTa chooses ``p`` of the
    *words* instead, so its share of tokens is larger. The 80/10/10 draw stays per token.

    Everything is created on ``ids.device`` without a host sync; ``generator`` must live on that
    device too. ``ids`` is not modified.
    """
    _check_mask_args(ids, special_mask, vocab_size, mask_id, p, generator, special_ids)
    device = ids.device
    batch, seq = ids.shape
    n_real = (~special_mask).sum(dim=1, keepdim=True)  # (batch, 1)
    k = torch.round(p * n_real).clamp(min=1).minimum(n_real)
    # choose: the k lowest random scores among the row's non-special positions
    scores = torch.rand(batch, seq, device=device, generator=generator).masked_fill(special_mask, 2.0)
    if word_starts is None:
        ranks = scores.argsort(dim=1).argsort(dim=1)  # rank of each position's score in its row
        chosen = ranks < k
    else:
        chosen = _choose_whole_words(word_starts_of(ids, special_mask, word_starts), special_mask,
                                     scores, k[:, 0])

    action = torch.rand(batch, seq, device=device, generator=generator)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)

    allowed = torch.ones(vocab_size, device=device)  # weights of the replacement draw
    allowed[torch.where(special_mask, ids, mask_id).flatten()] = 0.0
    allowed[mask_id] = 0.0
    if len(special_ids):
        allowed[torch.as_tensor(list(special_ids), device=device)] = 0.0
    random_ids = torch.multinomial(allowed, batch * seq, replacement=True, generator=generator)

    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids.view(batch, seq).to(ids.dtype), inputs)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    return inputs, labels


def word_starts_of(ids: Tensor, special_mask: Tensor, word_starts: Tensor) -> Tensor:
    """``(batch, seq)`` bool: True where a word begins (see :func:`mask_tokens`).

    ``word_starts`` is a table ``(vocab_size,)`` read at ``ids``, or already ``(batch, seq)``. A
    row's first position, special positions and the positions after them are starts too.
    """
    if not isinstance(word_starts, Tensor) or word_starts.dtype != torch.bool:
        raise ValueError(f"word_starts must be a bool tensor, (vocab_size,) or (batch, seq) = "
                         f"{tuple(ids.shape)}, got {getattr(word_starts, 'dtype', type(word_starts))}")
    if word_starts.device != ids.device:
        raise ValueError(f"word_starts must be on ids' device {ids.device}, got {word_starts.device}")
    if word_starts.shape == ids.shape and word_starts.dim() == 2:
        starts = word_starts.clone()
    elif word_starts.dim() == 1:
        if ids.device.type == "cpu" and ids.numel() and int(ids.max()) >= len(word_starts):
            raise ValueError(f"word_starts has {len(word_starts)} entries, expected one per id "
                             f"(vocab_size), but ids go up to {int(ids.max())}")
        starts = word_starts[ids]
    else:
        raise ValueError(f"word_starts must have shape (vocab_size,) or (batch, seq) = "
                         f"{tuple(ids.shape)}, got {tuple(word_starts.shape)}")
    starts |= special_mask
    starts[:, 0] = True
    starts[:, 1:] |= special_mask[:, :-1]
    return starts


def _choose_whole_words(starts: Tensor, special_mask: Tensor, scores: Tensor, k: Tensor) -> Tensor:
    """Whole words in the order of their first token's score, each taken if it fits in ``k``."""
    batch, seq = starts.shape
    positions = torch.arange(seq, device=starts.device).expand(batch, seq)
    first = torch.where(starts, positions, 0).cummax(dim=1).values  # each position's word start
    length = torch.zeros(batch, seq, dtype=torch.long, device=starts.device)
    length.scatter_add_(1, first, torch.ones_like(length))  # tokens per word, at its start
    word_score = torch.where(starts & ~special_mask, scores, 2.0)  # specials: never
    order = word_score.argsort(dim=1)
    length_in_order = length.gather(1, order)
    valid_in_order = word_score.gather(1, order) < 2.0
    left = k.clone()
    taken = torch.zeros(batch, seq, dtype=torch.bool, device=starts.device)
    for r in range(seq):  # BERT's greedy rule: skip a word that does not fit, try the next
        take = valid_in_order[:, r] & (length_in_order[:, r] <= left)
        taken[:, r] = take
        left = left - take * length_in_order[:, r]
    chosen_start = torch.zeros_like(taken).scatter_(1, order, taken)
    return chosen_start.gather(1, first) & ~special_mask


def word_start_table(tok) -> Tensor:
    """``(vocab_size,)`` bool: True for the ids of ``tok`` that begin a word, and its special ids.

    A byte-level BPE keeps a word's leading space in its first token (`` Value``, ``Error``), and
    its pre-tokeniser cuts punctuation and whitespace into pieces of their own. So an id begins a
    word when its bytes begin with an ASCII space, newline or punctuation; one that begins with a
    letter, a digit or a non-ASCII byte (part of a UTF-8 character) continues the word before it.
    The exception a table cannot see, a letter right after punctuation (``(bar``), is grouped
    with the punctuation. fairseq builds RoBERTa's table the same way with the space rule alone.
    """
    vocab, special = getattr(tok, "vocab", None), getattr(tok, "special_ids", None)
    if not isinstance(vocab, dict) or not isinstance(special, dict):
        raise ValueError(f"need a tokenizer with .vocab (id -> bytes) and .special_ids, got "
                         f"{type(tok).__name__}")
    table = torch.zeros(tok.vocab_size, dtype=torch.bool)
    specials = set(special.values())
    for i, token in vocab.items():
        first = token[:1]
        table[i] = i in specials or (first != b"" and first[0] < 0x80 and not first.isalnum())
    return table


def _check_mask_args(ids: Tensor, special_mask: Tensor, vocab_size: int, mask_id: int, p: float,
                     generator: torch.Generator | None, special_ids: Sequence[int]) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor (batch, seq), got "
                         f"{tuple(getattr(ids, 'shape', ()))} {getattr(ids, 'dtype', type(ids))}")
    if not isinstance(special_mask, Tensor) or special_mask.dtype != torch.bool:
        raise ValueError(f"special_mask must be a bool tensor (True on special tokens), got "
                         f"{getattr(special_mask, 'dtype', type(special_mask))}")
    if special_mask.shape != ids.shape or special_mask.device != ids.device:
        raise ValueError(f"special_mask must have the shape and device of ids {tuple(ids.shape)} "
                         f"on {ids.device}, got {tuple(special_mask.shape)} on {special_mask.device}")
    if not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p!r}")
    if vocab_size < 2 or not 0 <= mask_id < vocab_size:
        raise ValueError(f"need vocab_size >= 2 and 0 <= mask_id < vocab_size, got "
                         f"vocab_size={vocab_size}, mask_id={mask_id}")
    bad = [i for i in special_ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise ValueError(f"special_ids must lie in [0, {vocab_size}), got {bad}")
    if generator is not None and generator.device.type != ids.device.type:
        raise ValueError(f"generator is on {generator.device} but ids are on {ids.device}: "
                         "create it with torch.Generator(device=ids.device)")
    if ids.device.type == "cpu" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"ids must lie in [0, vocab_size={vocab_size}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")


# --------------------------------------------------------------------------- NSP
def chunk(tokens: Sequence[int], size: int) -> list[list[int]]:
    """Cut one document's tokens into segments of ``size`` tokens (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"size must be a positive integer, got {size}")
    return [list(tokens[i:i + size]) for i in range(0, len(tokens), size)]


def nsp_pairs(documents: Sequence[Sequence[Sequence[int]]], seed: int = 0,
              p_next: float = 0.5) -> list[tuple[list[int], list[int], int]]:
    """Next-sentence-prediction examples ``(segment_a, segment_b, label)`` from one split.

    For every two consecutive segments A, B of a document: with probability ``p_next`` the pair
    is (A, B) with label 0 ("B follows A"); otherwise B is replaced by a random segment of a
    random *other* document of ``documents``, label 1 ("B is random"; Hugging Face's convention).
    Call it once per split, so no pair mixes training and validation documents.
    """
    if not 0.0 < p_next < 1.0:
        raise ValueError(f"p_next must lie strictly between 0 and 1, got {p_next}")
    docs = [[list(s) for s in doc if len(s)] for doc in documents]
    if sum(len(d) > 0 for d in docs) < 2:
        raise ValueError(f"need at least two non-empty documents to draw random segments from, "
                         f"got {sum(len(d) > 0 for d in docs)}")
    rng = random.Random(seed)
    non_empty = [i for i, d in enumerate(docs) if d]
    pairs = []
    for i, doc in enumerate(docs):
        for a, b in zip(doc, doc[1:]):
            if rng.random() < p_next:
                pairs.append((a, b, 0))
                continue
            other = i
            while other == i:
                other = rng.choice(non_empty)
            pairs.append((a, rng.choice(docs[other]), 1))
    return pairs


def build_pair(a: Sequence[int], b: Sequence[int], cls_id: int, sep_id: int,
               max_len: int | None = None) -> tuple[list[int], list[int]]:
    """``[CLS] a [SEP] b [SEP]`` and its segment ids (0 up to the first ``[SEP]``, 1 after).

    With ``max_len``, tokens are dropped from the end of the longer segment until the pair fits
    (BERT's original code drops them from a random end).
    """
    a, b = list(a), list(b)
    if max_len is not None:
        if max_len < 5:
            raise ValueError(f"max_len must be at least 5 ([CLS] a [SEP] b [SEP]), got {max_len}")
        while len(a) + len(b) + 3 > max_len:
            (a if len(a) > len(b) else b).pop()
    ids = [cls_id, *a, sep_id, *b, sep_id]
    return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)


def collate_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int], int]], cls_id: int,
                  sep_id: int, pad_id: int, max_len: int,
                  device: torch.device | str | None = None) -> dict[str, Tensor]:
    """A padded batch of pairs: ``ids``, ``segment_ids``, ``attention_mask`` (True on real
    tokens), ``special_mask`` (True on ``[CLS]``, ``[SEP]`` and padding), all ``(batch, seq)``,
    and ``nsp_labels`` ``(batch,)``. ``seq`` is the longest pair's length (at most ``max_len``)."""
    if not pairs:
        raise ValueError("pairs is empty")
    built = [build_pair(a, b, cls_id, sep_id, max_len) for a, b, _ in pairs]
    seq = max(len(ids) for ids, _ in built)
    ids = torch.full((len(built), seq), pad_id, dtype=torch.long)
    segments = torch.zeros((len(built), seq), dtype=torch.long)
    special = torch.ones((len(built), seq), dtype=torch.bool)
    for row, (pair_ids, pair_segments) in enumerate(built):
        n = len(pair_ids)
        ids[row, :n] = torch.tensor(pair_ids)
        segments[row, :n] = torch.tensor(pair_segments)
        special[row, 1:n - 1] = False
        special[row, pair_segments.count(0) - 1] = True  # the first [SEP]
    lengths = torch.tensor([len(pair_ids) for pair_ids, _ in built])
    attention = torch.arange(seq)[None, :] < lengths[:, None]
    batch = {"ids": ids, "segment_ids": segments, "attention_mask": attention,
             "special_mask": special, "nsp_labels": torch.tensor([label for *_, label in pairs])}
    return {name: t.to(device) for name, t in batch.items()}


# --------------------------------------------------------------------------- MLM only
def pack_documents(documents: Sequence[Sequence[int]], seq_len: int, cls_id: int,
                   sep_id: int) -> Tensor:
    """Documents (token-id lists) joined with ``[SEP]`` and cut into ``[CLS] … [SEP]`` rows.

    Returns ``(rows, seq_len)`` with no padding (the tail that does not fill a row is dropped):
    RoBERTa's "full sentences" input for MLM without NSP. Rows may cross document boundaries,
    marked by the ``[SEP]`` between documents.
    """
    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3 ([CLS] token [SEP]), got {seq_len}")
    stream: list[int] = []
    for doc in documents:
        stream.extend(doc)
        stream.append(sep_id)
    body = seq_len - 2
    rows = len(stream) // body
    if rows == 0:
        raise ValueError(f"the documents hold {len(stream)} tokens, fewer than one row of {body}")
    flat = torch.tensor(stream[:rows * body], dtype=torch.long).view(rows, body)
    cls = torch.full((rows, 1), cls_id, dtype=torch.long)
    sep = torch.full((rows, 1), sep_id, dtype=torch.long)
    return torch.cat([cls, flat, sep], dim=1)


def unigram_cross_entropy(train_ids: Tensor, eval_ids: Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats) of ``eval_ids`` under the token frequencies of ``train_ids``.

    The baseline an MLM must beat: a model that ignores the context can do no better than predict
    every masked token from how often each token occurs. Add-one smoothing keeps unseen tokens
    finite. Pass the tokens at masked positions as ``eval_ids`` (``labels[labels != IGNORE]``).
    """
    for name, t in (("train_ids", train_ids), ("eval_ids", eval_ids)):
        if t.is_floating_point() or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty integer tensor, got {t.dtype} {tuple(t.shape)}")
        if int(t.min()) < 0 or int(t.max()) >= vocab_size:
            raise ValueError(f"{name} must lie in [0, {vocab_size}), got [{int(t.min())}, {int(t.max())}]")
    counts = torch.bincount(train_ids.flatten().cpu(), minlength=vocab_size).double() + 1.0
    log_probs = counts.log() - counts.sum().log()
    return float(-log_probs[eval_ids.flatten().cpu()].mean())
