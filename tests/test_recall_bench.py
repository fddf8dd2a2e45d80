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
from tfm_course.experiments.generation import generation_profile, scan_timings
from tfm_course.experiments.recall import RecallResult, recall_accuracy, train_recall
from tfm_course.models.mixer_lm import MixerLM

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
               "--steps", "2", "--vocab-size", "16", "--d-model", "16", "--out", str(tmp_path),
               "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "command: python tools/runs/bench_recall.py --settings 12:2,15:3" in printed and "machine: cpu" in printed
    report = json.loads((tmp_path / "bench_recall.json").read_text())
    assert len(report["records"]) == 2 * 2 * 2 and report["machine"].startswith("cpu")
    assert "1 thread per run" in report["machine"]  # the threads the runs used, not the notebook's
    summary = report["summary"]
    assert [(r["mixer"], r["seq_len"], r["seeds"]) for r in summary] == [
        ("attention", 12, 2), ("hybrid", 12, 2), ("attention", 15, 2), ("hybrid", 15, 2)]
    table = (tmp_path / "bench_recall.md").read_text()
    assert "| hybrid | 15 | 3 |" in table and "state bytes" in table and "CPU seconds" in table
    assert all(0 < r["cpu_seconds"] for r in report["records"])
    assert (tmp_path / "bench_recall.png").stat().st_size > 10_000


def test_bench_recall_defaults_follow_the_device():
    tool = _load_tool()
    quick = tool.parse_args(["--quick", "--device", "cpu"])
    assert quick.setting_list == [(64, 4)] and quick.seeds == 1
    full = tool.parse_args(["--device", "cpu"])
    assert full.setting_list == [(64, 4), (128, 8), (256, 16)] and full.workers == 1
    with pytest.raises(SystemExit):
        tool.parse_args(["--mixers", "attention,lstm", "--device", "cpu"])
