"""Measure softmax attention against its efficient variants as the sequence length doubles.

    python tools/bench/bench_efficient.py --out bench_efficient.md
    python tools/bench/bench_efficient.py --quick        # CI size: n = 128..1024, about a minute on a CPU
    python tools/bench/bench_efficient.py --quality 5    # accuracy after 5 s of training per method

Every method gets the same per-head width: (batch, heads, n, d_head) queries, keys and values for
the attention-like ones, and d_inner = heads · d_head channels with N = 16 states for Mamba's scan.
The numbers are the token-mixing operation alone (no projections, no feed-forward). Cells whose
extrapolated time or memory exceeds the caps are skipped and reported as such. Not run by the
tests (they only smoke-test the functions at tiny sizes).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tfm_course.device import describe, get_device  # noqa: E402
from tfm_course.efficient.cases import Case, attention_cases  # noqa: E402
from tfm_course.experiments.equal_time import QualityResult, quality_at_equal_time, quality_table  # noqa: E402
from tfm_course.experiments.scaling import crossover_table, metric_table, sweep  # noqa: E402

QUICK = dict(lengths=[128, 256, 512, 1024], repeats=2, time_cap=1.0, memory_cap=5e8)
QUALITY_KINDS = ("softmax", "softmax-naive", "window", "linformer", "performer")

BASELINES = ("softmax (naive)", "SDPA (fused)")


def build_cases(batch: int = 1, heads: int = 4, d_head: int = 32,
                device: torch.device | str = "cpu", num_features: int = 128, linformer_k: int = 128,
                chunk_size: int = 64, d_state: int = 16) -> dict[str, Case]:
    """name → make(n) → run(): :func:`tfm_course.efficient.cases.attention_cases`."""
    return attention_cases(batch, heads, d_head, device, num_features, linformer_k, chunk_size,
                           d_state)


# --------------------------------------------------------------------------- report
def _fmt_time(s: float | None) -> str:
    return "—" if s is None else (f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}")


def _fmt_bytes(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**20:.1f}"


def _fmt_flops(f: float | None) -> str:
    return "—" if f is None else f"{f / 1e9:.3g}"


def report(rows: list[dict], settings: str) -> str:
    memory_kind = rows[0]["memory_kind"] if rows else "live_tensors"
    if memory_kind == "cuda_peak":
        peak_title = "Forward peak memory, MiB (torch.cuda.max_memory_allocated)"
    else:
        peak_title = "Forward peak memory, MiB (peak bytes of live tensors, bench.peak_tensor_bytes)"
    parts = [
        "# Efficient attention variants: time and memory vs sequence length", "", settings, "",
        metric_table(rows, "fwd_s", _fmt_time, "Forward time, ms (no grad)"), "",
        metric_table(rows, "train_s", _fmt_time, "Forward + backward time, ms"), "",
        metric_table(rows, "peak_bytes", _fmt_bytes, peak_title), "",
        metric_table(rows, "saved_bytes", _fmt_bytes,
                     "Activation memory saved for backward, MiB (bench.saved_tensor_bytes)"), "",
        metric_table(rows, "flops", _fmt_flops,
                     "Forward matmul GFLOP (bench.count_flops; element-wise work such as the Mamba "
                     "scan counts 0)"), "",
        crossover_table(rows, "fwd_s", BASELINES, "Crossover length, forward time"), "",
        crossover_table(rows, "train_s", BASELINES, "Crossover length, forward + backward time"), "",
        crossover_table(rows, "peak_bytes", BASELINES, "Crossover length, forward peak memory"), "",
        "Slopes are least-squares fits of log(cost) on log(n) over the measured lengths "
        "(2 = quadratic, 1 = linear); small lengths are dominated by fixed per-call overhead, "
        "which pulls slopes below their asymptotic value. A crossover is where the method becomes and "
        "stays cheaper than the baseline, interpolated on log–log axes.",
    ]
    return "\n".join(parts) + "\n"


def run_quality(seconds: float, seeds: list[int], length: int, device: torch.device,
                out: Path | None) -> list[QualityResult]:
    start = time.perf_counter()
    results = []
    for kind in QUALITY_KINDS:
        for r in quality_at_equal_time([kind], seconds, seeds, length=length, device=device):
            print(f"{r.attention:>14} seed {r.seed}: {r.steps:5d} steps, {r.step_ms:6.1f} ms/step,"
                  f" accuracy {r.accuracy:.3f}  [{time.perf_counter() - start:.0f} s]", flush=True)
            results.append(r)
    text = (f"# Quality at equal training time\n\nScattered recall, n = {length}, "
            f"a budget of {seconds:g} s of training per run on {describe(device)} (steps = budget / "
            f"fastest measured step); accuracy on 256 held-out examples (chance 1/16). "
            f"Took {time.perf_counter() - start:.0f} s.\n\n"
            + quality_table(results) + "\n")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    else:
        print(text)
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=32)
    parser.add_argument("--device", default=None, help="default: tfm_course.device.get_device()")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-cap", type=float, default=10.0, help="seconds per forward+backward")
    parser.add_argument("--memory-cap", type=float, default=2.5e9,
                        help="bytes (forward peak or saved activations)")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write")
    parser.add_argument("--only", nargs="*", default=None, help="substrings of method names to run")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--note", default="", help="a sentence added under the settings")
    parser.add_argument("--quick", action="store_true",
                        help=f"CI size: {QUICK} (overrides those options)")
    parser.add_argument("--quality", type=float, default=None, metavar="SECONDS",
                        help="instead of the sweep: train each attention for SECONDS on scattered "
                             "recall and report held-out accuracy")
    parser.add_argument("--quality-length", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.lengths, args.repeats = QUICK["lengths"], QUICK["repeats"]
        args.time_cap, args.memory_cap = QUICK["time_cap"], QUICK["memory_cap"]

    device = torch.device(args.device) if args.device else get_device()
    if args.quality is not None:
        results = run_quality(args.quality, args.seeds, args.quality_length, device, args.out)
        return [r.as_dict() for r in results]
    cases = build_cases(args.batch, args.heads, args.d_head, device)
    if args.only:
        cases = {k: v for k, v in cases.items() if any(s.lower() in k.lower() for s in args.only)}
    start = time.perf_counter()

    def show(row: dict) -> None:
        print(f"{row['method']:>28} n={row['n']:>6}  fwd {_fmt_time(row['fwd_s']):>8} ms  "
              f"train {_fmt_time(row['train_s']):>8} ms  "
              f"peak {_fmt_bytes(row['peak_bytes']):>8} MiB  "
              f"{row['skipped'] or ''}  [{time.perf_counter() - start:.0f} s]", flush=True)

    rows = sweep(cases, args.lengths, repeats=args.repeats, time_cap_s=args.time_cap,
                 memory_cap_bytes=args.memory_cap, device=device, progress=show,
                 cell_budget_s=0.5 if args.quick else 3.0)
    elapsed = time.perf_counter() - start
    cpu = platform.processor() or platform.machine()
    settings = (f"Device: {describe(device)}; torch {torch.__version__}; {cpu}. "
                f"batch {args.batch}, heads {args.heads}, d_head {args.d_head} (Mamba: d_inner "
                f"{args.heads * args.d_head}, N 16); fp32; median of up to {args.repeats} runs. Caps: "
                f"{args.time_cap:g} s per forward+backward, {args.memory_cap / 1e9:g} GB (extrapolated "
                f"from the two previous lengths). Sweep took {elapsed:.0f} s.")
    text = report(rows, settings + (f"\n\n{args.note}" if args.note else ""))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return rows


if __name__ == "__main__":
    main()
