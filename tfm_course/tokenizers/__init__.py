"""Tokenizers, one module per idea: characters (:mod:`.char`) and byte-level BPE (:mod:`.bpe`).

* :class:`CharTokenizer` — one token per character; unseen characters are out of vocabulary.
* :class:`BPETokenizer` — GPT-2's byte-level BPE: train / encode / decode / save / from_files.
* :func:`train_bpe` (fast, incremental) and :func:`train_bpe_naive` (recounts per merge) return
  the same ``(vocab, merges)``.
* :func:`default_tokenizer` — the course's shared BPE, trained on the stdlib-docstring corpus.
* :func:`pretokenize` / :data:`GPT2_SPLIT_PATTERN` and :func:`bytes_to_unicode` — the pieces
  GPT-2 merges within, and the printable table of its files.
"""

from .bpe import BPETokenizer
from .bpe_train import count_pieces, train_bpe
from .bytes_unicode import bytes_to_unicode, token_to_text, text_to_token, unicode_to_bytes
from .char import CharTokenizer
from .default import default_tokenizer
from .naive_bpe import train_bpe_naive
from .pretokenize import GPT2_SPLIT_PATTERN, pretokenize

__all__ = ["BPETokenizer", "CharTokenizer", "GPT2_SPLIT_PATTERN", "bytes_to_unicode", "count_pieces",
           "default_tokenizer", "pretokenize", "text_to_token", "token_to_text", "train_bpe",
           "train_bpe_naive", "unicode_to_bytes"]
