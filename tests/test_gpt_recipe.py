"""tfm_course.experiments.gpt_recipe (chapter 8's recipe) and train.weight_decay_groups."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.experiments import gpt_recipe as R
from tfm_course.models.gpt import GPT, GPTConfig
from tfm_course.train import weight_decay_groups


def test_weight_decay_groups_decay_matrices_and_embeddings_only_and_count_a_tied_matrix_once():
    model = GPT(GPTConfig(vocab_size=30, max_len=8, d_model=16, n_layers=2, n_heads=2, bias=True))
    decay, no_decay = weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert sum(p is model.tok_embed.weight for p in decay["params"]) == 1  # tied to lm_head: once
    assert any(p is model.pos_embed.weight for p in decay["params"])
    assert any(p is model.norm.weight for p in no_decay["params"])
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == sum(p.numel() for p in model.parameters())
    torch.optim.AdamW([decay, no_decay], lr=1e-3)  # a valid optimiser (no parameter twice)
    with pytest.raises(ValueError, match="weight_decay must be >= 0, got -1"):
        weight_decay_groups(model, -1)


def test_a_decayed_gain_would_shrink_but_the_groups_leave_it_alone():
    model = GPT(GPTConfig(vocab_size=30, max_len=8, d_model=16, n_layers=1, n_heads=2, bias=False))
    opt = torch.optim.AdamW(weight_decay_groups(model, 0.5), lr=0.1)
    model.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: only the decay moves a parameter
    gain, matrix = model.norm.weight.detach().clone(), model.blocks[0].attn.qkv.weight.detach().clone()
    opt.step()
    assert torch.equal(model.norm.weight, gain)
    assert torch.allclose(model.blocks[0].attn.qkv.weight, matrix * (1 - 0.1 * 0.5))


def test_equal_compute_steps_match_the_flops_of_each_model():
    steps = R.equal_compute_steps(200)
    assert steps["characters"] == 200 and steps["BPE"] < 200
    flops = {name: R.flops_per_token(name) for name in R.TOKENIZERS}
    assert abs(steps["BPE"] * flops["BPE"] - 200 * flops["characters"]) <= flops["BPE"] / 2
    with pytest.raises(ValueError, match="char_steps must be positive, got 0"):
        R.equal_compute_steps(0)


def test_warm_up_is_nanogpts_100_steps_or_a_tenth_of_a_short_run():
    assert R.warmup_steps(2000) == 100 and R.warmup_steps(200) == 20 and R.warmup_steps(5) == 1


def test_eval_windows_predict_every_token_but_the_first_once():
    ids = torch.arange(11)
    w = R.eval_windows(ids, 5)
    assert w.tolist() == [[0, 1, 2, 3, 4, 5], [5, 6, 7, 8, 9, 10]]
    assert torch.equal(w[:, 1:].flatten(), ids[1:])
    with pytest.raises(ValueError, match="need at least 6 tokens for one window, got 3"):
        R.eval_windows(ids[:3], 5)


def test_bits_per_byte_is_the_surprise_over_the_bytes_of_the_predicted_tokens():
    data = R.lm_data("characters")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.vocab_size, max_len=16, d_model=16, n_layers=1, n_heads=2)).eval()
    ids = data.valid[:50]
    w = R.eval_windows(ids, 16)
    with torch.no_grad():
        nll = R.token_nll(model(w[:, :-1])[0], w[:, 1:])
    expected = nll.sum().item() / math.log(2) / data.token_bytes[w[:, 1:]].sum().item()
    assert abs(R.bits_per_byte(model, data, ids) - expected) < 1e-9
    # a temperature transform changes the score; the identity does not
    assert R.bits_per_byte(model, data, ids, transform=lambda z: z) == pytest.approx(expected)
    assert R.bits_per_byte(model, data, ids, transform=lambda z: z / 0.5) != pytest.approx(expected)
    positions = R.bits_by_position(model, data, data.valid[:65])
    assert positions.shape == (16,) and torch.isfinite(positions).all()


def test_ngram_lines_score_the_same_tokens_and_improve_with_order():
    data = R.lm_data("BPE")
    lines = [R.ngram_bits_per_byte(data, order) for order in (1, 2, 3, 4)]
    assert lines == sorted(lines, reverse=True)
    counts = torch.bincount(data.train, minlength=data.vocab_size).double() + 1
    targets = R.eval_windows(data.valid, R.RECIPE["block"])[:, 1:]
    unigram = -(counts / counts.sum()).log2()[targets].sum().item() / data.token_bytes[targets].sum().item()
    assert lines[0] == pytest.approx(unigram, abs=1e-9)
    with pytest.raises(ValueError, match="order must be 1, 2, 3 or 4, got 5"):
        R.ngram_bits_per_byte(data, 5)


def test_train_lm_is_deterministic_and_checks_its_arguments():
    data = R.lm_data("characters")
    recipe = {**R.RECIPE, "d_model": 16, "n_layers": 1, "n_heads": 2, "block": 16, "batch": 4}
    runs = [R.train_lm(data, 6, 1e-3, seed=3, recipe=recipe, evaluations=2, progress=False) for _ in range(2)]
    (m1, h1, t1), (m2, h2, t2) = runs
    assert h1.metrics == h2.metrics and t1 == t2 and len(t1) == 6
    assert len(h1.metrics["validation bits per byte"]) == 2
    assert R.bits_per_byte(m1, data) == h1.last("validation bits per byte")
    other = R.train_lm(data, 6, 1e-3, seed=4, recipe=recipe, evaluations=1, progress=False)[1]
    assert other.loss != h1.loss  # the seed sets the weights and the batches
    with pytest.raises(ValueError, match="need steps > 0 and lr > 0, got steps=0"):
        R.train_lm(data, 0, 1e-3, recipe=recipe)
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        R.lm_data("words")


def test_stop_after_replays_the_start_of_a_longer_run():
    data = R.lm_data("characters")
    recipe = {**R.RECIPE, "d_model": 16, "n_layers": 1, "n_heads": 2, "block": 16, "batch": 4}
    whole = R.train_lm(data, 12, 1e-3, seed=1, recipe=recipe, evaluations=4, progress=False)[1]
    start = R.train_lm(data, 12, 1e-3, seed=1, recipe=recipe, evaluations=4, progress=False, stop_after=6)[1]
    assert len(start.steps) == 6 and start.loss == whole.loss[:6]
    assert start.metrics["validation bits per byte"] == whole.metrics["validation bits per byte"][:2]
