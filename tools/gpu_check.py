"""Run every chapter and every GPU test on a CUDA machine, and report one table.

    python tools/gpu_check.py                      # all chapters/*.ipynb + pytest -m gpu tests/
    python tools/gpu_check.py --chapters 01 05     # chapters whose file names start so
    python tools/gpu_check.py --allow-cpu --chapters 01 --no-tests   # the same run on a CPU

Each chapter's Colab copy (``chapters/NN-slug.ipynb``, the notebook a reader opens) is executed
top to bottom by nbclient in a kernel of its own, with a time limit per chapter; then
``pytest -m gpu tests/`` runs the tests that need real CUDA hardware. The table (step, seconds,
result, first error line) is printed under the GPU's name and compute capability, and written to
``--out`` (default ``$OUT`` when set) as ``gpu_check.md`` and ``gpu_check.json``.

Exit status: 0 when every step passed, 1 when any failed or timed out, 2 when there is no CUDA
device and ``--allow-cpu`` was not given. Needs only nbclient and nbformat (installed with nbval
or Jupyter) besides the course's own environment; ``tfm_course`` is imported from this checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEVICE_PROBE = """
import json, torch
from tfm_course.device import describe, get_device
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if info["available"]:
    info["name"] = torch.cuda.get_device_name(0)
    info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    info["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
info["describe"] = describe(get_device())
print(json.dumps(info))
"""


def _env() -> dict[str, str]:
    """The environment for kernels and pytest: this checkout's tfm_course comes first."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def probe_device() -> dict:
    """The GPU's name, capability and memory (from a child process, so this one holds no CUDA
    context while the chapters run)."""
    out = subprocess.run([sys.executable, "-c", DEVICE_PROBE], capture_output=True, text=True,
                         env=_env(), cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


# --------------------------------------------------------------------------- chapters
def run_notebook(path: Path, timeout_s: float, save_to: Path | None = None) -> dict:
    """Execute one notebook in its own kernel; return a result row."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=None, kernel_name="python3",  # the limit is per chapter
                            resources={"metadata": {"path": str(path.parent)}})
    row = {"step": path.stem, "kind": "chapter", "seconds": 0.0, "result": "passed", "error": ""}
    start = time.perf_counter()
    try:
        asyncio.run(asyncio.wait_for(client.async_execute(env=_env()), timeout_s))
    except (asyncio.TimeoutError, CellTimeoutError):
        row.update(result="timeout", error=f"stopped after {timeout_s:g} s")
    except CellExecutionError as error:
        row.update(result="failed", error=_error_line(error))
    except DeadKernelError as error:
        if time.perf_counter() - start >= timeout_s:  # the kernel was stopped at the time limit
            row.update(result="timeout", error=f"stopped after {timeout_s:g} s")
        else:
            row.update(result="failed", error=first_line(f"kernel died: {error}"))
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["device_line"] = _running_on(nb)
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save_to / path.name)
    return row


def _error_line(error: Exception) -> str:
    """'AssertionError: message', and the line that raised it (IPython marks it with ---->)."""
    ename, evalue = getattr(error, "ename", ""), getattr(error, "evalue", "")
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # no terminal colours
    raised = [line.split("---->", 1)[1].strip() for line in text.splitlines() if "---->" in line]
    where = f" at `{raised[-1][:200]}`" if raised else ""
    head = f"{ename}: {first_line(evalue)}".rstrip(": ") if ename else first_line(text)
    return head + where


def _running_on(nb) -> str:
    """The setup cell's 'running on ...' line: the device the chapter itself saw."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for line in str(output.get("text", "")).splitlines():
                if line.startswith("running on"):
                    return line
    return ""


# --------------------------------------------------------------------------- tests
def run_gpu_tests(timeout_s: float, on_cuda: bool) -> dict:
    """``pytest -m gpu tests/``; result from its JUnit XML. On CUDA, zero tests passing fails."""
    row = {"step": "pytest -m gpu tests/", "kind": "tests", "seconds": 0.0, "result": "passed",
           "error": ""}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "gpu-tests.xml"
        command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-rs",
                   "-p", "no:cacheprovider", f"--junitxml={report}"]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            row.update(result="timeout", error=f"stopped after {timeout_s:g} s",
                       seconds=round(time.perf_counter() - start, 1))
            return row
        row["seconds"] = round(time.perf_counter() - start, 1)
        counts, failure = _junit_summary(report) if report.exists() else ({}, "")
    row.update(counts)
    ran_nothing = on_cuda and counts.get("passed", 0) == 0
    if done.returncode not in (0, 5) or failure or counts.get("failed") or ran_nothing:
        tail = first_line("\n".join(done.stdout.splitlines()[-3:])) if not failure else failure
        row.update(result="failed", error=failure or tail or f"pytest exit status {done.returncode}")
        if ran_nothing and not failure:
            row["error"] = "no GPU test passed on a CUDA machine"
    return row


def _junit_summary(report: Path) -> tuple[dict, str]:
    """Counts of passed / failed / skipped tests and the first failure as 'test: message'."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failure = ""
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            if not failure:
                message = bad.get("message") or bad.text or ""
                failure = f"{case.get('name')}: {first_line(message)}"
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failure


# --------------------------------------------------------------------------- report
def device_header(info: dict) -> str:
    if info.get("available"):
        gpu = (f"{info['name']} (compute capability {info['capability']}, "
               f"{info['memory_gib']} GiB)")
    else:
        gpu = "no CUDA device (run with --allow-cpu)"
    return (f"GPU: {gpu}; torch {info.get('torch')}, CUDA {info.get('cuda')}; "
            f"tfm_course sees: {info.get('describe')}")


def markdown(info: dict, rows: list[dict]) -> str:
    lines = ["# tools/gpu_check.py", "", device_header(info), "",
             "| step | seconds | result | first error |", "|---|---:|---|---|"]
    for row in rows:
        result = row["result"]
        if row["kind"] == "tests" and "passed" in row:
            result += f" ({row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped)"
        error = row["error"].replace("|", "\\|")
        lines.append(f"| {row['step']} | {row['seconds']:.1f} | {result} | {error} |")
    total = sum(row["seconds"] for row in rows)
    ok = all(row["result"] == "passed" for row in rows)
    lines += ["", f"Total {total:.0f} s; {'all passed' if ok else 'FAILURES'}."]
    return "\n".join(lines) + "\n"


def select_chapters(folder: Path, prefixes: list[str] | None) -> list[Path]:
    notebooks = sorted(folder.glob("*.ipynb"))
    if prefixes:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(p) for p in prefixes)]
    return notebooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None,
                        help="folder for gpu_check.md and gpu_check.json (default: $OUT if set)")
    parser.add_argument("--chapters", nargs="*", metavar="NN",
                        help="only chapters whose file names start with these (e.g. 01 05)")
    parser.add_argument("--chapters-dir", type=Path, default=ROOT / "chapters",
                        help="where the chapter notebooks are (default: chapters/)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed per chapter, and for the GPU tests (default 900)")
    parser.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    parser.add_argument("--no-chapters", action="store_true", help="skip the chapters")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run even without CUDA (the same steps, on the CPU)")
    parser.add_argument("--save-notebooks", action="store_true",
                        help="also write the executed notebooks to OUT/notebooks/")
    args = parser.parse_args(argv)

    info = probe_device()
    print(device_header(info), flush=True)
    if not info.get("available") and not args.allow_cpu:
        print("no CUDA device: refusing to run (pass --allow-cpu to run on the CPU)", file=sys.stderr)
        return 2
    rows: list[dict] = []
    chapters = [] if args.no_chapters else select_chapters(args.chapters_dir, args.chapters)
    if not args.no_chapters and not chapters:
        print(f"no notebook in {args.chapters_dir} matches {args.chapters}", file=sys.stderr)
        return 1
    save_to = args.out / "notebooks" if args.out and args.save_notebooks else None
    for path in chapters:
        print(f"-- {path.name} ...", flush=True)
        rows.append(run_notebook(path, args.timeout, save_to))
        print(f"   {rows[-1]['result']} in {rows[-1]['seconds']:.1f} s {rows[-1]['error']}", flush=True)
    if not args.no_tests:
        print("-- pytest -m gpu tests/ ...", flush=True)
        rows.append(run_gpu_tests(args.timeout, on_cuda=bool(info.get("available"))))
    report = markdown(info, rows)
    print("\n" + report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.md").write_text(report)
        (args.out / "gpu_check.json").write_text(json.dumps({"device": info, "rows": rows}, indent=2))
    return 0 if all(row["result"] == "passed" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
