"""Chapter 7's recipe, in one place: pretrain a small BERT on the corpus with MLM, then fine-tune
it (or a random encoder) on "class or function?" with few or many labels.

    sizes = SIZES["cpu"]                       # or SIZES["gpu"]
    mlm = mlm_data(sizes, device)              # the tokenizer, packed rows, a fixed masked validation set
    model, history = pretrain(mlm, sizes, steps=3000, seed=0)
    task = task_data(mlm, device)              # train / dev / validation encodings
    pick = stratified_subset(task.train.y, 32, seed=0)
    result = fine_tune(model.bert, task, sizes, lr=1e-3, seed=0, subset=pick)

The chapter builds each piece in its own cells, asserts they equal these, and runs them; the tools
that make its stored runs (``tools/runs/bert_*.py``) call the same functions, so a page run and a
stored run differ only in their step counts and seeds.

**Splits.** Pretraining reads the training split of the corpus. The task's *dev* split is the
training examples of one module in five (by a hash of the module's name), held out from
fine-tuning and used only to choose learning rates; the reported numbers are on the corpus's
validation split, whose modules neither of the others has seen.
"""

from __future__ import annotations

import copy
import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import baselines
from ..baselines import balanced_accuracy
from ..data import corpus
from ..data.docstring_tasks import class_or_function
from ..data.mlm import IGNORE, mask_tokens, pack_documents
from ..device import one_cpu_thread
from ..models.bert import Bert, BertConfig, BertForPreTraining
from ..tokenizers import default_tokenizer
from ..train import History, train, warmup_cosine

__all__ = ["SIZES", "SPECIALS", "VALID_P", "MLMData", "TaskSplit", "TaskData", "bert_tokenizer", "mlm_data",
           "model_config", "max_chosen", "mlm_loss", "mlm_metrics", "pretrain", "task_data", "stratified_subset",
           "Classifier", "fine_tune", "fresh_bert", "baseline_scores"]

SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
VALID_P = 0.15  # the masking rate of the fixed validation set: BERT's, whatever the training rate

# The chapter's sizes: `cpu` fits its 90-second budget with a 500-step run; `gpu` scales it up.
SIZES: dict[str, dict[str, Any]] = {
    "cpu": dict(vocab=1024, length=32, d_model=64, num_layers=2, num_heads=4, d_ff=256, batch=64,
                lr=3e-3, p=0.4, steps=500, ft_steps=120, ft_batch=32, n_valid=256),
    "gpu": dict(vocab=1024, length=64, d_model=256, num_layers=4, num_heads=4, d_ff=1024, batch=128,
                lr=1e-3, p=0.4, steps=6000, ft_steps=600, ft_batch=32, n_valid=1024),
}


def bert_tokenizer(vocab: int = 1024):
    """Chapter 6's byte-level BPE with BERT's four special tokens, cut to its first ``vocab`` ids."""
    return default_tokenizer(4096, special_tokens=SPECIALS).truncated(vocab)


@dataclass
class MLMData:
    """Everything pretraining reads. ``train_rows``/``valid_rows``: ``(rows, length)`` packed ids;
    ``valid_inputs``/``valid_labels``: a fixed 15 %-masked validation batch ``(n_valid, length)``."""

    tok: Any
    special_ids: list[int]
    train_rows: Tensor
    valid_rows: Tensor
    valid_inputs: Tensor
    valid_labels: Tensor

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def id(self, token: str) -> int:
        return self.tok.special_ids[token]

    def is_special(self, rows: Tensor) -> Tensor:
        return torch.isin(rows, torch.tensor(self.special_ids, device=rows.device))


_MLM_DATA: dict[tuple, MLMData] = {}


def mlm_data(sizes: dict[str, Any], device: torch.device | str = "cpu") -> MLMData:
    """Tokenize both splits of the corpus (``encode_ordinary``: corpus text may contain the
    special tokens' spelling, which must stay ordinary text), pack them into rows of
    ``sizes["length"]`` tokens, and mask a fixed validation batch at 15 % (generator seed 123).
    Kept per process (tokenizing takes seconds); treat the result as read-only."""
    key = (sizes["vocab"], sizes["length"], sizes["n_valid"], str(torch.device(device)))
    if key not in _MLM_DATA:
        _MLM_DATA[key] = _mlm_data(sizes, device)
    return _MLM_DATA[key]


def _mlm_data(sizes: dict[str, Any], device: torch.device | str) -> MLMData:
    tok = bert_tokenizer(sizes["vocab"])
    cls, sep = tok.special_ids["[CLS]"], tok.special_ids["[SEP]"]
    rows = {split: pack_documents([tok.encode_ordinary(d.text) for d in corpus.documents(split)],
                                  sizes["length"], cls, sep).to(device)
            for split in ("train", "validation")}
    special_ids = [tok.special_ids[t] for t in SPECIALS]
    valid = rows["validation"][: sizes["n_valid"]]
    g = torch.Generator(device=device).manual_seed(123)
    valid_inputs, valid_labels = mask_tokens(valid, torch.isin(valid, torch.tensor(special_ids, device=device)),
                                             tok.vocab_size, tok.special_ids["[MASK]"], p=VALID_P, generator=g,
                                             special_ids=special_ids)
    return MLMData(tok, special_ids, rows["train"], rows["validation"], valid_inputs, valid_labels)


def model_config(data: MLMData, sizes: dict[str, Any]) -> BertConfig:
    """The chapter's small BERT, without dropout (a model this small underfits)."""
    return BertConfig(data.vocab_size, max_positions=sizes["length"], d_model=sizes["d_model"],
                      num_layers=sizes["num_layers"], num_heads=sizes["num_heads"], d_ff=sizes["d_ff"],
                      dropout=0.0)


def max_chosen(p: float, length: int) -> int:
    """The most positions :func:`~tfm_course.data.mlm.mask_tokens` chooses in a row of ``length``
    tokens at rate ``p``: it chooses ``max(1, round(p * n))`` of a row's ``n <= length`` ordinary
    tokens, and rounding never decreases, so no row of the batch has more."""
    return max(1, min(length, round(p * length)))


def mlm_loss(model: BertForPreTraining, batch: tuple[Tensor, Tensor], k_max: int | None = None) -> Tensor:
    """Cross-entropy at the chosen positions; the vocabulary-wide decoder runs only there.

    ``batch`` = ``(inputs, labels)``, both ``(batch, seq)``. The chosen positions are gathered
    first (a stable sort puts them at the front of each row), ``k_max`` per row: pass
    :func:`max_chosen` of the masking rate (no host sync); ``None`` counts the fullest row of this
    batch (one host sync). Either way no label is ever dropped, whatever the masking rate.
    """
    inputs, labels = batch
    hidden, _ = model.bert(inputs)
    chosen = labels != IGNORE
    k = int(chosen.sum(1).max()) if k_max is None else k_max
    where = chosen.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :k]
    picked = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))
    return F.cross_entropy(model.mlm(picked).flatten(0, 1).float(), labels.gather(1, where).flatten(),
                           ignore_index=IGNORE)


@torch.no_grad()
def mlm_metrics(model: BertForPreTraining, data: MLMData) -> dict[str, float]:
    """Loss (nats) and accuracy at the fixed 15 %-masked validation positions."""
    hidden, _ = model.bert(data.valid_inputs)
    chosen = data.valid_labels != IGNORE
    logits = model.mlm(hidden[chosen]).float()
    target = data.valid_labels[chosen]
    return {"loss": F.cross_entropy(logits, target).item(),
            "accuracy": (logits.argmax(-1) == target).float().mean().item()}


def pretrain(data: MLMData, sizes: dict[str, Any], steps: int, seed: int = 0, p: float | None = None,
             all_mask: bool = False, evaluations: int = 30, total_steps: int | None = None,
             desc: str = "MLM", progress: bool = True) -> tuple[BertForPreTraining, History]:
    """A fresh BertForPreTraining trained with MLM for ``steps`` steps (AdamW, warm-up over the
    first tenth, cosine decay; a fresh mask for every batch). ``all_mask``: every chosen token
    becomes ``[MASK]`` (no 10 % random, no 10 % kept). ``total_steps`` (default ``steps``) sets
    the schedule's length, so that the first ``steps`` of a longer run can be reproduced exactly.
    On the CPU, one thread; ``history.seconds`` is then the process's CPU time."""
    total = total_steps or steps
    p = sizes["p"] if p is None else p
    device = data.train_rows.device
    torch.manual_seed(seed)
    model = BertForPreTraining(model_config(data, sizes)).to(device)
    g = torch.Generator(device=device).manual_seed(seed)
    mask_id = data.id("[MASK]")

    def make_batch(step: int) -> tuple[Tensor, Tensor]:
        pick = torch.randint(0, len(data.train_rows), (sizes["batch"],), device=device, generator=g)
        rows = data.train_rows[pick]
        inputs, labels = mask_tokens(rows, data.is_special(rows), data.vocab_size, mask_id, p=p,
                                     generator=g, special_ids=data.special_ids)
        if all_mask:
            inputs = rows.masked_fill(labels != IGNORE, mask_id)
        return inputs, labels

    cpu = time.process_time()
    with one_cpu_thread(device):
        k_max = max_chosen(p, data.train_rows.shape[1])
        history = train(model, make_batch, lambda m, b: mlm_loss(m, b, k_max), steps=steps, lr=sizes["lr"],
                        schedule=warmup_cosine(total // 10, total),
                        eval_fn=lambda m: mlm_metrics(m, data), eval_every=max(1, total // evaluations),
                        desc=desc, progress=progress)
    if device.type == "cpu":
        history.seconds = time.process_time() - cpu
    return model, history


# --------------------------------------------------------------------------- fine-tuning
@dataclass
class TaskSplit:
    """One split of the task: ``x`` ``(n, length)`` ids, ``mask`` ``(n, length)`` True on real
    tokens, ``y`` ``(n,)`` labels (1 = class), ``texts`` the docstrings."""

    x: Tensor
    mask: Tensor
    y: Tensor
    texts: list[str]

    def take(self, index: Tensor) -> "TaskSplit":
        return TaskSplit(self.x[index], self.mask[index], self.y[index],
                         [self.texts[i] for i in index.tolist()])


@dataclass
class TaskData:
    train: TaskSplit
    dev: TaskSplit
    validation: TaskSplit


def _is_dev_module(module: str) -> bool:
    return zlib.crc32(module.encode()) % 5 == 0


def task_data(data: MLMData, device: torch.device | str = "cpu") -> TaskData:
    """"Class or function?" encoded as ``[CLS] tokens [SEP]``, cut and padded to the rows' length."""
    length = data.train_rows.shape[1]
    cls, sep, pad = data.id("[CLS]"), data.id("[SEP]"), data.id("[PAD]")

    def encode(texts: list[str], labels: list[int]) -> TaskSplit:
        x = torch.full((len(texts), length), pad, dtype=torch.long)
        for i, text in enumerate(texts):
            row = [cls, *data.tok.encode_ordinary(text)[: length - 2], sep]
            x[i, : len(row)] = torch.tensor(row)
        return TaskSplit(x.to(device), (x != pad).to(device), torch.tensor(labels, device=device), texts)

    texts, labels, modules = class_or_function("train", with_modules=True)
    dev = [_is_dev_module(m) for m in modules]
    keep = [(t, y) for t, y, d in zip(texts, labels, dev) if not d]
    held = [(t, y) for t, y, d in zip(texts, labels, dev) if d]
    valid_texts, valid_labels = class_or_function("validation")
    return TaskData(encode(*map(list, zip(*keep))), encode(*map(list, zip(*held))),
                    encode(valid_texts, valid_labels))


def stratified_subset(y: Tensor, n: int | None, seed: int) -> Tensor:
    """Indices of ``n`` examples, as close to half of each label as ``y`` allows (all when ``n``
    is None or not smaller than ``len(y)``), drawn with ``seed``."""
    if n is None or n >= len(y):
        return torch.arange(len(y), device=y.device)
    if n < 2:
        raise ValueError(f"need at least 2 examples (one per label), got n={n}")
    g = torch.Generator().manual_seed(seed)
    picks = []
    labels = sorted(set(y.tolist()))
    for i, label in enumerate(labels):
        where = (y == label).nonzero().flatten().cpu()
        want = n // len(labels) + (1 if i < n % len(labels) else 0)
        picks.append(where[torch.randperm(len(where), generator=g)[:want]])
    return torch.cat(picks).to(y.device)


class Classifier(nn.Module):
    """An encoder and a new linear layer on its pooled ``[CLS]`` vector: ``(batch, seq)`` -> ``(batch, 2)``."""

    def __init__(self, bert: Bert) -> None:
        super().__init__()
        self.bert, self.head = bert, nn.Linear(bert.config.d_model, 2)

    def forward(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.bert(ids, attention_mask=attention_mask)[1])


@torch.no_grad()
def _scores(model: Classifier, split: TaskSplit) -> dict[str, float]:
    pred = model(split.x, split.mask).argmax(-1)
    return {"accuracy": (pred == split.y).float().mean().item(), "balanced": balanced_accuracy(pred, split.y)}


def fine_tune(encoder: Bert, task: TaskData, sizes: dict[str, Any], lr: float, seed: int,
              subset: Tensor | None = None, steps: int | None = None, copy_encoder: bool = True
              ) -> dict[str, Any]:
    """Fine-tune ``encoder`` + a new head on ``task.train`` (or its ``subset``) for ``steps``
    (default ``sizes["ft_steps"]``) batches of ``sizes["ft_batch"]`` drawn with replacement; AdamW
    at ``lr`` with warm-up and cosine decay. ``seed`` sets the head's initialisation and the batch
    order. Returns dev and validation scores after the last step."""
    steps = steps or sizes["ft_steps"]
    device = task.train.x.device
    split = task.train if subset is None else task.train.take(subset)
    torch.manual_seed(seed)
    model = Classifier(copy.deepcopy(encoder) if copy_encoder else encoder).to(device)
    g = torch.Generator(device=device).manual_seed(seed)

    def make_batch(step: int):
        pick = torch.randint(0, len(split.y), (sizes["ft_batch"],), device=device, generator=g)
        return split.x[pick], split.mask[pick], split.y[pick]

    with one_cpu_thread(device):
        train(model, make_batch, lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), steps=steps, lr=lr,
              schedule=warmup_cosine(steps // 10, steps), progress=False)
        model.eval()
        return {"dev": _scores(model, task.dev), "validation": _scores(model, task.validation),
                "n_train": len(split.y)}


def baseline_scores(task: TaskData, vocab_size: int, subset: Tensor | None = None) -> dict[str, dict]:
    """The task's baselines trained on ``task.train`` (or its ``subset``): majority, the first-word
    rule and a logistic regression on the bag of tokens; balanced accuracy on dev and validation."""
    split = task.train if subset is None else task.train.take(subset)
    both = [task.dev, task.validation]  # predicted together, scored apart
    texts = task.dev.texts + task.validation.texts
    x, mask = torch.cat([s.x for s in both]), torch.cat([s.mask for s in both])
    preds = {
        "majority": baselines.majority(split.y.tolist(), [0] * len(texts)).predictions,
        "first-word rule": baselines.first_word_rule(split.texts, split.y.tolist(), texts).predictions,
        "bag of tokens": baselines.logistic_regression(
            baselines.bag_of_tokens(split.x, split.mask, vocab_size), split.y,
            baselines.bag_of_tokens(x, mask, vocab_size)).predictions,
    }
    n_dev = len(task.dev.y)
    return {name: {"dev": balanced_accuracy(pred[:n_dev], task.dev.y.cpu()),
                   "validation": balanced_accuracy(pred[n_dev:], task.validation.y.cpu())}
            for name, pred in preds.items()}


def fresh_bert(data: MLMData, sizes: dict[str, Any], seed: int) -> Bert:
    """A random encoder of the chapter's size (the start "from scratch")."""
    torch.manual_seed(seed)
    return Bert(model_config(data, sizes))
