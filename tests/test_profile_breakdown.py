"""tfm_course.experiments.measure.profile_breakdown: where a function's time goes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from cuda_helpers import needs_cuda

from tfm_course.experiments.measure import BREAKDOWN, profile_breakdown


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _check_shares(shares):
    assert list(shares) == list(BREAKDOWN)
    assert all(0.0 <= share <= 1.0 for share in shares.values()), shares
    assert math.isclose(sum(shares.values()), 1.0, abs_tol=1e-9)


def test_a_big_matrix_multiply_is_mostly_matrix_multiplies():
    a = torch.randn(256, 256)
    shares = profile_breakdown(lambda: [a @ a for _ in range(4)], repeats=2)
    _check_shares(shares)
    assert shares["matrix multiplies"] > 0.5, shares
    assert shares["attention kernel"] == shares["cross-entropy"] == shares["optimiser"] == 0.0


def test_a_python_loop_of_tiny_operators_is_mostly_python():
    x = torch.ones(1)

    def loop():
        y = x
        for _ in range(50):
            y = y + 1  # a tiny operator ...
            sum(range(20_000))  # ... between lots of pure Python (~0.2 ms, so a busy machine cannot tip it)
        return y

    shares = profile_breakdown(loop, repeats=2)
    _check_shares(shares)
    assert shares["Python and dispatch"] > 0.5, shares
    assert shares["matrix multiplies"] == 0.0


def test_a_training_step_fills_each_category():
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 50)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x, y = torch.randn(2, 4, 16, 32), torch.randint(0, 50, (2 * 4 * 16,))

    def step():
        h = F.scaled_dot_product_attention(x, x, x, is_causal=True)  # (2, 4, 16, 32)
        loss = F.cross_entropy(layer(h).reshape(-1, 50), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    shares = profile_breakdown(step, repeats=2)
    _check_shares(shares)
    assert all(shares[kind] > 0 for kind in BREAKDOWN), shares


def test_the_attention_kernel_counts_its_backward_too():
    q = torch.randn(2, 4, 128, 32, requires_grad=True)
    shares = profile_breakdown(
        lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward(), repeats=2)
    _check_shares(shares)
    assert shares["attention kernel"] > 0.4 and shares["matrix multiplies"] == 0.0, shares


@needs_cuda
def test_on_a_gpu_the_kernels_time_is_counted_and_the_idle_time_is_python():
    a = torch.randn(4096, 4096, device="cuda")
    shares = profile_breakdown(lambda: [a @ a for _ in range(4)], device="cuda", repeats=2)
    _check_shares(shares)
    assert shares["matrix multiplies"] > 0.5, shares
    x = torch.ones(1, device="cuda")

    def loop():  # the GPU waits for Python between its tiny kernels
        y = x
        for _ in range(50):
            y = y + 1
            sum(range(2000))
        return y

    shares = profile_breakdown(loop, device="cuda", repeats=2)
    _check_shares(shares)
    assert shares["Python and dispatch"] > 0.5 and shares["other operators"] > 0, shares


@pytest.mark.parametrize("repeats", [0, 1.5, True])
def test_bad_repeats_raise(repeats):
    with pytest.raises(ValueError, match=f"repeats must be a positive integer, got {repeats!r}"):
        profile_breakdown(lambda: None, repeats=repeats)
