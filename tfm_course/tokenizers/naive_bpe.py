"""The naive byte-level BPE trainer (minbpe's style): recount every pair before every merge.

Kept as the readable reference that the fast trainer (:mod:`.bpe_train`) must match merge for
merge, and as the baseline of ``tools/bench/bench_bpe.py``. Each merge costs a pass over the whole
pre-tokenised text, so training V − 256 merges on N bytes costs about (V − 256) · N steps: fine
for a paragraph, minutes to hours for a corpus. Same pre-tokenisation, same tie-break (most
frequent pair, then the lexicographically greater pair of byte strings), same reuse of an
existing token's id.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from .bpe_train import _merge_word, check_vocab_size
from .pretokenize import check_special_tokens, pretokenize, special_pattern, split_on_specials


def train_bpe_naive(documents: Iterable[str], vocab_size: int, special_tokens: list[str] | None = None
                    ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """``(vocab, merges)``, exactly as :func:`.bpe_train.train_bpe` returns them, the slow way."""
    specials = check_special_tokens(special_tokens)
    check_vocab_size(vocab_size, specials)
    pattern = special_pattern(specials)
    chunks = [list(piece.encode("utf-8"))
              for document in documents
              for part, is_special in split_on_specials(document, pattern) if not is_special
              for piece in pretokenize(part)]
    tokens = [bytes([i]) for i in range(256)]
    merges: list[tuple[bytes, bytes]] = []
    while len(tokens) < vocab_size - len(specials):
        step = naive_merge_step(chunks, tokens)
        if step is None:
            break
        chunks, merge = step
        merges.append(merge)
    vocab = dict(enumerate(tokens))
    for token in specials:
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab, merges


def naive_merge_step(chunks: list[list[int]], tokens: list[bytes]
                     ) -> tuple[list[list[int]], tuple[bytes, bytes]] | None:
    """One merge, the slow way: count every pair of every chunk, merge the winner everywhere.

    ``tokens`` (id -> bytes) grows by the new token unless it already exists. Returns the new
    chunks and the merge, or None when no pair is left.
    """
    stats: Counter[tuple[int, int]] = Counter()
    for ids in chunks:
        stats.update(zip(ids, ids[1:]))
    if not stats:
        return None
    a, b = max(stats, key=lambda pair: (stats[pair], tokens[pair[0]], tokens[pair[1]]))
    merged = tokens[a] + tokens[b]
    new = tokens.index(merged) if merged in tokens else len(tokens)
    if new == len(tokens):
        tokens.append(merged)
    return [_merge_word(ids, a, b, new) for ids in chunks], (tokens[a], tokens[b])
