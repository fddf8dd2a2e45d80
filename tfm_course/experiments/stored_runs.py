"""Stored runs: results too long to repeat in a book build, written once by a tool, shipped with
the package, checked by the tests, and labelled on the page that shows them.

    run = new_run("bert_pretraining_cpu", command, seeds=[0], device=device)   # in a tool
    run["curves"]["mlm_loss"] = [[step, value], ...]
    run["checkpoints"]["long"] = save_checkpoint(model.state_dict(), "bert_pretraining_cpu-long")
    write_run(run)

    run = load_run("bert_pretraining_cpu")                                    # in a chapter
    state = load_checkpoint(run, "long")   # sha256 checked, torch.load(weights_only=True)
    print(label(run))                      # "stored run: <command> (<machine>, <date>)"

A run is one JSON file in :mod:`tfm_course.results` (``NAME.json``) with the fields of
:data:`REQUIRED`, and optional checkpoints beside it (``NAME-KEY.pt``): plain state dicts of
tensors, which ``torch.load(..., weights_only=True)`` reads without executing any code. The JSON
records each checkpoint's file name, sha256, size and dtype, so a damaged or swapped file is
caught before it is loaded.

The corpus of the course is the standard library's docstrings, so it depends on the Python
version: a run records :func:`tfm_course.data.corpus.fingerprint`, and :func:`same_corpus` tells
a page whether it reads the corpus the run was trained on (Colab's Python differs from CI's).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import platform
import subprocess
import time
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["REQUIRED", "RESULTS_DIR", "new_run", "finish_run", "save_checkpoint", "write_run",
           "load_run", "load_checkpoint", "missing_fields", "same_corpus", "label", "sha256_of"]

# Every stored run has these fields (``missing_fields`` checks them; the tests check every run).
REQUIRED = ("name", "command", "commit", "date", "python", "torch", "machine", "seeds", "steps",
            "tokens_seen", "cpu_seconds", "wall_seconds", "curves", "corpus", "checkpoints")

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"  # where tools write (the source tree)
MAX_CHECKPOINT_BYTES = 4 * 2**20


def _commit() -> str:
    """The git commit of the source tree, with ``+dirty`` when files differ from it."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device.type, "threads": torch.get_num_threads(),
                            "cpu_count": os.cpu_count(), "platform": platform.platform(),
                            "processor": platform.machine()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def new_run(name: str, command: str, seeds: list[int], device: torch.device | str = "cpu",
            **settings: Any) -> dict[str, Any]:
    """A run record with its provenance filled in; the tool adds curves, steps and checkpoints,
    then calls :func:`finish_run` and :func:`write_run`. ``settings`` are stored under ``"settings"``."""
    from ..data import corpus

    return {"name": name, "command": command, "commit": _commit(),
            "date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": _machine(torch.device(device)), "seeds": list(seeds),
            "steps": {}, "tokens_seen": {}, "curves": {}, "corpus": corpus.fingerprint(),
            "checkpoints": {}, "settings": dict(settings),
            "_clock": [time.process_time(), time.perf_counter()]}


def finish_run(run: dict[str, Any]) -> dict[str, Any]:
    """Record the CPU and wall seconds since :func:`new_run`."""
    cpu, wall = run.pop("_clock")
    run["cpu_seconds"], run["wall_seconds"] = time.process_time() - cpu, time.perf_counter() - wall
    return run


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(state_dict: Mapping[str, torch.Tensor], stem: str, dtype: torch.dtype | None = None,
                    folder: Path | None = None) -> dict[str, Any]:
    """Write ``state_dict`` (tensors only, on the CPU, optionally cast to ``dtype``) to
    ``folder/stem.pt``; return its entry for ``run["checkpoints"]`` (file, sha256, bytes, dtype)."""
    folder = folder or RESULTS_DIR
    tensors = {k: (v.detach().to("cpu", dtype) if dtype and v.is_floating_point() else v.detach().cpu())
               for k, v in state_dict.items()}  # views keep tied weights shared
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    data = buffer.getvalue()
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise ValueError(f"checkpoint {stem} is {len(data):,} bytes; stored checkpoints must stay under "
                         f"{MAX_CHECKPOINT_BYTES:,} (cast to a 16-bit dtype or store a smaller model)")
    (folder / f"{stem}.pt").write_bytes(data)
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in tensors.values() if v.is_floating_point()})
    return {"file": f"{stem}.pt", "sha256": sha256_of(data), "bytes": len(data), "dtype": ",".join(dtypes)}


def missing_fields(run: Mapping[str, Any]) -> list[str]:
    """The fields of :data:`REQUIRED` that ``run`` lacks or leaves empty (curves and seeds must
    not be empty; a run without checkpoints stores ``{}``)."""
    missing = [f for f in REQUIRED if f not in run]
    missing += [f for f in ("curves", "seeds", "command", "commit", "corpus") if f in run and not run[f]]
    return missing


def write_run(run: dict[str, Any], folder: Path | None = None) -> Path:
    """Check ``run`` is complete and write it as ``folder/NAME.json`` (default: the package's results)."""
    if "_clock" in run:
        finish_run(run)
    missing = missing_fields(run)
    if missing:
        raise ValueError(f"stored run {run.get('name')!r} lacks {missing}")
    path = (folder or RESULTS_DIR) / f"{run['name']}.json"
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def _results():
    return resources.files("tfm_course.results")


def load_run(name: str, folder: Path | None = None) -> dict[str, Any]:
    """The stored run ``name`` from the installed package (or from ``folder``), as a dict."""
    if folder is not None:
        return json.loads((Path(folder) / f"{name}.json").read_text())
    from ..results import load_result

    return load_result(name)


def load_checkpoint(run: Mapping[str, Any], key: str, folder: Path | None = None) -> dict[str, torch.Tensor]:
    """The state dict stored under ``run["checkpoints"][key]`` (in the package, or in ``folder``),
    after checking its sha256; loaded with ``weights_only=True`` (tensors only, no code runs)."""
    entries = run.get("checkpoints", {})
    if key not in entries:
        raise ValueError(f"run {run.get('name')!r} has no checkpoint {key!r}; it has {sorted(entries)}")
    entry = entries[key]
    data = (Path(folder) if folder is not None else _results()).joinpath(entry["file"]).read_bytes()
    if sha256_of(data) != entry["sha256"]:
        raise ValueError(f"{entry['file']}: sha256 {sha256_of(data)[:12]}… does not match the run's "
                         f"{entry['sha256'][:12]}… (a damaged or replaced file)")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def same_corpus(run: Mapping[str, Any]) -> bool:
    """True when this Python's corpus is the one ``run`` was trained on."""
    from ..data import corpus

    return run["corpus"] == corpus.fingerprint()


def label(run: Mapping[str, Any]) -> str:
    """One line for the page: what made the run, where, when."""
    m = run["machine"]
    where = m.get("gpu") or f"{m['device']}, {m['threads']} thread{'s' if m['threads'] != 1 else ''}"
    return (f"stored run `{run['command']}` ({where}; torch {run['torch']}, Python {run['python']}; "
            f"{run['date']}, commit {run['commit'][:10]})")


