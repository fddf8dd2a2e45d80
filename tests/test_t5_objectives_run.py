"""Chapter 9's stored run (tools/runs/t5_objectives.py): its tool in smoke mode, its rate ladder,
and the stored run's checkpoints against its stored numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tfm_course.experiments import stored_runs
from tfm_course.experiments.context_questions import answer_questions
from tfm_course.results import available

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("t5_objectives", ROOT / "tools" / "runs" / "t5_objectives.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rate_ladder_widens_only_past_an_edge():
    tool = _tool()
    assert tool.next_rate({2e-3: 1.0, 4e-3: 0.9}, 1e-3, 1.6e-2) == 8e-3  # best at the top: go up
    assert tool.next_rate({2e-3: 0.8, 4e-3: 0.9}, 1e-3, 1.6e-2) == 1e-3  # best at the bottom: go down
    assert tool.next_rate({1e-3: 0.8, 2e-3: 0.9}, 1e-3, 1.6e-2) is None  # the range ends there
    assert tool.next_rate({2e-3: 1.0, 4e-3: 0.8, 8e-3: 0.9}, 1e-3, 1.6e-2) is None  # interior


def test_the_runner_counts_its_workers_cpu_time():
    runner = _tool().Runner(2)
    done = []
    for _ in range(2):
        runner.submit(sum, (range(3 * 10**7),), done.append)
    runner.drain()
    assert done == [sum(range(3 * 10**7))] * 2
    assert runner.close() > 0.2  # each sum takes about half a second of CPU in its worker


def test_the_tool_runs_in_smoke_mode(tmp_path):
    tool = _tool()
    path = tool.main(["--smoke", "--workers", "1", "--out-dir", str(tmp_path)])
    run = stored_runs.load_run(path.stem, tmp_path)
    assert stored_runs.missing_fields(run) == []
    assert run["child_cpu_seconds"] == 0.0  # one worker: the jobs ran in this process
    arms = {"span corruption", "BERT-style", "prefix LM", "causal LM"}
    assert set(run["best_lr"]) == arms and set(run["fine_tune_lr"]) == arms | {"scratch"}
    assert set(run["checkpoints"]) == arms | set(tool.ABLATIONS)
    assert {"next token: unigram", "next token: KN bigram", "infill: KN two-sided bigram"} <= set(run["references"])
    assert {r["arm"] for r in run["transfer"]} == arms | {"scratch"} and run["baselines"]
    for key in run["checkpoints"]:
        state = stored_runs.load_checkpoint(run, key, tmp_path)
        assert all(v.dtype == torch.float16 for v in state.values() if v.is_floating_point())
    assert not list(tmp_path.glob("_*"))  # the scratch checkpoints are gone


def test_the_stored_checkpoint_gives_the_stored_answers():
    run = stored_runs.load_run("t5_objectives_cpu")
    if not stored_runs.same_corpus(run):
        pytest.skip("this Python's standard library gives another corpus than the run's")
    tool = _tool()
    sizes = run["settings"]["sizes"]
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in sizes.items()))
    s = tool.setting(key)
    questions = s["questions"]
    for arm in ("span corruption", "prefix LM"):
        entry = run["checkpoints"][arm]
        model = tool.load_start(key, None, 0, "")
        model.load_state_dict({k: v.float() for k, v in stored_runs.load_checkpoint(run, arm).items()})
        got = answer_questions(arm, model, questions, s["specials"])
        stored = run["final"][f"{arm}|lr={run['best_lr'][arm]:g}|seed=0"]
        # the same questions; the checkpoint is the fp32 model rounded to fp16
        assert got["next token"]["loss"] == pytest.approx(stored["next token loss"], abs=0.02), entry["file"]
        assert got["infill"]["loss"] == pytest.approx(stored["infill loss"], abs=0.02), entry["file"]
    for arm, rates in run["ladder"].items():  # the chosen rate is interior, or an end of the range
        lr = run["best_lr"][arm]
        low, high = sizes["lr_range"]
        tried = sorted(float(r) for r in rates)
        assert lr in tried and (tried[0] < lr < tried[-1] or lr in (low, high) or len(tried) == 1)


LONG_RUNS = [name for name in available() if name.startswith("t5_objectives_long_")]


@pytest.mark.parametrize("name", LONG_RUNS)
def test_each_long_run_checkpoint_gives_its_stored_answers(name):
    """The --long runs (span corruption, its two ablations and prefix LM, 20,000 steps): the checkpoint, rounded to
    fp16, answers the stored questions as the run recorded at its last evaluation."""
    run = stored_runs.load_run(name)
    if not stored_runs.same_corpus(run):
        pytest.skip("this Python's standard library gives another corpus than the run's")
    tool = _tool()
    sizes = run["settings"]["sizes"]
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in sizes.items()))
    s = tool.setting(key)
    arm = tool.objective_of(run["settings"]["objective"])  # an ablation answers as span corruption
    model = tool.load_start(key, None, 0, "")
    model.load_state_dict({k: v.float() for k, v in stored_runs.load_checkpoint(run, f"seed{run['seeds'][0]}").items()})
    got = answer_questions(arm, model, s["questions"], s["specials"])
    assert got["next token"]["loss"] == pytest.approx(run["final"]["next token loss"], abs=0.02)
    assert got["infill"]["loss"] == pytest.approx(run["final"]["infill loss"], abs=0.02)
    if "transfer" in run:
        assert run["transfer_command"].startswith("python tools/runs/t5_objectives.py --transfer-of " + name)


def test_a_long_run_of_an_ablation_in_smoke_mode(tmp_path):
    """--long takes the span-corruption ablations too; the file name keeps no comma or percent sign."""
    tool = _tool()
    path = tool.main(["--long", "span corruption, 50 % noise", "--steps", "4", "--lr", "4e-3", "--smoke",
                      "--out-dir", str(tmp_path)])
    assert path.name == "t5_objectives_long_span_corruption_50_pct_noise_4_cpu_smoke.json"
    run = stored_runs.load_run(path.stem, tmp_path)
    assert stored_runs.missing_fields(run) == [] and run["settings"]["objective"] == "span corruption, 50 % noise"
    assert tool.objective_of(run["settings"]["objective"]) == "span corruption"
    state = stored_runs.load_checkpoint(run, "seed0", tmp_path)
    assert all(v.dtype == torch.float16 for v in state.values() if v.is_floating_point())
