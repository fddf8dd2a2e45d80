"""tfm_course.experiments.measure and .scaling: timing, memory and FLOP counting, sweeps, slopes and
crossovers; tfm_course.viz.markdown_table."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from cuda_helpers import needs_cuda

from tfm_course.attention import fused_attention, scaled_dot_product_attention
from tfm_course.experiments.measure import (count_flops, cuda_peak_bytes, peak_tensor_bytes,
                                            saved_tensor_bytes, time_fn,
                                            time_interleaved)
from tfm_course.experiments.scaling import crossover, loglog_slope, sweep
from tfm_course.viz import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def test_time_fn_counts_calls_and_returns_a_duration():
    calls = []
    t = time_fn(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and t >= 0
    calls.clear()
    time_fn(lambda: calls.append(1), repeats=50, warmup=0, max_seconds=0.0)
    assert len(calls) == 1  # stops after the first run once the budget is spent


def test_time_fn_min_is_the_fastest_run_and_median_the_middle_one():
    import time as _time

    delays = iter([0.0, 0.03, 0.001, 0.02])  # warm-up, then three timed runs

    def sleepy():
        _time.sleep(next(delays))

    fastest = time_fn(sleepy, repeats=3, warmup=1, stat="min")
    assert 0.001 <= fastest < 0.02
    delays = iter([0.0, 0.03, 0.001, 0.02])
    middle = time_fn(sleepy, repeats=3, warmup=1)
    assert 0.02 <= middle < 0.03
    with pytest.raises(ValueError, match="stat"):
        time_fn(lambda: None, stat="mean")


def test_time_interleaved_alternates_the_functions_and_keeps_each_ones_fastest_run():
    import time as _time

    order = []
    # the fastest run of each is far from the others: a busy machine may oversleep by milliseconds
    delays = {"a": iter([0.0, 0.1, 0.001, 0.06]), "b": iter([0.0, 0.002, 0.1, 0.06])}

    def make(name):
        def run():
            order.append(name)
            _time.sleep(next(delays[name]))
        return run

    fast_a, fast_b = time_interleaved([make("a"), make("b")], repeats=3, warmup=1)
    assert order == ["a", "b"] * 4  # one warm-up round, then three timed rounds, in alternation
    assert 0.001 <= fast_a < 0.06 and 0.002 <= fast_b < 0.06
    with pytest.raises(ValueError, match="at least one"):
        time_interleaved([])
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved([lambda: None], repeats=0)


def test_time_fn_waits_for_the_gpu_after_every_run_even_without_a_device(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    time_fn(lambda: events.append("run"), repeats=3, warmup=1)
    assert events == ["run", "sync"] + ["run", "sync"] * 3
    events.clear()
    time_fn(lambda: events.append("run"), repeats=2, warmup=0, device="cuda")
    assert events == ["sync"] + ["run", "sync"] * 2
    events.clear()
    time_fn(lambda: events.append("run"), repeats=2, warmup=0, device="cpu")
    assert events == ["run", "run"]  # nothing to wait for


def test_saved_tensor_bytes_of_a_matmul_is_its_inputs():
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(16, 4, requires_grad=True)
    assert saved_tensor_bytes(lambda: a @ b) == (a.numel() + b.numel()) * 4


def test_cuda_peak_bytes_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        cuda_peak_bytes(lambda: None, "cpu")


def test_peak_tensor_bytes_follows_allocations_and_frees():
    def fn():
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(2000)  # 8000 B: peak 12000 here
        del a
        c = torch.empty(500)  # 2000 B: live 10000
        return b.view(2, 1000), c  # a view allocates nothing

    assert peak_tensor_bytes(fn) == 12_000
    x = torch.randn(100)
    assert peak_tensor_bytes(lambda: x.view(10, 10)) == 0  # views of inputs are not new memory
    assert peak_tensor_bytes(lambda: x.add_(1)) == 0  # nor in-place results


def test_naive_attention_holds_two_score_matrices_the_fused_kernel_none():
    b, h, n, d = 1, 2, 128, 8
    q = torch.randn(b, h, n, d)
    scores = b * h * n * n * 4
    with torch.no_grad():
        naive = peak_tensor_bytes(lambda: scaled_dot_product_attention(q, q, q))
        fused = peak_tensor_bytes(lambda: fused_attention(q, q, q))
    assert 2 * scores <= naive < 3 * scores  # scores and their softmax are alive together
    assert fused < scores / 4  # the n × n matrix is never materialised


def test_count_flops_counts_matmuls_and_the_fused_kernel():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    bh, n, d = 3, 32, 8
    q = torch.randn(1, bh, n, d)
    # QKᵀ and AV: two (n × d) · (d × n)-sized products, 2 FLOPs per multiply-add
    assert count_flops(lambda: fused_attention(q, q, q)) == 2 * 2 * bh * n * n * d
    assert count_flops(lambda: torch.exp(a)) == 0  # element-wise work is not counted


def test_loglog_slope():
    xs = [1, 2, 4, 8]
    assert loglog_slope(xs, [3 * x**2 for x in xs]) == pytest.approx(2.0)
    assert loglog_slope(xs, [5 * x for x in xs]) == pytest.approx(1.0)
    assert loglog_slope(xs, [None, 2.0, 4.0, None]) == pytest.approx(1.0)  # missing points skipped
    assert loglog_slope(xs, [None, None, 1.0, None]) is None


def test_crossover_interpolates_on_loglog_axes():
    xs = [16, 64, 256, 1024]
    linear = [100.0 * x for x in xs]
    quadratic = [float(x * x) for x in xs]
    assert crossover(xs, linear, quadratic) == pytest.approx(100.0)  # 100·n = n² at n = 100
    assert crossover(xs, quadratic, linear) is None  # never cheaper at the end
    assert crossover(xs, [1.0] * 4, [2.0] * 4) == 16  # cheaper everywhere: the first length
    # the *last* crossing counts: cheaper at 16, dearer at 64, cheaper again from between 64 and 256
    x = crossover(xs, [1.0, 3.0, 1.0, 1.0], [2.0] * 4)
    assert 64 < x < 256
    # log(a/b) goes from log 1.5 at 64 to log 0.5 at 256: zero a fraction log 1.5 / log 3 of the way
    assert x == pytest.approx(64 * 4 ** (math.log(1.5) / math.log(3)))
    assert crossover(xs, [1.0, None, None, 1.0], [2.0, 0.5, 0.5, 2.0]) == 16


def _tiny_cases():
    def make_quadratic(n):
        x = torch.randn(n, 4, requires_grad=True)
        return lambda: (x @ x.T) @ x

    def make_linear(n):
        x = torch.randn(n, 4, requires_grad=True)
        return lambda: x * 2

    return {"quadratic": make_quadratic, "linear": make_linear}


def test_sweep_rows_and_caps():
    rows = sweep(_tiny_cases(), [8, 16, 32], repeats=1, time_cap_s=1e6, memory_cap_bytes=1e9)
    assert [(r["method"], r["n"]) for r in rows] == [(m, n) for m in ("quadratic", "linear")
                                                     for n in (8, 16, 32)]
    for r in rows:
        assert r["skipped"] is None and r["fwd_s"] > 0 and r["train_s"] > 0
        assert r["memory_kind"] == "live_tensors" and r["saved_bytes"] >= 0
    quad = [r for r in rows if r["method"] == "quadratic"]
    assert quad[-1]["flops"] == 2 * 2 * 32 * 32 * 4  # x xᵀ then (x xᵀ) x
    assert quad[-1]["peak_bytes"] >= 32 * 32 * 4
    # a memory cap below the extrapolated cost skips that length and every longer one
    # (the memory at 32 is about 32·32·4 B; extrapolated to 64 it is about 4× that)
    capped = sweep({"quadratic": _tiny_cases()["quadratic"]}, [8, 16, 32, 64, 128], repeats=1,
                   time_cap_s=1e6, memory_cap_bytes=3 * 32 * 32 * 4, flops=False)
    status = [r["skipped"] for r in capped]
    assert status[:3] == [None, None, None]
    assert status[3] == status[4] == "skipped (>1.2288e-05 GB)"
    assert capped[3]["fwd_s"] is None and capped[0]["flops"] is None
    # a time cap of zero: the first length runs (nothing to extrapolate from), the rest are skipped
    timed = sweep({"linear": _tiny_cases()["linear"]}, [8, 16, 32], repeats=1, time_cap_s=0.0)
    assert [r["skipped"] for r in timed] == [None, "skipped (>0 s)", "skipped (>0 s)"]


def test_markdown_table():
    table = markdown_table([{"a": 1, "b": "x"}, {"a": 2}], ["a", "b"], ["A", "B"])
    assert table.splitlines() == ["| A | B |", "|---|---|", "| 1 | x |", "| 2 |  |"]


def test_bench_efficient_script_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_efficient", ROOT / "tools" / "bench" / "bench_efficient.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = module.build_cases(batch=1, heads=2, d_head=4, num_features=8, linformer_k=8, chunk_size=8,
                               d_state=2)
    for name, make in cases.items():  # every method runs forward and backward at a tiny size
        out = make(16)()
        out.float().sum().backward()
        assert torch.isfinite(out).all(), name
    out_file = tmp_path / "table.md"
    rows = module.main(["--lengths", "16", "32", "--heads", "2", "--d-head", "4", "--repeats", "1",
                        "--device", "cpu", "--only", "naive", "SDPA (fused)", "chunkwise",
                        "--out", str(out_file)])
    assert {r["method"] for r in rows} == {"softmax (naive)", "SDPA (fused)", "RetNet chunkwise B=64"}
    text = out_file.read_text()
    assert "Forward + backward time" in text and "| softmax (naive) |" in text and "slope" in text
    assert "Crossover length" in text


# --------------------------------------------------------------------------- on a real GPU
@needs_cuda
def test_time_fn_includes_the_gpu_work_not_just_the_queueing():
    a = torch.randn(4096, 4096, device="cuda")

    def work():
        for _ in range(10):
            a @ a

    seconds = time_fn(work, repeats=3)  # no device given: it must still wait for the GPU
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    gpu_seconds = start.elapsed_time(end) / 1e3
    assert seconds >= 0.8 * gpu_seconds, (seconds, gpu_seconds)


@needs_cuda
def test_memory_helpers_on_cuda():
    nbytes = 64 * 2**20

    def allocate():
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return x.sum()

    assert cuda_peak_bytes(allocate, "cuda") >= nbytes
    assert peak_tensor_bytes(allocate) >= nbytes
    rows = sweep({"matmul": lambda n: (lambda: torch.randn(n, 64, device="cuda") @ torch.randn(64, n, device="cuda"))},
                 [128, 256], backward=False, flops=False, device="cuda")
    assert all(r["memory_kind"] == "cuda_peak" and r["peak_bytes"] >= 4 * r["n"] ** 2 for r in rows)
    assert all(r["fwd_s"] > 0 for r in rows)
