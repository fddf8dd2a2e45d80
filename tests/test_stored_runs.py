"""Stored runs (tfm_course.results): complete, intact, loadable without running code, reproducible,
shipped with the package; the tools that make them run (smoke mode)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import torch

from tfm_course.experiments import bert_recipe as R
from tfm_course.experiments import stored_runs
from tfm_course.models.bert import BertForPreTraining
from tfm_course.results import available

ROOT = Path(__file__).resolve().parent.parent
RUNS = available()
PRETRAINING = [name for name in RUNS if name.startswith("bert_mlm_")]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "runs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stored_runs_are_there():
    for name in ("bert_mlm_short_cpu", "bert_mlm_long_cpu", "bert_mlm_all_mask_cpu", "bert_label_sweep_cpu",
                 "bert_order_sweep_cpu"):
        assert name in RUNS


@pytest.mark.parametrize("name", RUNS)
def test_stored_run_is_complete(name):
    run = stored_runs.load_run(name)
    assert stored_runs.missing_fields(run) == []
    assert run["name"] == name and run["command"].startswith("python tools/runs/")
    assert run["machine"]["device"] in ("cpu", "cuda") and run["machine"]["threads"] >= 1
    assert run["cpu_seconds"] > 0 and run["wall_seconds"] > 0
    assert len(run["commit"]) >= 40 and len(run["corpus"]) == 16


@pytest.mark.parametrize("name", PRETRAINING)
def test_checkpoints_match_their_hash_and_load_without_code(name):
    run = stored_runs.load_run(name)
    assert set(run["checkpoints"]) == {f"seed{s}" for s in run["seeds"]}
    for key, entry in run["checkpoints"].items():
        data = resources.files("tfm_course.results").joinpath(entry["file"]).read_bytes()
        assert len(data) == entry["bytes"] <= stored_runs.MAX_CHECKPOINT_BYTES
        assert stored_runs.sha256_of(data) == entry["sha256"]
        state = stored_runs.load_checkpoint(run, key)  # weights_only=True inside
        assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_all_stored_results_fit_the_size_budget():
    folder = resources.files("tfm_course.results")
    total = sum(p.stat().st_size for p in Path(str(folder)).iterdir() if p.suffix in (".json", ".pt"))
    assert total <= 25 * 2**20


@pytest.mark.parametrize("name", PRETRAINING)
def test_checkpoint_reproduces_its_stored_metric(name):
    run = stored_runs.load_run(name)
    if not stored_runs.same_corpus(run):
        pytest.skip("this Python's standard library gives another corpus than the run's")
    sizes = run["settings"]["sizes"]
    data = R.mlm_data(sizes)
    for key in run["checkpoints"]:
        model = BertForPreTraining(R.model_config(data, sizes))
        model.load_state_dict(stored_runs.load_checkpoint(run, key))
        model.eval()
        got = R.mlm_metrics(model, data)
        last = {metric: run["curves"][key][metric][-1][1] for metric in ("loss", "accuracy")}
        # the same code on the same validation positions: fp32 reductions differ by ~1e-6 between
        # machines and thread counts, far below 1e-3
        assert got["loss"] == pytest.approx(last["loss"], abs=1e-3)
        assert got["accuracy"] == pytest.approx(last["accuracy"], abs=1.5 / len(data.valid_labels[data.valid_labels >= 0]))


@pytest.mark.parametrize("name", ["bert_label_sweep_cpu", "bert_order_sweep_cpu"])
def test_label_sweep_is_complete_and_its_rates_are_interior(name):
    run = stored_runs.load_run(name)
    summary = run["curves"]["summary"]
    seeds = len(run["seeds"])
    assert seeds >= 5
    for row in summary:
        assert row["runs"] == seeds
        assert not row["at_edge"]  # widened (--widen) until every chosen rate has a worse one on each side
    counts = {row["labels"] for row in summary if row["start"] == "long"}
    assert {16, 32, 64, 128, 256, 512, 1024, run["settings"]["n_all"]} <= counts
    for start, factor in _tool("bert_label_sweep").STEPS_FACTOR.items():  # the 4x starts say so
        if any(r["start"] == start for r in run["curves"]["records"]):
            assert run["steps"][f"fine_tuning, {start}"] == factor * run["steps"]["fine_tuning"]
    assert run["settings"].get("task", "kind") == {"bert_label_sweep_cpu": "kind", "bert_order_sweep_cpu": "order"}[name]
    for row in summary:  # every (start, label count) saw every seed at its chosen rate
        seeds_at = {r["seed"] for r in run["curves"]["records"]
                    if r["start"] == row["start"] and r["labels"] == row["labels"] and r["lr"] == row["lr"]}
        assert seeds_at == set(run["seeds"])


def test_results_are_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert {"*.json", "*.pt"} <= set(config["tool"]["setuptools"]["package-data"]["tfm_course.results"])


def test_a_damaged_checkpoint_is_refused(tmp_path):
    entry = stored_runs.save_checkpoint({"w": torch.ones(3)}, "tiny", folder=tmp_path)
    run = {"name": "tiny", "checkpoints": {"w": entry}}
    assert torch.equal(stored_runs.load_checkpoint(run, "w", tmp_path)["w"], torch.ones(3))
    data = bytearray((tmp_path / "tiny.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    (tmp_path / "tiny.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        stored_runs.load_checkpoint(run, "w", tmp_path)
    with pytest.raises(ValueError, match="no checkpoint 'x'"):
        stored_runs.load_checkpoint(run, "x", tmp_path)


def test_an_incomplete_run_is_not_written(tmp_path):
    run = stored_runs.new_run("partial", "python tools/runs/x.py", seeds=[0])
    with pytest.raises(ValueError, match="curves"):
        stored_runs.write_run(run, folder=tmp_path)


def test_the_sweep_widens_only_where_the_chosen_rate_sits_at_an_edge():
    sweep = _tool("bert_label_sweep")
    rec = lambda lr, dev: {"start": "scratch", "labels": 32, "lr": lr, "seed": 0, "dev": dev}  # noqa: E731
    assert sweep.widen([rec(1e-3, 0.6), rec(3e-3, 0.7), rec(1e-2, 0.8)], {("scratch", 32)}) == {("scratch", 32): [3e-2]}
    assert sweep.widen([rec(1e-3, 0.6), rec(3e-3, 0.9), rec(1e-2, 0.8)], {("scratch", 32)}) == {}  # interior
    assert sweep.widen([rec(1e-4, 0.9), rec(3e-4, 0.8)], {("scratch", 32)}) == {("scratch", 32): [3e-5]}
    assert sweep.widen([rec(3e-2, 0.9), rec(1e-2, 0.8)], {("scratch", 32)}) == {}  # the ladder ends there


def test_the_tools_run_in_smoke_mode(tmp_path):
    """Every stored-run tool, a few steps each, into a temporary folder."""
    pretraining, sweep = _tool("bert_pretraining"), _tool("bert_label_sweep")
    for args in (["--run", "short"], ["--run", "long", "--seeds", "0", "1"], ["--run", "all_mask"],
                 ["--run", "all_mask", "--lr", "1e-3"], ["--run", "longer"]):
        pretraining.main([*args, "--smoke", "--out-dir", str(tmp_path)])
    path = sweep.main(["--smoke", "--workers", "0", "--seeds", "0", "--out-dir", str(tmp_path)])
    run = json.loads(path.read_text())
    assert stored_runs.missing_fields(run) == []
    assert {row["start"] for row in run["curves"]["summary"]} == set(sweep.STARTS) | set(sweep.BASELINES["kind"])
    path = sweep.main(["--smoke", "--workers", "0", "--seeds", "0", "--task", "order", "--starts", "scratch", "longer",
                       "--out-dir", str(tmp_path)])
    run = json.loads(path.read_text())
    assert path.name == "bert_order_sweep_cpu_smoke.json" and run["settings"]["task"] == "order"
    assert {row["start"] for row in run["curves"]["summary"]} == {"scratch", "longer", *sweep.BASELINES["order"]}
    before = run["curves"]["records"]
    expected = sweep.widen(before, {(r["start"], r["labels"]) for r in run["curves"]["summary"] if r["lr"]})
    path = sweep.main(["--smoke", "--workers", "0", "--seeds", "0", "--task", "order", "--widen",
                       "--out-dir", str(tmp_path)])
    widened = json.loads(path.read_text())
    added = widened["curves"]["records"][len(before):]
    assert widened["curves"]["records"][:len(before)] == before  # the stored records are kept as they were
    assert sorted((r["start"], r["labels"], r["lr"]) for r in added) == sorted(
        (s, n, lr) for (s, n), lrs in expected.items() for lr in lrs)  # exactly the edge cells' new rungs
    assert widened["merged_from"]["command"] == run["command"]
    short = stored_runs.load_run("bert_mlm_short_cpu_smoke", tmp_path)
    assert short["steps"] == {"seed0": 6} and stored_runs.load_checkpoint(short, "seed0", tmp_path)


# --------------------------------------------------------------------------- chapter 8's compute sweep
def _gpt_sweep_is_well_formed(run, budgets, seeds):
    from tfm_course.experiments import gpt_recipe

    assert stored_runs.missing_fields(run) == [] and run["settings"]["partial"] is False
    assert run["settings"]["recipe"]["betas"] == [0.9, 0.99] and run["settings"]["recipe"]["weight_decay"] == 0.1
    for name in gpt_recipe.TOKENIZERS:
        lines = [run["settings"]["ngram_bits_per_byte"][name][str(o)] for o in (1, 2, 3, 4)]
        assert lines == sorted(lines, reverse=True)
        for b in budgets:
            mine = [r for r in run["records"] if r["tokenizer"] == name and r["budget"] == b]
            tried = {r["lr"]: r["bits_per_byte"] for r in mine if r["seed"] == seeds[0]}
            best = min(tried, key=tried.get)
            assert len(tried) >= 2  # a ladder, not one guess
            # the best rate is inside the tried range, or at the ladder's limit
            assert min(tried) < best < max(tried) or best in (0.00025, 0.008)  # or the ladder's limit
            at_best = sorted(r["seed"] for r in mine if r["lr"] == best)
            assert at_best == sorted(seeds)  # every seed at the chosen rate
            assert all(r["steps"] == run["settings"]["steps_per_budget"][str(b)][name] for r in mine)
    small = min(budgets)
    assert sorted(run["settings"]["checkpoint_runs"]) == sorted([*gpt_recipe.TOKENIZERS, f"BPE-{small}"])
    for key, where in run["settings"]["checkpoint_runs"].items():
        state = stored_runs.load_checkpoint(run, key, Path(run["_folder"]) if "_folder" in run else None)
        model = gpt_recipe.make_model(state["tok_embed.weight"].shape[0])
        model.load_state_dict({k: v.float() for k, v in state.items()})
        assert where["budget"] == (small if key.endswith(f"-{small}") else max(budgets))
        assert 0 < where["whole_validation_bits_per_byte"] < 10


def test_the_gpt_compute_sweep_is_complete_and_its_checkpoints_reproduce_it():
    from tfm_course.experiments import gpt_recipe

    run = stored_runs.load_run("gpt_compute_sweep_cpu")
    budgets, seeds = run["settings"]["budgets"], run["seeds"]
    assert budgets == [200, 800, 2000, 3200] and len(seeds) >= 3
    _gpt_sweep_is_well_formed(run, budgets, seeds)
    if not stored_runs.same_corpus(run):
        pytest.skip("this Python's standard library gives another corpus than the run's")
    for key, where in run["settings"]["checkpoint_runs"].items():
        name = where["tokenizer"]
        model = gpt_recipe.make_model(gpt_recipe.lm_data(name).vocab_size)
        model.load_state_dict({k: v.float() for k, v in stored_runs.load_checkpoint(run, key).items()})
        stored = next(r["bits_per_byte"] for r in run["records"] if r["tokenizer"] == name and
                      r["budget"] == where["budget"] and r["lr"] == where["lr"] and r["seed"] == where["seed"])
        # fp16 weights: within a hundredth of a bit of the fp32 model's score
        assert gpt_recipe.bits_per_byte(model, gpt_recipe.lm_data(name)) == pytest.approx(stored, abs=0.01)


def test_the_gpt_compute_sweep_tool_runs_in_smoke_mode(tmp_path):
    tool = _tool("gpt_compute_sweep")
    path = tool.main(["--smoke", "--workers", "0", "--out-dir", str(tmp_path)])
    run = json.loads(path.read_text())
    run["_folder"] = str(tmp_path)
    _gpt_sweep_is_well_formed(run, run["settings"]["budgets"], run["seeds"])
    # --extend on a sweep that lacks the small checkpoint: retrains it, scores it, says who added it
    del run["checkpoints"]["BPE-4"], run["settings"]["checkpoint_runs"]["BPE-4"], run["_folder"]
    path.write_text(json.dumps(run))
    extended = json.loads(tool.main(["--smoke", "--extend", "--out-dir", str(tmp_path)]).read_text())
    extended["_folder"] = str(tmp_path)
    _gpt_sweep_is_well_formed(extended, run["settings"]["budgets"], run["seeds"])
    assert extended["addenda"][-1]["command"].endswith("--extend --out-dir " + str(tmp_path))


def test_the_decoder_ablation_tool_runs_in_smoke_mode(tmp_path):
    tool = _tool("decoder_ablation")
    run = json.loads(tool.main(["--smoke", "--workers", "0", "--out-dir", str(tmp_path)]).read_text())
    assert not stored_runs.missing_fields(run)
    arms = [row["arm"] for row in run["curves"]["summary"]]
    assert arms == list(tool.ARMS)[:2] and all(row["runs"] == 2 for row in run["curves"]["summary"])
    for row in run["curves"]["summary"]:
        assert row["mean"] == pytest.approx(sum(row["scores"]) / 2)
    costs = run["settings"]["costs"]
    assert costs["RMSNorm"]["parameters"] == costs["GPT-2 (chapter 8)"]["parameters"]  # no biases: same count
    assert set(run["settings"]["ngram_bits_per_byte"]) == {"1", "2", "3", "4"}


def test_each_ablation_arm_changes_only_its_switches():
    tool = _tool("decoder_ablation")
    base = tool.config("GPT-2 (chapter 8)", 1024)
    fields = [f.name for f in dataclasses.fields(base)]
    for arm, switches in tool.ARMS.items():
        changed = {f for f in fields if getattr(tool.config(arm, 1024), f) != getattr(base, f)}
        assert changed == set(switches), (arm, changed)
    # the last arm is every change but biases (the base has none, as Qwen3)
    everything = set().union(*(s for a, s in tool.ARMS.items() if a not in ("biases", tool.ALL)))
    assert set(tool.ARMS[tool.ALL]) == everything
    with pytest.raises(ValueError, match="arm must be one of"):
        tool.make("SwiGlu")


def test_the_decoder_ablation_resumes_and_runs_long(tmp_path):
    """Finished runs are kept in a .partial.jsonl (an interrupted ablation resumes); --long reads
    the rates the short ablation chose and tries them and half of them, at more steps."""
    tool = _tool("decoder_ablation")
    partial = tmp_path / "decoder_ablation_cpu_smoke.partial.jsonl"
    fake = {"arm": tool.BASE, "steps": 4, "lr": 1e-3, "seed": 0, "bits_per_byte": 9.0, "valid": [[4, 9.0]],
            "cpu_seconds": 0.0}
    partial.write_text(json.dumps(fake) + "\n")
    short = json.loads(tool.main(["--smoke", "--workers", "0", "--out-dir", str(tmp_path)]).read_text())
    assert fake in short["curves"]["records"] and not partial.exists()  # reused, not rerun; then cleaned up
    long = json.loads(tool.main(["--smoke", "--workers", "0", "--out-dir", str(tmp_path), "--long"]).read_text())
    chosen = {row["arm"]: row["lr"] for row in short["curves"]["summary"]}
    for row in long["curves"]["summary"]:
        assert row["lrs_tried"] == [chosen[row["arm"]] / 2, chosen[row["arm"]]] and row["runs"] == 2
    assert long["steps"]["per_run"] > short["steps"]["per_run"]
