"""tfm_course.distributed: tensor parallelism in one process, then DDP, ZeRO-1, FSDP and tensor
parallelism on 2 real processes (torchrun, gloo) against one process, the launcher's failures,
and the script alone on one process."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tfm_course.distributed import (ParallelMLP, column_parallel_forward, launch,
                                    mlp_parallel_forward, row_parallel_forward, split_linear)
from tfm_course.layers import FeedForward

ROOT = Path(__file__).resolve().parents[1]
TRAINING_MODES = ("ddp", "zero", "fsdp")


# --------------------------------------------------------------------------- tensor parallel, simulated
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_split_linear_equals_the_whole_layer(world, bias):
    torch.manual_seed(0)
    linear = nn.Linear(8, 12, bias=bias)
    x = torch.randn(2, 3, 8)
    columns, rows = split_linear(linear, world, dim=0), split_linear(linear, world, dim=1)
    assert [s.weight.shape for s in columns] == [(12 // world, 8)] * world
    assert [s.weight.shape for s in rows] == [(12, 8 // world)] * world
    assert sum(s.bias is not None for s in rows) == int(bias)  # the bias, once
    torch.testing.assert_close(column_parallel_forward(columns, x), linear(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(row_parallel_forward(rows, x), linear(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_then_row_parallel_mlp_equals_the_mlp(world):
    torch.manual_seed(0)
    mlp = FeedForward(8, 32, activation="gelu")
    x = torch.randn(2, 5, 8)
    first, second = split_linear(mlp.linear1, world, 0), split_linear(mlp.linear2, world, 1)
    torch.testing.assert_close(mlp_parallel_forward(first, second, x), mlp(x), rtol=0, atol=1e-6)


def test_parallel_mlp_on_one_rank_is_the_mlp():
    torch.manual_seed(0)
    mlp = FeedForward(8, 32, activation="gelu")
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(ParallelMLP(mlp, rank=0, world=1)(x), mlp(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("call, message", [
    (lambda: split_linear(nn.Linear(8, 12), 0, 0), "world must be an integer >= 1, got 0"),
    (lambda: split_linear(nn.Linear(8, 12), 2.0, 0), "world must be an integer >= 1, got 2.0"),
    (lambda: split_linear(nn.Linear(8, 12), 2, 2), "dim must be 0 .* or 1 .*, got 2"),
    (lambda: split_linear(nn.Linear(8, 12), 5, 0), "out_features 12 must be divisible by world 5"),
    (lambda: split_linear(nn.Linear(6, 12), 4, 1), "in_features 6 must be divisible by world 4"),
    (lambda: split_linear(nn.Conv1d(8, 12, 1), 2, 0), "expected an nn.Linear, got Conv1d"),
    (lambda: column_parallel_forward(split_linear(nn.Linear(8, 12), 2, 0), torch.zeros(2, 7)),
     r"expected input \(\.\.\., 8\), got \(2, 7\)"),
    (lambda: mlp_parallel_forward(split_linear(nn.Linear(8, 12), 2, 0),
                                  split_linear(nn.Linear(12, 8), 4, 1), torch.zeros(2, 8)),
     r"expected as many row shards as column shards \(2\), got 4"),
])
def test_tensor_parallel_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------- two processes
@pytest.fixture(scope="module")
def two_processes():
    """One torchrun with 2 workers running every mode on the script's tiny defaults."""
    start = time.perf_counter()
    result = launch(2, ["--mode", "ddp,zero,fsdp,tp"], timeout=120)
    result["launch_seconds"] = time.perf_counter() - start
    return result


@pytest.mark.parametrize("mode", TRAINING_MODES)
def test_every_mode_reaches_the_weights_of_one_process(two_processes, mode):
    """Float32 rounding, taken in another order and amplified by AdamW, stays ~1e-6 while the
    weights move by ~1e-2 (the float64 run below shows it is rounding: ~1e-15)."""
    run = two_processes["modes"][mode]
    assert (run["mode"], run["world_size"], run["backend"], run["steps"]) == (mode, 2, "gloo", 5)
    assert run["max_weight_change"] > 1e-3  # training did move the weights
    assert run["max_abs_diff"] < 1e-3 * run["max_weight_change"]
    assert len(run["losses"]) == 5
    assert run["max_loss_diff"] < 1e-5
    torch.testing.assert_close(run["losses"], run["reference_losses"], rtol=1e-5, atol=0)


def test_memory_per_process(two_processes):
    """DDP holds everything on each rank, ZeRO half of AdamW's state, FSDP half of all three."""
    n_bytes = two_processes["n_params"] * 4
    ddp, zero, fsdp = (two_processes["modes"][m]["memory_bytes"] for m in TRAINING_MODES)
    for rank in ddp:
        assert rank["params"] == rank["grads"] == n_bytes
        assert 2 * n_bytes <= rank["optimizer"] < 2.01 * n_bytes  # two moments (+ step counters)
    assert sum(r["optimizer"] for r in zero) == ddp[0]["optimizer"]  # each tensor's state on one rank
    for rank, full in zip(zero, ddp):
        assert rank["params"] == full["params"] and rank["grads"] == full["grads"]
        assert 0.35 < rank["optimizer"] / full["optimizer"] < 0.65  # whole tensors: uneven split
    assert sum(r["params"] for r in fsdp) == sum(r["grads"] for r in fsdp) == n_bytes
    for rank, full in zip(fsdp, ddp):
        for key in ("params", "grads", "optimizer", "total"):
            assert 0.45 < rank[key] / full[key] < 0.55, key


def test_all_reduce_cost_and_tensor_parallel(two_processes):
    cost = two_processes["all_reduce"]
    assert cost["bytes"] == 4 * two_processes["n_params"]
    assert cost["ring_bytes_per_rank"] == cost["bytes"]  # 2·(N−1)/N = 1 for N = 2
    assert cost["seconds"] > 0
    assert two_processes["modes"]["ddp"]["buckets"] >= 1
    tp = two_processes["modes"]["tp"]
    assert tp["world_size"] == 2
    for key in ("max_abs_diff_output", "max_abs_diff_input_grad", "max_abs_diff_weight_grad"):
        assert tp[key] < 1e-5, key


def test_gradient_accumulation_in_float64_equals_one_process():
    """Two micro-batches per rank (DDP's no_sync, FSDP without gradient sync on the first): in
    float64 the weights agree with one process to ~1e-15, so the float32 differences are rounding."""
    result = launch(2, ["--mode", "ddp,fsdp", "--accumulate", "2", "--dtype", "float64"], timeout=120)
    for mode in ("ddp", "fsdp"):
        run = result["modes"][mode]
        assert run["accumulate"] == 2
        assert run["max_abs_diff"] < 1e-12 and run["max_loss_diff"] < 1e-12, mode


# --------------------------------------------------------------------------- the launcher's failures
@pytest.mark.parametrize("nproc, message", [(0, "got 0"), (1.5, "got 1.5"), (True, "got True")])
def test_launch_bad_nproc(nproc, message):
    with pytest.raises(ValueError, match=f"nproc must be an integer >= 1, {message}"):
        launch(nproc, [])


def test_launch_bad_args_and_timeout_values():
    with pytest.raises(ValueError, match="args must be a list of strings"):
        launch(2, "--mode ddp")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        launch(2, [], timeout=0)


def test_launch_reports_the_workers_error():
    with pytest.raises(RuntimeError, match="(?s)could not run 1 process .*unrecognized arguments: "
                                           "--no-such-flag"):
        launch(1, ["--no-such-flag"], timeout=120)


def test_launch_timeout_kills_every_process():
    marker = str(random.randrange(10**8, 10**9))  # a seed no other process uses
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="2 processes did not finish within 4 s"):
        launch(2, ["--steps", "100000", "--seed", marker], timeout=4)
    assert time.perf_counter() - start < 15
    psutil = pytest.importorskip("psutil")
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert left == []


# --------------------------------------------------------------------------- one process, no torchrun
def test_the_script_runs_alone(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.setdefault("OMP_NUM_THREADS", "1")
    out = tmp_path / "run.json"
    subprocess.run([sys.executable, "-m", "tfm_course.distributed", "--mode", "ddp,zero,fsdp,tp",
                    "--steps", "3", "--out", str(out)], cwd=ROOT, env=env, check=True, timeout=120,
                   capture_output=True)
    result = json.loads(out.read_text())
    assert result["world_size"] == 1
    for mode in TRAINING_MODES:
        run = result["modes"][mode]
        assert run["world_size"] == 1 and len(run["losses"]) == 3
        assert run["max_abs_diff"] < 1e-6, mode  # one process: the reference's very computation
        assert run["memory_bytes"][0]["params"] == 4 * result["n_params"]
    assert result["modes"]["tp"]["max_abs_diff_output"] < 1e-6


def test_nccl_only_with_a_gpu_for_every_local_process(monkeypatch):
    from tfm_course.distributed.train import choose_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert choose_device(0, 1) == ("nccl", torch.device("cuda", 0))
    assert choose_device(1, 2) == ("gloo", torch.device("cpu"))  # Colab: one GPU, two processes
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert choose_device(1, 2) == ("nccl", torch.device("cuda", 1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device(0, 1) == ("gloo", torch.device("cpu"))
