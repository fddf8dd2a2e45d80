"""tfm_course.experiments.t5_report: reading chapter 9's stored run."""

from __future__ import annotations

import pytest

from tfm_course.experiments.t5_report import crossed_table, final, run_key, seed_curves, transfer_results

METRICS = ("valid loss", "blank gap", "next token loss", "next token accuracy", "infill loss", "infill accuracy")


def fake_run():
    run = {"seeds": [0, 1], "best_lr": {"causal LM": 0.004, "span corruption": 0.002}, "curves": {}, "final": {},
           "settings": {"ablations": {"span corruption, 50 % noise": {}}},
           "references": {k: {"loss": 5.0, "accuracy": 0.1} for k in
                          ("next token: unigram", "next token: KN bigram", "next token: KN 4-gram",
                           "infill: KN two-sided bigram")},
           "fine_tune_lr": {"scratch": 1e-3},
           "transfer": [{"arm": "scratch", "lr": 1e-3, "n_labels": 32, "validation": {"accuracy": 0.6}, "ladder": True},
                        {"arm": "scratch", "lr": 3e-3, "n_labels": 32, "validation": {"accuracy": 0.9}, "ladder": True},
                        {"arm": "scratch", "lr": 1e-3, "n_labels": 32, "validation": {"accuracy": 0.7}},
                        {"arm": "scratch", "lr": 1e-3, "n_labels": 100, "validation": {"accuracy": 0.8}}],
           "baselines": [{"n_labels": None, "majority": 0.5, "first-word rule": 0.7, "bag of tokens": 0.75}]}
    for arm in ("causal LM", "span corruption"):
        for seed in (0, 1):
            key = run_key(run, arm, seed)
            run["curves"][key] = {m: [[10, seed + 1.0], [20, seed + 2.0]] for m in METRICS}
            run["final"][key] = {m: seed + 2.0 for m in METRICS}
    run["final"]["span corruption, 50 % noise|lr=0.002|seed=0"] = {m: 9.0 for m in METRICS}
    return run


def test_curves_and_finals_are_over_the_seeds_at_the_best_rate():
    run = fake_run()
    steps, values = seed_curves(run, "causal LM", "blank gap")
    assert steps == [10, 20] and values.tolist() == [[1.0, 2.0], [2.0, 3.0]]
    assert final(run, "causal LM", "infill loss") == pytest.approx((2.5, 0.7071067811865476))
    with pytest.raises(ValueError, match="metric must be one of"):
        seed_curves(run, "causal LM", "perplexity")


def test_the_table_has_the_models_the_counts_and_the_ablations():
    table = crossed_table(fake_run(), ["causal LM", "span corruption"], extra=[("longer", {m: 7.0 for m in METRICS})])
    lines = table.splitlines()
    assert len(lines) == 2 + 2 + 3 + 1 + 3 + 1 + 1  # header, objectives, counts, random start, kind baselines, ...
    assert "2.50 ± 0.71" in lines[2] and "counts: unigram" in table and "9.00" in table and "7.00" in lines[-1]


def test_the_table_crosses_the_objectives_with_the_kind_task():
    """The third task's columns: fine-tuned accuracy at the chosen rate (mean ± sd), the random start,
    the baselines on the same labels, and a longer run's own transfer records."""
    run = fake_run()
    run["transfer"] += [{"arm": "causal LM", "lr": 1e-3, "n_labels": n, "validation": {"accuracy": a}}
                        for n, a in ((32, 0.5), (32, 0.7), (100, 0.9))]
    run["fine_tune_lr"]["causal LM"] = 1e-3
    longer = [{"n_labels": 32, "validation": {"accuracy": 0.8}}, {"n_labels": 100, "validation": {"accuracy": 0.95}}]
    table = crossed_table(run, ["causal LM", "span corruption"], extra=[("longer", {m: 7.0 for m in METRICS}, longer)])
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines()[2:]}
    header = table.splitlines()[0]
    assert header.endswith("| kind, 32 labels | kind, all labels |")
    assert rows["causal LM"][-2:] == ["0.600 ± 0.141", "0.900 ± 0.000 |"]
    assert rows["span corruption"][-2:] == ["", " |"]  # no transfer stored for it: empty, not zero
    assert rows["random start, fine-tuned"][-2:] == ["0.650 ± 0.071", "0.800 ± 0.000 |"]  # the chosen rate only
    assert rows["kind: bag of tokens"][-1] == "0.750 ± 0.000 |"  # "all labels" (n_labels None) mapped to 100
    assert rows["longer"][-2:] == ["0.800 ± 0.000", "0.950 ± 0.000 |"]


def test_transfer_keeps_only_the_chosen_rate_and_maps_all_labels():
    starts, base = transfer_results(fake_run())
    assert starts == {"scratch": {32: [0.6, 0.7], 100: [0.8]}}
    assert base["bag of tokens"] == {100: [0.75]}
