"""Chapter 8's language-model recipe, in one place: the corpus as characters or BPE, nanoGPT's CPU
configuration and optimiser, bits per byte, and the count-based n-gram lines on the same tokens.

    data = lm_data("BPE")                                   # or "characters"
    steps = equal_compute_steps(800)                        # {"characters": 800, "BPE": 504}
    model, history, train_bpb = train_lm(data, steps["BPE"], lr=1e-3, seed=0)
    bits_per_byte(model, data)                              # validation bits per byte
    ngram_bits_per_byte(data, order=4)                      # a Kneser-Ney 4-gram, the same tokens

The chapter builds each piece in its own cells and asserts they equal these; the tool that makes
the stored compute sweep (``tools/runs/gpt_compute_sweep.py``) calls the same functions, so a page
run and a stored run differ only in their step counts and seeds.

**The recipe** is nanoGPT's for a laptop CPU (Karpathy 2022, ``config/train_shakespeare_char.py``
with the README's CPU overrides): 4 layers, 4 heads, width 128, blocks of 64 tokens, batches of 12,
no biases, no dropout; AdamW with betas (0.9, 0.99), weight decay 0.1 on the matrices and
embeddings only (:func:`tfm_course.train.weight_decay_groups`), gradients clipped at norm 1, a
linear warm-up of 100 steps (a tenth of the run when that is shorter) and a cosine decay to a tenth
of the peak at the last step. The peak learning rate is the one thing the sweep tunes per budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from ..data import corpus
from ..models.gpt import GPT, GPTConfig
from ..ngram import KneserNey, Unigram
from ..tokenizers import CharTokenizer, default_tokenizer
from ..train import History, train, warmup_cosine, weight_decay_groups

__all__ = ["RECIPE", "GPU_RECIPE", "TOKENIZERS", "LMData", "lm_data", "equal_compute_steps", "warmup_steps",
           "flops_per_token", "make_model", "make_optimizer", "eval_windows", "bits_per_byte", "train_lm", "ngram_bits_per_byte",
           "bits_by_position", "token_nll", "ngram_model"]

TOKENIZERS = ("characters", "BPE")
RECIPE: dict[str, Any] = dict(d_model=128, n_layers=4, n_heads=4, block=64, batch=12, dropout=0.0,
                              betas=(0.9, 0.99), weight_decay=0.1, warmup=100, floor=0.1, clip=1.0,
                              eval_chars=20_000)
# a free Colab T4's size: twice as wide, 1.5 times as deep, twice the block, and the whole validation text
GPU_RECIPE: dict[str, Any] = {**RECIPE, "d_model": 256, "n_layers": 6, "n_heads": 8, "block": 128,
                              "batch": 32, "dropout": 0.1, "eval_chars": None}


@dataclass
class LMData:
    """One tokenization of the corpus: ``train`` and ``valid`` are 1-D token ids (the training
    text, and the first ``eval_chars`` characters of the validation text); ``token_bytes[i]`` is
    the number of UTF-8 bytes of token ``i``."""

    name: str
    tokenizer: Any
    train: Tensor
    valid: Tensor
    token_bytes: Tensor

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)


@lru_cache(maxsize=None)
def _tokenizer(name: str):
    if name == "characters":  # the vocabulary only: every character of the corpus has an id
        return CharTokenizer.train(corpus.text("train") + corpus.text("validation"))
    if name == "BPE":
        return default_tokenizer(4096)  # chapter 6's byte-level BPE, trained on the training split
    raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {name!r}")


@lru_cache(maxsize=None)
def lm_data(name: str, eval_chars: int | None = RECIPE["eval_chars"]) -> LMData:
    """The corpus tokenized by ``name`` ("characters" or "BPE"), special tokens off; cached."""
    tok = _tokenizer(name)
    encode = getattr(tok, "encode_ordinary", tok.encode)
    valid_text = corpus.text("validation")
    if eval_chars is not None:
        valid_text = valid_text[:eval_chars]
    if name == "characters":
        nbytes = [len(tok.vocab[i].encode()) for i in range(tok.vocab_size)]
    else:
        nbytes = [len(tok.vocab[i]) for i in range(tok.vocab_size)]
    return LMData(name, tok, torch.tensor(encode(corpus.text("train"))), torch.tensor(encode(valid_text)),
                  torch.tensor(nbytes))


def make_model(vocab_size: int, recipe: dict[str, Any] = RECIPE, seed: int = 0,
               device: torch.device | str = "cpu") -> GPT:
    """A fresh GPT of the recipe's size (GPT-2's initialisation, seeded)."""
    torch.manual_seed(seed)
    config = _config(vocab_size, recipe)
    return GPT(config).to(device)


def _config(vocab_size: int, recipe: dict[str, Any]) -> GPTConfig:
    return GPTConfig(vocab_size=vocab_size, max_len=recipe["block"], d_model=recipe["d_model"],
                     n_layers=recipe["n_layers"], n_heads=recipe["n_heads"], dropout=recipe["dropout"],
                     bias=False)


def flops_per_token(name: str, recipe: dict[str, Any] = RECIPE) -> int:
    """Training FLOPs per token of the recipe's model over tokenizer ``name`` (counted on the meta
    device: no weights are made)."""
    config = _config(lm_data(name).vocab_size, recipe)  # the data outside the meta device
    with torch.device("meta"):
        return GPT(config).flops_per_token(recipe["block"])


def equal_compute_steps(char_steps: int, recipe: dict[str, Any] = RECIPE) -> dict[str, int]:
    """Steps of each tokenizer's model that cost the FLOPs of ``char_steps`` steps of the character
    model (same batch and block; the BPE model's wider output layer makes its steps dearer)."""
    if char_steps <= 0:
        raise ValueError(f"char_steps must be positive, got {char_steps}")
    per_token = {name: flops_per_token(name, recipe) for name in TOKENIZERS}
    return {name: max(1, round(char_steps * per_token["characters"] / per_token[name])) for name in TOKENIZERS}


def warmup_steps(steps: int, recipe: dict[str, Any] = RECIPE) -> int:
    """nanoGPT's 100 warm-up steps, or a tenth of a run shorter than 1,000 steps."""
    return max(1, min(recipe["warmup"], steps // 10))


def make_optimizer(model: torch.nn.Module, lr: float, recipe: dict[str, Any] = RECIPE) -> torch.optim.AdamW:
    """AdamW with the recipe's betas, weight decay on the 2-D parameters only."""
    return torch.optim.AdamW(weight_decay_groups(model, recipe["weight_decay"]), lr=lr,
                             betas=tuple(recipe["betas"]))


def eval_windows(ids: Tensor, block: int) -> Tensor:
    """``(n, block + 1)`` windows of ``ids`` that overlap by one token: every token but the first is
    predicted exactly once, up to whole windows."""
    n = (len(ids) - 1) // block
    if n < 1:
        raise ValueError(f"need at least {block + 1} tokens for one window, got {len(ids)}")
    return ids[: n * block + 1].unfold(0, block + 1, block)


@torch.no_grad()
def bits_per_byte(model: GPT, data: LMData, ids: Tensor | None = None, transform=None) -> float:
    """Bits per byte of ``ids`` (default: the validation tokens) under ``model``: the total surprise
    of the predicted tokens, in bits, over their UTF-8 bytes. ``transform(logits)`` may change the
    distribution first (a temperature, say)."""
    ids = data.valid if ids is None else ids
    device = next(model.parameters()).device
    windows = eval_windows(ids, model.config.max_len).to(device)
    was_training, bits = model.training, 0.0
    model.eval()
    per_chunk = max(1, 2**26 // (model.config.max_len * model.config.vocab_size))  # ~256 MB of logits
    for chunk in windows.split(per_chunk):
        logits = model(chunk[:, :-1])[0].float()
        if transform is not None:
            logits = transform(logits)
        bits -= logits.log_softmax(-1).gather(-1, chunk[:, 1:, None]).sum().item() / math.log(2)
    model.train(was_training)
    return bits / data.token_bytes[windows[:, 1:].cpu()].sum().item()


@torch.no_grad()
def bits_by_position(model: GPT, data: LMData, ids: Tensor | None = None) -> Tensor:
    """``(block,)`` bits per token at each position of the window, averaged over the validation
    windows: position 0 sees one token of context, the last position ``block``."""
    ids = data.valid if ids is None else ids
    device = next(model.parameters()).device
    windows = eval_windows(ids, model.config.max_len).to(device)
    model.eval()
    nats = torch.cat([token_nll(model(c[:, :-1])[0].float(), c[:, 1:]) for c in windows.split(64)])
    return (nats.mean(0) / math.log(2)).cpu()


def token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-token negative log-likelihood in nats, ``(B, T, V), (B, T) -> (B, T)``."""
    return -logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def train_lm(data: LMData, steps: int, lr: float, seed: int = 0, recipe: dict[str, Any] = RECIPE,
             device: torch.device | str = "cpu", evaluations: int = 10, progress: bool = True,
             stop_after: int | None = None, make=None) -> tuple[GPT, History, list[float]]:
    """Train a fresh model on random windows of the training tokens with the recipe; evaluate the
    validation bits per byte ``evaluations`` times (evenly, the last at the end). Returns the model,
    its history (metric ``"validation bits per byte"``) and the training loss in bits per byte, step
    by step. The batches depend only on ``seed``.

    ``stop_after=n`` stops at the first evaluation after ``n`` steps: the start of the ``steps``-step
    run (same schedule, same batches), which is how a page replays the beginning of a stored run.
    ``make(vocab_size, seed)`` builds another model to train with the same recipe (chapter 13's
    decoders; it seeds its own initialisation); default :func:`make_model`."""
    if steps <= 0 or lr <= 0:
        raise ValueError(f"need steps > 0 and lr > 0, got steps={steps}, lr={lr}")
    B, T = recipe["batch"], recipe["block"]
    model = make_model(data.vocab_size, recipe, seed, device) if make is None else make(data.vocab_size, seed).to(device)
    g = torch.Generator().manual_seed(seed)
    batch_bytes: list[int] = []

    def make_batch(step: int):
        start = torch.randint(0, len(data.train) - T - 1, (B,), generator=g)
        window = data.train[start[:, None] + torch.arange(T + 1)]  # (B, T + 1) random slices
        batch_bytes.append(int(data.token_bytes[window[:, 1:]].sum()))
        return window[:, :-1].to(device), window[:, 1:].to(device)

    history = train(model, make_batch, lambda m, batch: m(*batch)[1], steps=steps,
                    optimizer=make_optimizer(model, lr, recipe), clip=recipe["clip"],
                    schedule=warmup_cosine(warmup_steps(steps, recipe), steps, recipe["floor"]),
                    eval_fn=lambda m: {"validation bits per byte": bits_per_byte(m, data)},
                    eval_every=max(1, steps // evaluations), progress=progress,
                    desc=f"{data.name}, {steps} steps, seed {seed}",
                    stop_when=None if stop_after is None else lambda h: len(h.steps) >= stop_after)
    # nats per token x tokens / (ln 2 x bytes), batch by batch
    train_bpb = [loss * B * T / (math.log(2) * nb) for loss, nb in zip(history.loss, batch_bytes)]
    return model, history, train_bpb


@lru_cache(maxsize=None)
def ngram_model(name: str, order: int):
    """The count-based model of ``order`` fitted on tokenizer ``name``'s training tokens (the add-one
    unigram for order 1, interpolated modified Kneser-Ney above); cached."""
    data = lm_data(name)  # the training tokens do not depend on the validation length
    if order == 1:
        return Unigram(data.vocab_size).fit([data.train])
    return KneserNey(order, data.vocab_size).fit([data.train])


def ngram_bits_per_byte(data: LMData, order: int, block: int = RECIPE["block"]) -> float:
    """Bits per byte of the validation tokens under a count-based model fitted on the training
    tokens: the add-one unigram for ``order=1``, interpolated modified Kneser-Ney above. It scores
    exactly the tokens :func:`bits_per_byte` scores, each from the tokens before it in its window."""
    if order not in (1, 2, 3, 4):
        raise ValueError(f"order must be 1, 2, 3 or 4, got {order}")
    windows = eval_windows(data.valid, block)
    nats = ngram_model(data.name, order).score_windows(windows[:, :-1], targets=windows[:, 1:])
    return float(nats.sum()) / math.log(2) / data.token_bytes[windows[:, 1:]].sum().item()
