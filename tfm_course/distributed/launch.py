"""Start the training script on N local processes with torchrun and read back its JSON.

    result = launch(2, ["--mode", "ddp,zero,fsdp", "--steps", "3"])
    result["modes"]["ddp"]["max_abs_diff"]       # DDP's weights against one process's

torchrun (``python -m torch.distributed.run``) is the launcher; it starts ``nproc`` workers
running ``python -m tfm_course.distributed``, gives each its rank, and tells them to meet on
``127.0.0.1`` at a port nobody uses. The workers sit in their own sessions (torchrun starts them
so), so on a timeout this kills torchrun *and* every process below it, leaving no orphan behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["launch", "free_port"]

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the tfm_course package


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1: the one the system picks when binding to port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, grandchildren …), read from Linux's /proc; []
    elsewhere."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state ppid …
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun's process group and every process below it (workers have their own sessions).

    torchrun is stopped first: a worker it started after the list of descendants was taken would
    otherwise survive, in a session of its own (seen under load, when workers start late)."""
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    below = _descendants(proc.pid)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:].strip() or "(empty)"


def launch(nproc: int, args: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Run ``python -m tfm_course.distributed *args`` on ``nproc`` local processes under torchrun;
    return the JSON rank 0 writes. Raises ``RuntimeError`` (with the end of stderr) when the run
    fails or takes longer than ``timeout`` seconds, ``ValueError`` for bad arguments."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"args must be a list of strings, got {args!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    port, processes = free_port(), f"{nproc} process{'es' if nproc > 1 else ''}"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # N workers with all cores each would fight over them
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="tfm_distributed_") as tmp:
        out, stdout, stderr = Path(tmp, "run.json"), Path(tmp, "stdout.txt"), Path(tmp, "stderr.txt")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-addr", "127.0.0.1", "--master-port", str(port),
                   "-m", "tfm_course.distributed", *args, "--out", str(out)]
        with open(stdout, "w") as so, open(stderr, "w") as se:
            proc = subprocess.Popen(command, stdout=so, stderr=se, env=env, cwd=ROOT,
                                    start_new_session=True)  # its own group: killable as one
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                raise RuntimeError(f"{processes} did not finish within {timeout} s; killed them "
                                   f"all. End of stderr:\n{_tail(stderr)}") from None
        if code != 0:
            raise RuntimeError(
                f"could not run {processes} (torchrun exit code {code}; if they never "
                f"started: no free port {port} / no loopback 127.0.0.1?). End of stderr:\n"
                f"{_tail(stderr)}")
        if not out.exists():
            raise RuntimeError(f"torchrun exited 0 but wrote no {out.name}. End of stdout:\n"
                               f"{_tail(stdout)}")
        return json.loads(out.read_text())
