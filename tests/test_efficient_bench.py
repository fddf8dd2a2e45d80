"""Quality at equal training time (tfm_course.experiments.equal_time), the sweep tables
(tfm_course.experiments.scaling) and tools/bench/bench_efficient.py's modes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tfm_course.efficient.cases import attention_cases
from tfm_course.experiments import stored_runs
from tfm_course.experiments.equal_time import (QualityResult, best_rates, lr_sweep, rate_beyond,
                                               quality_at_equal_steps, quality_at_equal_time,
                                               quality_table, train_for)
from tfm_course.experiments.scaling import crossover_table, metric_table

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(length=40, task=dict(num_records=4, num_queries=8, num_keys=8, num_values=4),
             d_model=16, num_heads=2, test_size=16, device="cpu")


def _tool():
    spec = importlib.util.spec_from_file_location("bench_efficient", ROOT / "tools" / "bench" / "bench_efficient.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measured_timing_spends_the_budget_in_steps_and_is_reproducible():
    result = train_for("linformer", seconds=0.3, seed=1, k=8, **SMALL)
    assert isinstance(result, QualityResult)
    assert result.attention == "linformer" and result.seed == 1 and result.length == 40
    assert result.steps == max(1, int(0.3 / (result.step_ms / 1e3)))
    assert 0.0 <= result.accuracy <= 1.0 and result.as_dict()["steps"] == result.steps
    assert "model" not in result.as_dict()  # the numbers only
    assert sum(p.numel() for p in result.model.parameters()) == result.parameters
    # a number of steps and a seed fix the model, however busy the machine
    runs = [train_for("linformer", seed=1, k=8, steps=3, **SMALL) for _ in range(2)]
    assert runs[0].steps == runs[1].steps == 3 and runs[0].accuracy == runs[1].accuracy
    for a, b in zip(runs[0].model.parameters(), runs[1].model.parameters()):  # the trained models
        assert torch.equal(a, b)


def test_training_flushes_subnormals_on_a_cpu_and_switches_it_back_off(monkeypatch):
    import tfm_course.experiments.equal_time as equal_time
    from tfm_course.experiments.equal_time import flush_denormals
    tiny = torch.tensor([1e-40])  # subnormal in float32
    assert (tiny * 1.0).item() != 0.0
    with flush_denormals("cpu"):
        assert (tiny * 1.0).item() == 0.0  # flushed inside the block
    assert (tiny * 1.0).item() != 0.0  # and off again afterwards (PyTorch's default)
    with flush_denormals("meta"):  # not a CPU: nothing changes
        assert (tiny * 1.0).item() != 0.0
    # train_for trains and scores inside the block: record the setting while it scores
    seen, score = [], equal_time.recall_accuracy
    monkeypatch.setattr(equal_time, "recall_accuracy",
                        lambda model, batch: seen.append((tiny * 1.0).item()) or score(model, batch))
    assert train_for("linformer", seed=0, k=8, steps=2, **SMALL).steps == 2  # SMALL: on the CPU
    assert seen == [0.0] and (tiny * 1.0).item() != 0.0


def test_wall_timing_stops_at_the_time_limit():
    result = train_for("softmax", seconds=0.3, timing="wall", **SMALL)
    assert result.steps >= 1 and 0.3 <= result.seconds < 0.3 + 5.0


def test_every_kind_and_seed_gets_a_row_and_the_same_parameters_where_the_layers_match():
    results = quality_at_equal_time(["softmax", "performer"], 0.2, seeds=(0, 1), num_features=8,
                                    **SMALL)
    assert [(r.attention, r.seed) for r in results] == [("softmax", 0), ("softmax", 1),
                                                        ("performer", 0), ("performer", 1)]
    assert len({r.parameters for r in results}) == 1


def test_train_for_bad_settings_raise():
    with pytest.raises(ValueError, match="seconds must be positive"):
        train_for("softmax", 0, **SMALL)
    with pytest.raises(ValueError, match="kind must be one of"):
        train_for("reformer", 0.1, **SMALL)
    with pytest.raises(ValueError, match="steps must be positive"):
        train_for("softmax", steps=0, **SMALL)
    with pytest.raises(ValueError, match="exactly one budget"):
        train_for("softmax", 0.1, steps=3, **SMALL)
    with pytest.raises(ValueError, match="exactly one budget"):
        train_for("softmax", **SMALL)
    with pytest.raises(ValueError, match="lr must be positive"):
        train_for("softmax", steps=1, lr=0.0, **SMALL)
    with pytest.raises(ValueError, match="missing \\['performer'\\]"):
        quality_at_equal_steps(["softmax", "performer"], 2, lrs={"softmax": 1e-3}, **SMALL)
    with pytest.raises(ValueError, match="timing must be"):
        train_for("softmax", 0.1, timing="cpu", **SMALL)


def test_the_cases_include_tiled_attention_and_a_window_mask_and_all_run_backward():
    cases = attention_cases(heads=2, d_head=4, num_features=8, linformer_k=8, chunk_size=8,
                            d_state=2, block_size=8, window=3)
    assert "tiled online softmax B=8" in cases and "SDPA + window mask w=3" in cases
    assert "window, blocked w=3" in cases
    fresh = attention_cases(heads=2, d_head=4, window=3)  # its first inputs are those of `cases`
    torch.testing.assert_close(cases["window, blocked w=3"](20)(), fresh["SDPA + window mask w=3"](20)(),
                               atol=1e-5, rtol=1e-5)  # same inputs, same maths
    for name, make in cases.items():
        out = make(20)()
        out.float().sum().backward()
        assert bool(torch.isfinite(out).all()), name


def test_tool_quick_mode_uses_ci_sizes(tmp_path):
    out = tmp_path / "quick.md"
    rows = _tool().main(["--quick", "--only", "SDPA (fused)", "--device", "cpu", "--out", str(out)])
    assert sorted({r["n"] for r in rows}) == [128, 256, 512, 1024]
    assert "Crossover length" in out.read_text()


def test_tool_quality_mode_writes_the_table(tmp_path, monkeypatch):
    tool = _tool()
    monkeypatch.setattr(tool, "QUALITY_KINDS", ("softmax", "window"))
    out = tmp_path / "quality.md"
    rows = tool.main(["--quality", "0.2", "--seeds", "0", "--quality-length", "96", "--device",
                      "cpu", "--out", str(out)])
    assert [r["attention"] for r in rows] == ["softmax", "window"]
    text = out.read_text()
    assert "| softmax | 1 |" in text and "| window | 1 |" in text and "ms / step" in text


def _rows():
    """A quadratic baseline, a linear method that overtakes it between 200 and 400, one that never
    does, and a skipped cell."""
    cost = {"base": lambda n: n * n, "linear": lambda n: 300 * n, "slow": lambda n: 2 * n * n}
    rows = [{"method": m, "n": n, "t": f(n), "skipped": None} for m, f in cost.items()
            for n in (100, 200, 400, 800)]
    rows[-1] = {"method": "slow", "n": 800, "t": None, "skipped": "skipped (>1 s)"}
    return rows


def test_metric_table_has_a_row_per_method_a_column_per_length_and_the_slope():
    text = metric_table(_rows(), "t", lambda v: "—" if v is None else f"{v:.0f}", "cost")
    lines = text.splitlines()
    assert lines[0] == "### cost" and lines[2] == "| method | 100 | 200 | 400 | 800 | slope |"
    assert lines[4] == "| base | 10000 | 40000 | 160000 | 640000 | 2.00 |"
    assert lines[5].endswith("| 1.00 |") and "skipped (>1 s)" in lines[6]


def test_crossover_table_names_the_length_always_or_never():
    text = crossover_table(_rows(), "t", ["base"])
    lines = text.splitlines()
    assert lines[0] == "| method | vs base |"
    assert lines[2] == "| linear | 300 |"  # 300·n = n² at n = 300
    assert lines[3] == "| slow | never (≤ 400) |"  # the skipped 800 is not shared
    assert "always (≥ 100)" in crossover_table(_rows(), "t", ["slow"])


def test_quality_table_averages_seeds():
    results = [QualityResult("softmax", s, 40, 10 + s, 2.0, 1.0, acc, 100, lr=3e-3)
               for s, acc in ((0, 1.0), (1, 0.5))]
    assert (quality_table(results).splitlines()[2]
            == "| softmax | 2 | 0.003 | 10 | 2.0 | 0.750 | 0.500 – 1.000 |")


def test_equal_steps_train_each_method_at_its_own_rate_for_the_same_steps():
    results = quality_at_equal_steps(["softmax", "linformer"], 3, lrs={"softmax": 1e-3, "linformer": 2e-2},
                                     seeds=(0, 1), k=8, **SMALL)
    assert [(r.attention, r.seed, r.lr, r.steps) for r in results] == [
        ("softmax", 0, 1e-3, 3), ("softmax", 1, 1e-3, 3), ("linformer", 0, 2e-2, 3), ("linformer", 1, 2e-2, 3)]
    # the rate is what it says: the same seed at another rate trains another model
    other = train_for("softmax", steps=3, lr=2e-2, seed=0, **SMALL)
    assert not all(torch.equal(a, b) for a, b in zip(other.model.parameters(), results[0].model.parameters()))


def _result(kind, lr, seed, accuracy):
    return QualityResult(kind, seed, 40, 5, 1.0, 0.1, accuracy, 10, lr=lr)


def test_best_rates_takes_the_best_mean_over_seeds_and_the_smaller_rate_on_a_tie():
    grid = [_result("softmax", 1e-3, 0, 0.9), _result("softmax", 1e-3, 1, 0.1),  # mean 0.5
            _result("softmax", 3e-3, 0, 0.6), _result("softmax", 3e-3, 1, 0.6),  # mean 0.6: best
            _result("window", 3e-3, 0, 0.4), _result("window", 1e-3, 0, 0.4)]  # a tie
    assert best_rates(grid) == {"softmax": 3e-3, "window": 1e-3}  # not the best single seed (0.9)
    sweep = lr_sweep(["window"], [1e-3, 1e-2], 2, seeds=(0,), window=2, **SMALL)
    assert [(r.lr, r.steps) for r in sweep] == [(1e-3, 2), (1e-2, 2)]
    assert best_rates(sweep)["window"] == max(sweep, key=lambda r: (r.accuracy, -r.lr)).lr
    with pytest.raises(ValueError, match="at least one"):
        lr_sweep(["window"], [], 2, **SMALL)


def test_rate_beyond_widens_only_past_a_winning_end():
    assert rate_beyond([1e-3, 2e-3, 4e-3], 1e-3) == 5e-4
    assert rate_beyond([1e-3, 2e-3, 4e-3], 4e-3) == 8e-3
    assert rate_beyond([1e-3, 2e-3, 4e-3], 2e-3) is None
    with pytest.raises(ValueError, match="not among the rates tried"):
        rate_beyond([1e-3, 2e-3], 3e-3)


def test_the_learning_rate_sweep_tool_runs_in_smoke_mode_and_the_stored_sweep_is_complete(tmp_path):
    spec = importlib.util.spec_from_file_location("equal_steps_lr", ROOT / "tools" / "runs" / "equal_steps_lr.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tool.main(["--smoke", "--out-dir", str(tmp_path)])
    for run in (stored_runs.load_run(path.stem, tmp_path), stored_runs.load_run("equal_steps_lr_cpu")):
        settings = run["settings"]
        assert stored_runs.missing_fields(run) == []
        assert {r["steps"] for r in run["results"]} == {settings["steps"]}  # equal steps, every run
        for kind in tool.ATTENTIONS:
            curve = dict(run["curves"][kind])  # mean accuracy per rate tried
            assert set(settings["lrs"]) <= set(curve)
            assert len([r for r in run["results"] if r["attention"] == kind]) == len(curve) * len(run["seeds"])
            best = max(sorted(curve), key=lambda lr: curve[lr])  # the best mean over the seeds
            assert run["best_lr"][kind] == best
            extended = len(curve) - len(settings["lrs"])
            assert 0 <= extended <= tool.MAX_EXTENSIONS
            if extended < tool.MAX_EXTENSIONS:  # it stopped because the best is inside the range
                assert min(curve) < best < max(curve)


def test_the_equal_time_tool_runs_in_smoke_mode_and_the_stored_run_is_complete(tmp_path):
    spec = importlib.util.spec_from_file_location("equal_time_long", ROOT / "tools" / "runs" / "equal_time_long.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tool.main(["--smoke", "--workers", "0", "--out-dir", str(tmp_path)])
    for run in (stored_runs.load_run(path.stem, tmp_path), stored_runs.load_run("equal_time_long_cpu")):
        settings, results = run["settings"], run["results"]
        assert stored_runs.missing_fields(run) == []
        ms, steps = settings["measured_step_ms"], settings["equal_time_steps"]
        assert steps["softmax"] == settings["softmax_steps"]
        for kind in tool.ATTENTIONS:  # equal measured time: steps x ms per step within one step's time
            assert abs(steps[kind] * ms[kind] - steps["softmax"] * ms["softmax"]) <= ms[kind] / 2 + 1e-9
            mine = [r for r in results if r["attention"] == kind]
            assert {r["steps"] for r in mine} == {steps[kind]}
            seed0 = {r["lr"]: r["accuracy"] for r in mine if r["seed"] == run["seeds"][0]}
            assert set(settings["lrs"]) <= set(seed0) and dict(run["curves"][kind]) == seed0
            best = run["best_lr"][kind]
            assert best == max(seed0, key=lambda lr: (seed0[lr], -lr))
            extended = len(seed0) - len(settings["lrs"])  # rates tried beyond the grid's ends
            assert 0 <= extended <= tool.MAX_EXTENSIONS
            if extended < tool.MAX_EXTENSIONS:  # the search stopped because the best is inside
                assert min(seed0) < best < max(seed0)
            assert sorted(r["seed"] for r in mine if r["lr"] == run["best_lr"][kind]) == run["seeds"]
