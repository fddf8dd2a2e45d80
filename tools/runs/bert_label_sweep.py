"""What pretraining buys, by label count: chapter 7's fine-tuning from several starts, stored.

    python tools/runs/bert_label_sweep.py                       # the stored CPU sweep (~20 min, 2 workers)
    python tools/runs/bert_label_sweep.py --smoke --out-dir /tmp/x   # seconds: what the tests run
    python tools/runs/bert_label_sweep.py --task order          # "in order or shuffled?" (~15 min)
    python tools/runs/bert_label_sweep.py --task order --widen  # the stored sweep, its grid widened where a
                                                                # chosen rate sits at an edge of the rates tried

Tasks: ``kind`` ("class or function?", :func:`bert_recipe.task_data`) and ``order`` (the same
docstrings, half of them with their tokens shuffled, :mod:`tfm_course.experiments.order_task`:
a bag of tokens is at chance by construction). Each has its own stored sweep
(``bert_label_sweep_<size>`` and ``bert_order_sweep_<size>``) and its own baselines.

Starts: ``scratch`` (a random encoder), ``short`` (the page's 500-step checkpoint), ``long`` (3,000
steps), ``longer`` (15,000 steps, past the two-sided bigram), and at a few label counts ``long,
seed 1`` (the second pretraining seed), ``always [MASK]`` (3,000 steps without the 80/10/10 rule) and
``scratch, 4x steps`` / ``longer, 4x steps`` (fine-tuned four times longer) — read from the stored
pretraining runs of ``tools/runs/bert_pretraining.py``. For every start, label count N (stratified subsets of the
training split) and seed (which sets the subset, the head's initialisation and the batch order),
the encoder is fine-tuned at each learning rate of a grid; a rate is *chosen* per start and N by
the mean balanced accuracy on the dev split (training modules held out from fine-tuning), and the
grid is widened whenever the chosen rate sits at its edge. The reported number is the balanced
accuracy on the corpus's validation split at the chosen rate. Each worker uses one CPU thread.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import shlex
import statistics
import sys
from pathlib import Path


from tfm_course.device import get_device
from tfm_course.experiments import bert_recipe as R
from tfm_course.experiments import order_task
from tfm_course.experiments import stored_runs
from tfm_course.models.bert import BertForPreTraining

LADDER = [3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]  # the grid can widen along this ladder
GRID = [3e-4, 1e-3, 3e-3]
LABELS = [16, 32, 64, 128, 256, 512, 1024, None]  # None: every training example
STARTS = {"scratch": None, "short": ("bert_mlm_short", "seed0"), "long": ("bert_mlm_long", "seed0"),
          "long, seed 1": ("bert_mlm_long", "seed1"), "always [MASK]": ("bert_mlm_all_mask", "seed0"),
          "always [MASK], lr 1e-3": ("bert_mlm_all_mask_lr0.001", "seed0"),
          "longer": ("bert_mlm_longer", "seed0"),
          "scratch, 4x steps": None, "longer, 4x steps": ("bert_mlm_longer", "seed0")}
STEPS_FACTOR = {"scratch, 4x steps": 4, "longer, 4x steps": 4}  # fine-tuned 4x longer: labels or steps?
FEW_LABELS = [32, 256, None]  # where the other starts run
FULL_STARTS = ("scratch", "short", "long", "longer")  # at every label count

_STATE: dict = {}


NAMES = {"kind": "bert_label_sweep", "order": "bert_order_sweep"}


def _init(size: str, smoke: bool, folder: str | None, steps: int, starts: list[str], task: str = "kind") -> None:
    """Load the data and the pretrained encoders once per worker (fine_tune runs on one thread)."""
    sizes = R.SIZES[size]
    data = R.mlm_data(sizes)
    examples = R.task_data(data)
    if task == "order":
        examples = order_task.shuffled_task(examples, data)
    encoders = {}
    for start, source in STARTS.items():
        if source is None or start not in starts:
            continue
        name = f"{source[0]}_{size}" + ("_smoke" if smoke else "")
        run = stored_runs.load_run(name, folder and Path(folder))
        model = BertForPreTraining(R.model_config(data, sizes))
        model.load_state_dict(stored_runs.load_checkpoint(run, source[1], folder and Path(folder)))
        encoders[start] = model.bert
    _STATE.update(sizes=sizes, data=data, task=examples, task_name=task, encoders=encoders, steps=steps)


def _one(job: tuple[str, int | None, float, int]) -> dict:
    start, n, lr, seed = job
    sizes, data, task = _STATE["sizes"], _STATE["data"], _STATE["task"]
    encoder = _STATE["encoders"].get(start)
    if encoder is None:  # from scratch: a random encoder, drawn with the seed
        encoder = R.fresh_bert(data, sizes, 1000 + seed)
    subset = R.stratified_subset(task.train.y, n, seed)
    steps = _STATE["steps"] * STEPS_FACTOR.get(start, 1)
    result = R.fine_tune(encoder, task, sizes, lr=lr, seed=seed, subset=subset, steps=steps)
    return {"start": start, "labels": result["n_train"], "lr": lr, "seed": seed,
            "dev": result["dev"]["balanced"], "validation": result["validation"]["balanced"],
            "validation_accuracy": result["validation"]["accuracy"]}


def choose(records: list[dict], start: str, n: int) -> tuple[float, dict[float, float]]:
    """The rate with the best mean dev score for (start, n), and every rate's mean dev score."""
    dev: dict[float, list[float]] = {}
    for r in records:
        if r["start"] == start and r["labels"] == n:
            dev.setdefault(r["lr"], []).append(r["dev"])
    means = {lr: statistics.mean(v) for lr, v in dev.items()}
    return max(means, key=means.get), means


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--size", choices=sorted(R.SIZES), default=None)
    parser.add_argument("--task", choices=sorted(NAMES), default="kind")
    parser.add_argument("--workers", type=int, default=2, help="processes; 0: this one")
    parser.add_argument("--starts", nargs="+", choices=sorted(STARTS), default=list(STARTS))
    parser.add_argument("--merge", action="store_true",
                        help="keep the stored sweep's records of the other starts, replace these starts'")
    parser.add_argument("--widen", action="store_true",
                        help="keep the stored sweep's records and widen its grid (along LADDER) wherever the chosen "
                             "rate sits at an edge of the rates tried")
    parser.add_argument("--smoke", action="store_true", help="16 labels, four steps, the first grid only")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="default: tfm_course/results (also where --smoke reads its pretraining runs)")
    args = parser.parse_args(argv)
    device = get_device()
    size = args.size or ("cpu" if device.type == "cpu" else "gpu")
    name = f"{NAMES[args.task]}_{size}" + ("_smoke" if args.smoke else "")
    command = "python tools/runs/bert_label_sweep.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = stored_runs.new_run(name, command, args.seeds, device, size=size, task=args.task, grid=GRID, ladder=LADDER,
                              starts={k: v and list(v) for k, v in STARTS.items()})
    labels = [16] if args.smoke else LABELS
    few = [16] if args.smoke else FEW_LABELS
    folder = str(args.out_dir) if args.smoke else None
    ft_steps = 4 if args.smoke else R.SIZES[size]["ft_steps"]
    init = (size, args.smoke, folder, ft_steps, args.starts, args.task)
    out = args.out_dir or stored_runs.RESULTS_DIR
    if args.merge and args.widen:
        raise ValueError("--merge and --widen do not go together: widen the merged sweep in a second run")
    kept: list[dict] = []
    previous: dict | None = None
    if args.merge or args.widen:
        previous = stored_runs.load_run(name, out)
        run["merged_from"] = {k: previous.get(k) for k in ("command", "commit", "date", "cpu_seconds",
                                                           "wall_seconds", "cpu_seconds_note", "merged_from")}
    if args.merge:
        kept = [r for r in previous["curves"]["records"] if r["start"] not in args.starts]
    if args.workers == 0:  # in this process (the tests' smoke run)
        _init(*init)
    with (mp.get_context("spawn").Pool(args.workers, _init, init) if args.workers else _InProcess()) as pool:
        n_all = pool.apply(_n_all)
        counts = {n: (n_all if n is None else n) for n in labels}
        if args.widen:  # the stored records, and the cells whose chosen rate sits at an edge
            records = list(previous["curves"]["records"])
            plan = {(row["start"], row["labels"]) for row in previous["curves"]["summary"] if row["lr"] is not None}
            todo = widen(records, plan)
        else:
            plan = {(s, counts[n]) for s in args.starts for n in labels if s in FULL_STARTS or n in few}
            todo = {(s, n): list(GRID) for s, n in plan}
            records = []
        while todo:
            jobs = [(s, None if n == n_all else n, lr, seed) for (s, n), lrs in sorted(todo.items(), key=str)
                    for lr in lrs for seed in args.seeds]
            for r in pool.imap_unordered(_one, jobs):
                records.append(r)
                print(r, flush=True)
            todo = {} if args.smoke else widen(records, plan)
        if not (args.merge or args.widen):
            for n in labels:  # the baselines, on the same subsets
                for seed in args.seeds:
                    records.extend(pool.apply(_baselines, (n, seed)))
    records += kept
    plan |= {(r["start"], r["labels"]) for r in kept if r["start"] in STARTS}
    summary = [_row(records, s, n, None, None, False) for s in BASELINES[args.task] for n in sorted(counts.values())]
    for s, n in sorted(plan, key=lambda k: (list(STARTS).index(k[0]), k[1])):
        best, means = choose(records, s, n)
        summary.append(_row(records, s, n, best, means[best], best in (min(means), max(means))))
    run["curves"] = {"summary": summary, "records": records}
    stored_runs.finish_run(run)  # this process; the workers' CPU time is added below (reaped children)
    run["cpu_seconds"] += resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime + \
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    run["steps"] = {"fine_tuning": ft_steps} | {f"fine_tuning, {s}": ft_steps * f for s, f in STEPS_FACTOR.items()
                                                if any(r["start"] == s for r in records)}
    run["tokens_seen"] = {f"{k}_per_run": v * R.SIZES[size]["ft_batch"] * R.SIZES[size]["length"]
                          for k, v in run["steps"].items()}
    run["settings"]["n_all"] = n_all
    path = stored_runs.write_run(run, folder=out)
    print(f"wrote {path}")
    return path


def widen(records: list[dict], plan: set[tuple[str, int]]) -> dict[tuple[str, int], list[float]]:
    """The rates still to try: the ladder's neighbours of each cell's chosen rate that it has not tried."""
    todo: dict[tuple[str, int], list[float]] = {}
    for s, n in plan:
        best, means = choose(records, s, n)
        i = LADDER.index(best)
        for j in (i - 1, i + 1):
            if 0 <= j < len(LADDER) and LADDER[j] not in means:
                todo.setdefault((s, n), []).append(LADDER[j])
    return todo


def _row(records: list[dict], start: str, n: int, lr: float | None, dev: float | None, at_edge: bool) -> dict:
    """The summary of one (start, label count): validation mean, std, range at the chosen rate."""
    chosen = [r["validation"] for r in records if r["start"] == start and r["labels"] == n and r["lr"] == lr]
    return {"start": start, "labels": n, "lr": lr, "dev": dev, "at_edge": at_edge,
            "mean": statistics.mean(chosen), "std": statistics.stdev(chosen) if len(chosen) > 1 else 0.0,
            "min": min(chosen), "max": max(chosen), "runs": len(chosen)}


BASELINES = {"kind": ("majority", "first-word rule", "bag of tokens"),
             "order": ("majority", "bag of tokens", "bigram rule")}


def _baselines(n: int | None, seed: int) -> list[dict]:
    task, data = _STATE["task"], _STATE["data"]
    subset = R.stratified_subset(task.train.y, n, seed)
    if _STATE["task_name"] == "order":
        if "bigram" not in _STATE:
            _STATE["bigram"] = order_task.KneserNey(2, data.vocab_size).fit(data.train_rows.cpu())
        scores = order_task.order_baselines(task, data, subset, _STATE["bigram"])
    else:
        scores = R.baseline_scores(task, data.vocab_size, subset)
    return [{"start": name, "labels": len(subset), "lr": None, "seed": seed, "dev": v["dev"],
             "validation": v["validation"]} for name, v in scores.items()]


class _InProcess:
    """The two Pool methods used above, run in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def apply(self, fn, args=()):
        return fn(*args)

    def imap_unordered(self, fn, jobs):
        return map(fn, jobs)


def _n_all() -> int:
    return len(_STATE["task"].train.y)


if __name__ == "__main__":
    main()
