"""The data of BERT's two pretraining objectives: masked tokens (MLM) and sentence pairs (NSP).

    inputs, labels = mask_tokens(ids, special_mask, vocab_size, mask_id, generator=g)
    pairs = nsp_pairs(train_documents, seed=0)           # one split at a time
    batch = collate_pairs(pairs, cls_id, sep_id, pad_id, max_len=64)

A *document* is a list of *segments* (sentences, or fixed-size chunks from :func:`chunk`), and a
segment is a list of token ids. The corpus decides where documents start and end, and which
documents are training and which validation; these functions never mix documents of two splits,
because they only ever see one split.

**Whole-word masking is not implemented.** BERT's later release masks every sub-word piece of a
chosen word together, so the model cannot recover a piece from its neighbours inside the same
word ("tokeni ##zer"). With a byte-level BPE the pieces of a word are its tokens after a
space-prefixed one; grouping them needs the tokenizer's word boundaries, which token ids alone do
not carry. :func:`mask_tokens` chooses single tokens, as the original BERT did.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["IGNORE", "mask_tokens", "chunk", "nsp_pairs", "build_pair", "collate_pairs",
           "pack_documents", "unigram_cross_entropy"]

IGNORE = -100  # label value that ``F.cross_entropy`` skips


# --------------------------------------------------------------------------- MLM
def mask_tokens(ids: Tensor, special_mask: Tensor, vocab_size: int, mask_id: int, p: float = 0.15,
                generator: torch.Generator | None = None,
                special_ids: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
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

    Everything is created on ``ids.device`` without a host sync; ``generator`` must live on that
    device too. ``ids`` is not modified.
    """
    _check_mask_args(ids, special_mask, vocab_size, mask_id, p, generator, special_ids)
    device = ids.device
    batch, seq = ids.shape
    # choose: the k lowest random scores among the row's non-special positions
    scores = torch.rand(batch, seq, device=device, generator=generator).masked_fill(special_mask, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)  # rank of each position's score in its row
    n_real = (~special_mask).sum(dim=1, keepdim=True)  # (batch, 1)
    k = torch.round(p * n_real).clamp(min=1).minimum(n_real)
    chosen = ranks < k

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
