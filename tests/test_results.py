"""tfm_course.results: stored benchmark runs load, name their command and machine, and are shipped."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tfm_course.models.mixer_lm import MIXERS
from tfm_course.results import available, load_result

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["bench_recall_cpu", "bench_recall_cpu_64"])
def test_stored_recall_benchmark_is_complete(name):
    assert name in available()
    report = load_result(name)
    # the command as it was run: runs stored before the tool moved to tools/runs/ name its old path
    assert report["command"].startswith(("python tools/runs/bench_recall.py", "python tools/bench_recall.py"))
    assert (ROOT / "tools" / "runs" / "bench_recall.py").is_file()
    assert "thread" in report["machine"] and "torch" in report["machine"]
    assert report["records"] and report["summary"]
    for row in report["summary"]:
        assert row["mixer"] in MIXERS
        assert 0.0 <= row["accuracy_min"] <= row["accuracy"] <= row["accuracy_max"] <= 1.0
        assert row["parameters"] > 0 and row["state_bytes"] > 0 and row["steps"] >= 1
    runs = {(r["mixer"], r["seq_len"], r["n_pairs"], r["seed"]) for r in report["records"]}
    assert len(runs) == len(report["records"])  # one record per run


def test_unknown_result_names_the_available_ones():
    with pytest.raises(ValueError, match="bench_recall_cpu"):
        load_result("no such result")


def test_results_are_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "*.json" in config["tool"]["setuptools"]["package-data"]["tfm_course.results"]
