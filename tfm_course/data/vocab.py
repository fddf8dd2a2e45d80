"""A vocabulary: the two-way map between tokens (strings) and the integer ids a model embeds.

    vocab = Vocab(list("0123456789"))
    ids = vocab.encode(list("4021"), eos=True)      # [7, 3, 5, 4, 2]
    vocab.decode(ids)                               # ['4', '0', '2', '1'] (stops at <eos>)

Three special tokens come first, at fixed ids: ``<pad>`` = 0 (filler that masks hide),
``<bos>`` = 1 (the decoder's first input) and ``<eos>`` = 2 (the model's "I am done").
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import Tensor

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)


class Vocab:
    """Tokens ↔ ids. ``Vocab(tokens)``: specials get ids 0, 1, 2; ``tokens`` follow in order."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, tokens: Iterable[str]) -> None:
        self.itos: list[str] = list(SPECIALS)
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(f"tokens must be non-empty strings, got {token!r}")
            if token not in self.itos:
                self.itos.append(token)
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        shown = " ".join(self.itos[3:13]) + (" …" if len(self) > 13 else "")
        return f"Vocab({len(self)} tokens: {shown})"

    def encode(self, tokens: Sequence[str], bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``tokens``, optionally wrapped in ``<bos>`` … ``<eos>``; unknown token → ValueError."""
        unknown = [t for t in tokens if t not in self.stoi]
        if unknown:
            raise ValueError(f"tokens not in the vocabulary: {sorted(set(unknown))[:10]}")
        ids = [self.stoi[t] for t in tokens]
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def check_ids(self, ids: Tensor | Sequence[int]) -> None:
        """Raise ``ValueError`` unless every id lies in ``[0, len(vocab))``.

        Ids on a GPU are copied to the CPU first: one transfer, then the checks read host memory.
        """
        ids = torch.as_tensor(ids).cpu()
        if ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
        if ids.numel():
            low, high = ids.aminmax()
            if low < 0 or high >= len(self):
                raise ValueError(f"token ids must lie in [0, {len(self)}) for this vocabulary, "
                                 f"got values in [{int(low)}, {int(high)}]")

    def decode(self, ids: Tensor | Sequence[int], strip: bool = True) -> list[str]:
        """Tokens of a 1-D id sequence. With ``strip``: stop at ``<eos>``, drop ``<pad>``/``<bos>``.

        Ids on a GPU are copied to the CPU once, before they are read."""
        ids = torch.as_tensor(ids).cpu()
        if ids.dim() != 1:
            raise ValueError(f"decode takes one sequence (seq,), got shape {tuple(ids.shape)}")
        self.check_ids(ids)
        out = []
        for i in ids.tolist():
            if strip and i == self.eos_id:
                break
            if strip and i in (self.pad_id, self.bos_id):
                continue
            out.append(self.itos[i])
        return out

    def pad(self, sequences: Sequence[Sequence[int]], length: int | None = None) -> Tensor:
        """Right-pad id lists with ``<pad>`` into a ``(batch, length)`` LongTensor."""
        longest = max((len(s) for s in sequences), default=0)
        length = longest if length is None else length
        if longest > length:
            raise ValueError(f"a sequence of length {longest} does not fit length {length}")
        out = torch.full((len(sequences), length), self.pad_id, dtype=torch.long)
        for row, seq in enumerate(sequences):
            if len(seq):
                out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        self.check_ids(out)
        return out
