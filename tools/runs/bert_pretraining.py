"""Stored pretraining runs of chapter 7's BERT (tfm_course.experiments.bert_recipe), with checkpoints.

    python tools/runs/bert_pretraining.py --run short              # the page's 500 steps, seed 0
    python tools/runs/bert_pretraining.py --run long --seeds 0 1   # 3,000 steps, two seeds
    python tools/runs/bert_pretraining.py --run all_mask           # 3,000 steps, always [MASK]
    python tools/runs/bert_pretraining.py --run all_mask --lr 1e-3 # the same at another peak rate
    python tools/runs/bert_pretraining.py --run longer             # 15,000 steps, seed 0
    python tools/runs/bert_pretraining.py --run long --size gpu    # the GPU sizes, on a GPU
    python tools/runs/bert_pretraining.py --smoke --out-dir /tmp/x # seconds: what the tests run

Writes ``tfm_course/results/bert_mlm_<run>_<size>.json`` (command, commit, machine, seeds, steps,
tokens, CPU and wall seconds, validation curves, corpus fingerprint) and one checkpoint per seed
beside it (``...-seed<k>.pt``: the BertForPreTraining state dict in fp32, read back with
``torch.load(weights_only=True)``; fp32 because each is only about 0.7 MB, and fp32 lets the tests and the
page reproduce the stored metrics exactly). On the CPU each run uses one thread. CPU time of a 3,000-step
run: about four to five minutes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from tfm_course.device import get_device
from tfm_course.experiments import bert_recipe as R
from tfm_course.experiments import stored_runs

# steps as multiples of the size's own ("short") run: 500 / 3,000 on the CPU, 6,000 / 36,000 on a GPU
RUNS = {"short": dict(times=1, all_mask=False), "long": dict(times=6, all_mask=False),
        "all_mask": dict(times=6, all_mask=True),
        "longer": dict(times=30, all_mask=False)}  # 15,000 steps: past the two-sided bigram?


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", choices=sorted(RUNS), default="short")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--size", choices=sorted(R.SIZES), default=None,
                        help="default: gpu on an accelerator, cpu otherwise")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the size's)")
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check the tool runs")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: tfm_course/results")
    args = parser.parse_args(argv)
    device = get_device()
    size = args.size or ("cpu" if device.type == "cpu" else "gpu")
    sizes = dict(R.SIZES[size], **({"lr": args.lr} if args.lr else {}))
    steps = 6 if args.smoke else RUNS[args.run]["times"] * sizes["steps"]
    name = (f"bert_mlm_{args.run}" + (f"_lr{args.lr:g}" if args.lr else "") + f"_{size}"
            + ("_smoke" if args.smoke else ""))
    command = "python tools/runs/bert_pretraining.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = stored_runs.new_run(name, command, args.seeds, device, size=size, sizes=sizes,
                              all_mask=RUNS[args.run]["all_mask"])
    data = R.mlm_data(sizes, device)
    run["settings"].update(train_rows=len(data.train_rows), valid_positions=int((data.valid_labels >= 0).sum()))
    out = args.out_dir or stored_runs.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        model, history = R.pretrain(data, sizes, steps=steps, seed=seed, all_mask=RUNS[args.run]["all_mask"],
                                    evaluations=2 if args.smoke else 30, desc=f"{args.run}, seed {seed}")
        key = f"seed{seed}"
        run["steps"][key] = steps
        run["tokens_seen"][key] = steps * sizes["batch"] * sizes["length"]
        run["curves"][key] = {name: [[s + 1, v] for s, v in values] for name, values in history.metrics.items()}
        every = max(1, steps // 100)  # the training loss, averaged over windows of `every` steps
        run["curves"][key]["train_loss"] = [
            [i + every, sum(history.loss[i:i + every]) / len(history.loss[i:i + every])]
            for i in range(0, steps, every)]
        run["curves"][key]["seconds"] = history.seconds
        run["checkpoints"][key] = stored_runs.save_checkpoint(model.state_dict(), f"{name}-{key}", folder=out)
        print(f"{name} {key}: final validation {R.mlm_metrics(model, data)}", flush=True)
    path = stored_runs.write_run(run, folder=out)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
