"""Benchmark: our byte-level BPE against a naive trainer and Hugging Face ``tokenizers``, in one run.

    python tools/bench/bench_bpe.py                 # the full run (~3 minutes on one free core)
    python tools/bench/bench_bpe.py --quick         # smaller: no 16k vocabulary, fewer naive samples
    python tools/bench/bench_bpe.py --json out.json # also write the numbers as JSON

What it measures, all on one core (Python is single-threaded; HF ``tokenizers`` is told to use one
thread with ``TOKENIZERS_PARALLELISM=false`` and ``RAYON_NUM_THREADS=1``). Every time is the
process's CPU time (``time.process_time``, all threads), which other programs on a shared machine
do not inflate the way they inflate the wall clock (on an idle machine the two agree), taken with
the garbage collector paused, as ``timeit`` does:

1. **Training** a 4,096-token vocabulary on the whole corpus (both splits, 1.75 M characters):
   ours (:mod:`tfm_course.tokenizers.bpe_train`) and HF's Rust trainer (ByteLevel BPE, same
   pre-tokenisation, same vocabulary size). Best of ``--repeats`` runs.
2. **Encoding** the whole corpus, document by document (HF: ``encode_batch`` on one thread), with a
   fresh tokenizer (empty piece cache); ours also as one string.
3. **The naive trainer** (minbpe style: recount all pairs before each merge) would take hours on
   the whole corpus, so it is not run to the end. Its cost per merge is timed at several points of
   the training (``--naive-points``): the state after m merges is rebuilt exactly by encoding the
   corpus with our first m merges, and a few naive merge steps are timed from there (they must
   pick our very merges). The total is the integral of the mean per-merge time over m
   (trapezoid rule). The same estimate is checked
   against a complete naive run on a slice of the corpus (``--slice-chars``), printed side by side.
4. **Compression**: tokens per character on the validation split for vocabularies of 1k / 4k / 16k
   trained on the train split, ours and HF's (their tie-breaking differs, so merges differ; the
   comparison is of speed and compression, not of merges).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tfm_course.data import corpus  # noqa: E402
from tfm_course.tokenizers import BPETokenizer, count_pieces, train_bpe_naive  # noqa: E402
from tfm_course.tokenizers.bpe_train import train_merges  # noqa: E402
from tfm_course.tokenizers.naive_bpe import naive_merge_step  # noqa: E402
from tfm_course.tokenizers.pretokenize import pretokenize  # noqa: E402


@contextlib.contextmanager
def no_gc():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def best_of(fn, repeats: int) -> tuple[float, object]:
    """The smallest CPU time of ``repeats`` calls of ``fn`` (garbage collector paused), and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        with no_gc():
            start = time.process_time()
            result = fn()
            best = min(best, time.process_time() - start)
    return best, result


def ours_train(docs: list[str], vocab_size: int) -> BPETokenizer:
    return BPETokenizer.train(docs, vocab_size)


def hf_train(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(docs, trainer)
    return tokenizer


def naive_state(tokenizer: BPETokenizer, docs: list[str], n_merges: int) -> tuple[list[list[int]], list[bytes]]:
    """The naive trainer's chunks and token list after ``n_merges`` merges (ids as in ``tokenizer``)."""
    head = tokenizer.truncated(256 + n_merges) if n_merges else BPETokenizer(
        {i: bytes([i]) for i in range(256)}, [])
    chunks = [head.encode_piece(piece) for doc in docs for piece in pretokenize(doc)]
    tokens = [tokenizer.vocab[i] for i in range(256 + n_merges)]
    return chunks, tokens


def naive_estimate(docs: list[str], vocab_size: int, points: int, steps: int,
                   tokenizer: BPETokenizer | None = None) -> tuple[float, list[tuple[int, float]]]:
    """Seconds a naive training to ``vocab_size`` would take: the mean time of ``steps`` consecutive
    naive merges, sampled at ``points`` positions of the training, integrated over the merges."""
    tokenizer = tokenizer or BPETokenizer.train(docs, vocab_size)
    n = len(tokenizer.merges)
    positions = sorted({round(i * (n - steps) / (points - 1)) for i in range(points)})
    samples = []
    for m in positions:
        chunks, tokens = naive_state(tokenizer, docs, m)
        with no_gc():
            start = time.process_time()
            for k in range(steps):
                chunks, merge = naive_merge_step(chunks, tokens)
                assert merge == tokenizer.merges[m + k], (m + k, merge)  # the very same training
            samples.append((m, (time.process_time() - start) / steps))
    inside = sum((m1 - m0) * (t0 + t1) / 2 for (m0, t0), (m1, t1) in zip(samples, samples[1:]))
    return inside + (n - samples[-1][0]) * samples[-1][1], samples


def tokens_per_char(encode, text: str) -> float:
    return len(encode(text)) / len(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--naive-points", type=int, default=6)
    parser.add_argument("--slice-chars", type=int, default=40_000)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    points = 4 if args.quick else args.naive_points
    sizes = (1024, 4096) if args.quick else (1024, 4096, 16384)

    start = time.perf_counter()
    docs_all = [d.text for d in corpus.documents("all")]
    docs_train = [d.text for d in corpus.documents("train")]
    text_all, text_valid = corpus.text("all"), corpus.text("validation")
    out: dict = {"python": sys.version.split()[0], "corpus_chars": len(text_all),
                 "corpus_seconds": time.perf_counter() - start}
    print(f"corpus: {len(docs_all)} docstrings, {len(text_all):,} characters "
          f"({out['corpus_seconds']:.1f} s, disk cache: {corpus.cache_dir()})")

    # 1-2. training and encoding speed, whole corpus, 4,096 tokens
    out["ours_train_s"], ours = best_of(lambda: ours_train(docs_all, 4096), args.repeats)
    out["ours_count_s"], _ = best_of(lambda: count_pieces(docs_all), args.repeats)
    fresh = lambda: BPETokenizer(ours.vocab, ours.merges)  # noqa: E731  (an empty piece cache)
    out["ours_encode_s"], _ = best_of(lambda: [t.encode(d) for t in [fresh()] for d in docs_all], args.repeats)
    out["ours_encode_string_s"], _ = best_of(lambda: fresh().encode(text_all), args.repeats)
    try:
        import tokenizers  # noqa: F401
        out["hf_train_s"], hf = best_of(lambda: hf_train(docs_all, 4096), args.repeats)
        out["hf_encode_s"], _ = best_of(lambda: hf.encode_batch(docs_all), args.repeats)
    except ImportError:
        hf = None
        print("HF tokenizers not installed: skipped")

    # 3. the naive trainer: checked on a slice, estimated on the whole corpus
    slice_docs, total = [], 0
    for doc in docs_all:
        if total >= args.slice_chars:
            break
        slice_docs.append(doc)
        total += len(doc)
    slice_vocab = 512
    out["slice_chars"] = total
    out["slice_naive_measured_s"], (_, naive_merges) = best_of(lambda: train_bpe_naive(slice_docs, slice_vocab), 1)
    out["slice_ours_s"], slice_ours = best_of(lambda: BPETokenizer.train(slice_docs, slice_vocab), args.repeats)
    assert naive_merges == slice_ours.merges, "naive and fast trainers disagree"
    out["slice_naive_estimated_s"], _ = naive_estimate(slice_docs, slice_vocab, 2 * points, 5, slice_ours)
    out["naive_estimated_s"], samples = naive_estimate(docs_all, 4096, points, 3, ours)
    out["naive_samples"] = samples

    # 4. compression on validation
    out["tokens_per_char"] = {}
    pieces = count_pieces(docs_train)
    for size in sizes:
        ours_tok = BPETokenizer(*_vocab_merges(pieces, size))
        row = {"ours": tokens_per_char(ours_tok.encode, text_valid)}
        if hf is not None:
            row["hf"] = tokens_per_char(lambda t, h=hf_train(docs_train, size): h.encode(t).ids, text_valid)
        out["tokens_per_char"][size] = row

    report(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def _vocab_merges(pieces, vocab_size):
    tokens, merges, _ = train_merges(pieces, vocab_size)
    return dict(enumerate(tokens)), merges


def report(out: dict) -> None:
    print(f"\nTraining 4,096 tokens on {out['corpus_chars']:,} characters (one core, CPU time, best of runs):")
    print(f"  ours            {out['ours_train_s']:8.2f} s   (of which counting pieces {out['ours_count_s']:.2f} s)")
    if "hf_train_s" in out:
        print(f"  HF tokenizers   {out['hf_train_s']:8.2f} s   -> ours / HF = {out['ours_train_s'] / out['hf_train_s']:.1f}x")
    print(f"  naive (est.)    {out['naive_estimated_s']:8.0f} s   -> naive / ours = "
          f"{out['naive_estimated_s'] / out['ours_train_s']:.0f}x")
    print("    naive seconds per merge at merge m: "
          + ", ".join(f"m={m}: {s:.2f}" for m, s in out["naive_samples"]))
    print(f"  estimate checked on a {out['slice_chars']:,}-character slice, 512 tokens: naive measured "
          f"{out['slice_naive_measured_s']:.1f} s, estimated {out['slice_naive_estimated_s']:.1f} s; "
          f"ours {out['slice_ours_s']:.3f} s ({out['slice_naive_measured_s'] / out['slice_ours_s']:.0f}x)")
    print(f"\nEncoding the whole corpus, document by document: ours {out['ours_encode_s']:.2f} s"
          + (f", HF {out['hf_encode_s']:.2f} s (ours / HF = {out['ours_encode_s'] / out['hf_encode_s']:.1f}x)"
             if "hf_encode_s" in out else "") + f"; ours as one string {out['ours_encode_string_s']:.2f} s")
    print("\nTokens per character on validation (trained on train):")
    for size, row in out["tokens_per_char"].items():
        print(f"  {size:6d} tokens: ours {row['ours']:.4f}" + (f", HF {row['hf']:.4f}" if "hf" in row else ""))


if __name__ == "__main__":
    main()
