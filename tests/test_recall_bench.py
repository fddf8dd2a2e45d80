"""tfm_course.experiments.recall, tfm_course.experiments.generation and tools/runs/bench_recall.py at tiny sizes."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tfm_course.data.recall import FILLER, IGNORE, multi_query_recall
from tfm_course.experiments import stored_runs
from tfm_course.experiments.generation import generation_profile, scan_timings
from tfm_course.experiments.recall import (RecallResult, no_decay_parameters, recall_accuracy,
                                           steps_to, train_recall)
from tfm_course.models.mixer_lm import MixerLM
from tfm_course.train import weight_decay_groups

ROOT = Path(__file__).resolve().parent.parent


class Oracle(nn.Module):
    """Looks each queried key up in the context: the answer MQAR asks for, as one-hot logits."""

    def __init__(self, vocab_size: int, n_pairs: int, wrong: bool = False) -> None:
        super().__init__()
        self.vocab_size, self.n_pairs, self.wrong = vocab_size, n_pairs, wrong

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*inputs.shape, self.vocab_size)
        context = 2 * self.n_pairs
        for row, tokens in enumerate(inputs.tolist()):
            value_of = dict(zip(tokens[0:context:2], tokens[1:context:2]))
            for t in range(context, len(tokens)):
                if tokens[t] != FILLER:
                    answer = value_of[tokens[t]]
                    logits[row, t, answer - 1 if self.wrong else answer] = 1.0
        return logits


def test_recall_accuracy_of_an_oracle_and_of_a_wrong_oracle():
    inputs, labels = multi_query_recall(20, 32, 16, 3, torch.Generator().manual_seed(0))
    assert recall_accuracy(Oracle(32, 3), inputs, labels, batch_size=7) == 1.0
    assert recall_accuracy(Oracle(32, 3, wrong=True), inputs, labels) == 0.0
    half = labels.clone()
    half[:10] = IGNORE  # only the second half counts
    assert recall_accuracy(Oracle(32, 3), inputs, half) == 1.0
    with pytest.raises(ValueError, match="must match"):
        recall_accuracy(Oracle(32, 3), inputs, labels[:, :5])


def test_train_recall_reports_what_it_trained():
    result = train_recall("retnet", 12, 2, vocab_size=16, d_model=16, steps=4, batch_size=8,
                          n_test=16, eval_every=2, target=None, device="cpu")
    assert isinstance(result, RecallResult) and result.steps == 4
    model = MixerLM(16, "retnet", d_model=16)
    assert result.parameters == model.num_parameters()
    assert result.state_bytes == model.state_bytes(12)
    assert 0.0 <= result.accuracy <= 1.0 and result.seconds > 0 and result.cpu_seconds > 0
    assert [step for step, _ in result.curve] == [2, 4]
    assert result.as_dict()["mixer"] == "retnet"
    early = train_recall("attention", 12, 2, vocab_size=16, d_model=16, steps=50, batch_size=8,
                         n_test=16, eval_every=5, target=0.0, device="cpu")
    assert early.steps == 5  # the (trivial) target is met at the first evaluation
    assert result.steps_to_50 == steps_to(result.curve, 0.5)
    assert result.steps_to_90 == steps_to(result.curve, 0.9)
    assert (result.d_model, result.vocab_size, result.lr, result.short_conv) == (16, 16, 3e-3, 0)


def test_steps_to_is_the_first_evaluation_at_the_level():
    curve = [(50, 0.2), (100, 0.55), (150, 0.5), (200, 0.93)]
    assert steps_to(curve, 0.5) == 100 and steps_to(curve, 0.9) == 200
    assert steps_to(curve, 0.95) is None and steps_to([], 0.5) is None


def test_train_recall_with_a_short_conv_trains_that_model():
    result = train_recall("retnet", 12, 2, vocab_size=16, d_model=16, steps=2, batch_size=8,
                          n_test=16, target=None, short_conv=4, device="cpu")
    with_conv = MixerLM(16, "retnet", d_model=16, short_conv=4)
    assert result.short_conv == 4 and result.parameters == with_conv.num_parameters()
    assert result.state_bytes == with_conv.state_bytes(12) > MixerLM(16, "retnet", d_model=16).state_bytes(12)


def test_no_decay_parameters_are_mambas_flags_norms_biases_and_embeddings():
    model = MixerLM(16, "hybrid", d_model=16)
    names = {name for name, p in model.named_parameters()
             if any(p is q for q in no_decay_parameters(model))}
    mamba = "layers.0.mixer."
    assert {"embed.weight", "norm.weight", mamba + "A_log", mamba + "D", mamba + "conv1d.bias",
            mamba + "dt_proj.bias", "layers.0.norm1.weight", "layers.1.ffn.linear1.bias"} <= names
    assert not names & {"head.weight", mamba + "in_proj.weight", mamba + "conv1d.weight",
                        "layers.1.mixer.attn.q_proj.weight", "layers.0.ffn.linear1.weight"}
    decay, rest = weight_decay_groups(model, 0.1, no_decay_parameters(model))
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))
    assert not {id(p) for p in decay["params"]} & {id(p) for p in no_decay_parameters(model)}
    assert (decay["weight_decay"], rest["weight_decay"]) == (0.1, 0.0)
    # without the list: nanoGPT's rule, 2-D A_log and the embedding decayed
    plain, _ = weight_decay_groups(model, 0.1)
    assert any(p is model.embed.weight for p in plain["params"])


def test_decoupled_decay_shrinks_only_the_decayed_group():
    """With zero gradients AdamW's step is the decay alone: p ← p (1 − lr · wd) in its group."""
    torch.manual_seed(0)
    model = MixerLM(16, "mamba", d_model=16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(weight_decay_groups(model, 0.5, no_decay_parameters(model)), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    torch.testing.assert_close(after["head.weight"], before["head.weight"] * 0.95)
    for name in ("embed.weight", "layers.0.mixer.A_log", "layers.0.mixer.D", "norm.weight"):
        assert torch.equal(after[name], before[name]), name


def test_groups_without_decay_train_exactly_like_one_group():
    """weight_decay=0 (the default) with groups gives the same weights as AdamW(model.parameters())."""
    from tfm_course.train import train

    def run(grouped: bool) -> dict:
        torch.manual_seed(0)
        model = MixerLM(16, "mamba", d_model=16)
        params = (weight_decay_groups(model, 0.0, no_decay_parameters(model)) if grouped
                  else model.parameters())
        batches = torch.Generator().manual_seed(1)
        train(model, lambda step: multi_query_recall(8, 16, 12, 2, batches),
              lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten(),
                                                             ignore_index=IGNORE),
              steps=5, optimizer=torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0), progress=False)
        return model.state_dict()

    one, two = run(False), run(True)
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_training_learns_recall_well_above_chance():
    """An attention model learns a small MQAR: chance is 1/8 (8 possible values)."""
    result = train_recall("attention", 16, 2, vocab_size=16, d_model=32, steps=150, batch_size=32,
                          lr=3e-3, n_test=128, eval_every=50, device="cpu")
    assert result.accuracy > 0.4, result


def test_generation_profile_memory_grows_only_for_attention():
    torch.manual_seed(0)
    rows = {}
    for mixer in ("attention", "mamba"):
        model = MixerLM(20, mixer, d_model=16, num_layers=2)
        rows[mixer] = generation_profile(model, [8, 3, 16], batch=2, repeats=2)
        assert [r["context"] for r in rows[mixer]] == [3, 8, 16]
        for r in rows[mixer]:
            assert r["state_bytes"] == model.state_bytes(r["context"]) and r["s_per_token"] > 0
    assert rows["attention"][2]["state_bytes"] == 2 * rows["attention"][1]["state_bytes"]
    assert rows["mamba"][0]["state_bytes"] == rows["mamba"][2]["state_bytes"]
    median = generation_profile(model, [4], repeats=3, stat="median")
    assert median[0]["s_per_token"] > 0 and median[0]["state_bytes"] == model.state_bytes(4)
    with pytest.raises(ValueError, match="positive"):
        generation_profile(model, [0, 4])
    with pytest.raises(ValueError, match="stat"):
        generation_profile(model, [4], stat="mean")


def test_generation_profile_of_chapter_8s_gpt_with_its_kv_cache():
    from tfm_course.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=20, max_len=64, d_model=16, n_layers=2, n_heads=2))
    rows = generation_profile(gpt, [5, 20], batch=3, repeats=3)
    assert [r["context"] for r in rows] == [5, 20]
    for r in rows:
        assert r["state_bytes"] == r["context"] * gpt.kv_cache_bytes_per_token() and r["s_per_token"] > 0
    assert gpt.training  # left as it was


def test_generation_profile_reads_the_given_timer():
    """Each timed step reads the clock twice: a counter that ticks once per read gives 1 s/step,
    and a process-CPU timer (for a shared CPU) gives positive, finite step times."""
    ticks = iter(range(10_000))
    model = MixerLM(20, "retnet", d_model=16, num_layers=1)
    rows = generation_profile(model, [3, 6], repeats=4, timer=lambda: float(next(ticks)))
    assert [r["s_per_token"] for r in rows] == [1.0, 1.0]
    cpu_rows = generation_profile(model, [3], repeats=2, timer=time.process_time)
    assert 0 <= cpu_rows[0]["s_per_token"] < 1.0


def test_scan_timings_rows():
    rows = scan_timings([4, 9], batch=1, d_inner=4, d_state=2, repeats=1)
    assert [r["length"] for r in rows] == [4, 9]
    assert all(r["sequential_s"] > 0 and r["parallel_s"] > 0 for r in rows)
    forward_only = scan_timings([5], batch=1, d_inner=4, d_state=2, repeats=1, backward=False)
    assert forward_only[0]["parallel_s"] > 0


def _load_tool():
    spec = importlib.util.spec_from_file_location("bench_recall", ROOT / "tools" / "runs" / "bench_recall.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_recall_script_writes_table_json_and_figure(tmp_path, capsys):
    tool = _load_tool()
    tool.main(["--settings", "12:2,15:3", "--mixers", "attention,hybrid", "--seeds", "2",
               "--steps", "2", "--vocab-size", "16", "--d-model", "16", "--lrs", "3e-3", "--workers", "1", "--out", str(tmp_path),
               "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "command: python tools/runs/bench_recall.py --settings 12:2,15:3" in printed and "machine: cpu" in printed
    report = json.loads((tmp_path / "bench_recall.json").read_text())
    assert len(report["records"]) == 2 * 2 * 2 and report["machine_text"].startswith("cpu")
    assert "1 thread per run" in report["machine_text"]  # the threads the runs used, not the notebook's
    assert stored_runs.missing_fields(report) == []   # a stored run like every other
    assert report["machine"]["device"] == "cpu" and report["machine"]["threads"] == 1
    assert len(report["curves"]) == len(report["steps"]) == 8 and len(report["corpus"]) == 16
    assert report["name"] == "bench_recall" and report["seeds"] == [0, 1]
    summary = report["summary"]
    assert [(r["mixer"], r["seq_len"], r["seeds"]) for r in summary] == [
        ("attention", 12, 2), ("hybrid", 12, 2), ("attention", 15, 2), ("hybrid", 15, 2)]
    table = (tmp_path / "bench_recall.md").read_text()
    assert "| hybrid | 15 | 3 |" in table and "state bytes" in table and "CPU seconds" in table
    assert all(0 < r["cpu_seconds"] for r in report["records"])
    assert (tmp_path / "bench_recall.png").stat().st_size > 10_000


def test_the_data_fingerprint_changes_with_the_setting():
    tool = _load_tool()
    one = tool.data_fingerprint([(12, 2)], 16)
    assert one == tool.data_fingerprint([(12, 2)], 16) and len(one) == 16
    assert one != tool.data_fingerprint([(12, 3)], 16) != tool.data_fingerprint([(12, 2)], 32)


def test_bench_recall_defaults_follow_the_device():
    tool = _load_tool()
    quick = tool.parse_args(["--quick", "--device", "cpu"])
    assert quick.setting_list == [(64, 4)] and quick.seeds == 1
    full = tool.parse_args(["--device", "cpu"])  # the fair CPU benchmark of chapter 11
    assert full.setting_list == [(32, 4), (32, 8)] and full.workers == 2 and full.seeds >= 2
    assert full.vocab_size >= 1024 and full.tune_on_seed0 and full.weight_decay == 0.1
    assert len(full.lr_list) >= 2 and max(full.width_list) >= 8 * min(full.width_list)
    assert full.tie_embeddings and full.embed_std == 0.02  # the LM the references build
    assert "retnet+conv0" in full.mixer_list and full.conv_list == [4]
    with pytest.raises(SystemExit):
        tool.parse_args(["--mixers", "attention,lstm", "--device", "cpu"])


def test_bench_recall_smoke_sweeps_rates_widths_and_short_conv(tmp_path):
    tool = _load_tool()
    tool.main(["--smoke", "--mixers", "attention,retnet", "--lrs", "1e-3,1e-2", "--widths", "8,16",
               "--short-conv", "0,2", "--out", str(tmp_path), "--device", "cpu"])
    report = json.loads((tmp_path / "bench_recall.json").read_text())
    records = report["records"]
    # attention: 2 widths x 2 rates; RetNet: the same with and without the conv (1 seed each)
    assert len(records) == 2 * 2 + 2 * 2 * 2
    assert {r["short_conv"] for r in records if r["mixer"] == "attention"} == {0}
    assert all(r["steps"] == 2 for r in records)  # a budget in steps, no clock
    assert "time_limit_s" not in report["args"] and report["commit"] == stored_runs._commit()
    assert report["torch"] == torch.__version__ and report["device"] == "cpu"
    summary = report["summary"]
    assert len(summary) == 2 + 2 * 2 and all(r["lrs_tried"] == [1e-3, 1e-2] for r in summary)
    for row in summary:  # the best rate of its cell, among the stored rows of every rate
        cell = [r for r in report["by_lr"] if all(r[k] == row[k] for k in tool.CELL)]
        assert len(cell) == 2 and row["accuracy"] == max(r["accuracy"] for r in cell)
    state = {(r["mixer"], r["short_conv"], r["d_model"]): r["state_bytes"] for r in summary}
    assert state[("retnet", 2, 16)] - state[("retnet", 0, 16)] == 2 * 3 * 16 * 4  # 2 layers, window 1
    table = (tmp_path / "bench_recall.md").read_text()
    assert "| retnet+conv2 | 12 | 2 | 16 |" in table and "steps to 0.9" in table


def test_bench_recall_tunes_the_rate_on_seed0_then_runs_the_other_seeds_at_it(tmp_path):
    tool = _load_tool()
    tool.main(["--smoke", "--mixers", "attention,retnet+conv2", "--lrs", "1e-3,3e-2", "--seeds", "3",
               "--steps", "4", "--tune-on-seed0", "--out", str(tmp_path), "--device", "cpu"])
    report = json.loads((tmp_path / "bench_recall.json").read_text())
    records, summary = report["records"], report["summary"]
    assert len(records) == 2 * 2 + 2 * 2  # the grid at seed 0, then seeds 1 and 2 at one rate
    chosen = {(c["mixer"], c["short_conv"]): c["lr"] for c in report["chosen_lr"]}
    assert set(chosen) == {("attention", 0), ("retnet", 2)}
    for (mixer, conv), lr in chosen.items():
        mine = [r for r in records if (r["mixer"], r["short_conv"]) == (mixer, conv)]
        seed0 = {r["lr"]: r for r in mine if r["seed"] == 0}
        assert seed0[lr]["accuracy"] == max(r["accuracy"] for r in seed0.values())
        assert sorted(r["seed"] for r in mine if r["seed"] > 0) == [1, 2]
        assert all(r["lr"] == lr for r in mine if r["seed"] > 0)
        row, = (r for r in summary if (r["mixer"], r["short_conv"]) == (mixer, conv))
        assert row["lr"] == lr and row["seeds"] == 3 and row["lrs_tried"] == [1e-3, 3e-2]


def test_best_per_cell_prefers_accuracy_then_fewer_steps():
    tool = _load_tool()
    base = dict(mixer="retnet", short_conv=4, d_model=64, seq_len=64, n_pairs=4)
    rows = [dict(base, lr=1e-3, accuracy=0.6, steps=1000), dict(base, lr=3e-3, accuracy=1.0, steps=400),
            dict(base, lr=1e-2, accuracy=1.0, steps=250), dict(base, d_model=32, lr=1e-3, accuracy=0.3,
                                                              steps=1000)]
    best = tool.best_per_cell(rows)
    assert [(r["d_model"], r["lr"], r["lrs_tried"]) for r in best] == [(32, 1e-3, [1e-3]),
                                                                         (64, 1e-2, [1e-3, 3e-3, 1e-2])]


def test_bench_recall_lists_and_modes():
    tool = _load_tool()
    args = tool.parse_args(["--device", "cpu", "--lrs", "1e-3,3e-3", "--widths", "32,64",
                            "--short-conv", "4", "--mixers", "retnet,mamba"])
    assert (args.lr_list, args.width_list, args.conv_list) == ([1e-3, 3e-3], [32, 64], [4])
    jobs = tool.jobs_for(args)  # 2 settings x 2 widths x 2 rates x 2 seeds, for each mixer
    assert [j["short_conv"] for j in jobs if j["mixer"] == "mamba"] == [0] * 16
    assert [j["short_conv"] for j in jobs if j["mixer"] == "retnet"] == [4] * 16
    ablation = tool.parse_args(["--device", "cpu", "--mixers", "retnet,retnet+conv0", "--short-conv", "4"])
    assert sorted({j["short_conv"] for j in tool.jobs_for(ablation)}) == [0, 4]
    assert all("time_limit_s" not in j for j in jobs)
    smoke = tool.parse_args(["--smoke", "--device", "cpu"])
    assert smoke.setting_list == [(12, 2)] and smoke.steps == 2 and smoke.width_list == [16]
    for bad in (["--mixers", "retnet+convx"], ["--mixers", "lstm+conv4"], ["--lrs", "fast"], ["--short-conv", "-1"], ["--settings", "64"]):
        with pytest.raises(SystemExit):
            tool.parse_args(bad + ["--device", "cpu"])


def test_recall_figure_has_a_panel_per_setting_and_a_line_per_mixer():
    from tfm_course.experiments.recall_report import mixer_label, recall_against_state

    def row(mixer, conv, pairs, state, acc):
        return dict(mixer=mixer, short_conv=conv, seq_len=32, n_pairs=pairs, state_bytes=state,
                    accuracy=acc, accuracy_min=acc - 0.01, accuracy_max=acc + 0.01)

    rows = [row("attention", 0, 4, 4096, 0.9), row("attention", 0, 4, 32768, 0.95),
            row("retnet", 4, 4, 1024, 0.5), row("retnet", 0, 4, 1000, 0.2), row("retnet", 4, 8, 1024, 0.3)]
    fig = recall_against_state(rows, title="t")
    left, right = fig.axes[:2]
    assert [ax.get_title() for ax in (left, right)] == ["L = 32, 4 pairs", "L = 32, 8 pairs"]
    assert left.get_xscale() == "log"
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert legend == ["attention", "retnet+conv4", "retnet"]  # every mixer once, convs first
    assert [mixer_label(r) for r in rows[2:4]] == ["retnet+conv4", "retnet"]
    with pytest.raises(ValueError, match="at least one row"):
        recall_against_state([])


def test_stop_after_is_the_start_of_the_longer_run():
    kwargs = dict(vocab_size=16, d_model=16, steps=40, eval_every=10, target=None, seed=3, device="cpu")
    full = train_recall("retnet", 12, 2, **kwargs)
    start = train_recall("retnet", 12, 2, stop_after=20, **kwargs)
    assert start.steps == 20 and start.curve == full.curve[:2]  # the same schedule, cut short
    with pytest.raises(ValueError, match="multiple of eval_every"):
        train_recall("retnet", 12, 2, stop_after=15, **kwargs)
