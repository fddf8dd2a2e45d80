"""tools/gpu_check.py, run here on the CPU (--allow-cpu) over small notebooks of its own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notebook(path: Path, *cells: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_refuses_to_run_without_cuda_unless_allowed(gpu_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "probe_device", lambda: {"available": False, "describe": "cpu"})
    assert gpu_check.main(["--chapters-dir", str(tmp_path), "--no-tests"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


def test_runs_each_notebook_in_its_own_kernel_and_reports_a_table(gpu_check, tmp_path, capsys):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    _notebook(chapters / "01-ok.ipynb", "x = 1", "import tfm_course, os\nprint('running on cpu')",
              "assert 'x' in globals()")
    _notebook(chapters / "02-fails.ipynb", "assert 'x' not in globals()  # a fresh kernel",
              "y = 2\nassert y == 3, f'y is {y}'")
    _notebook(chapters / "03-slow.ipynb", "import time\ntime.sleep(120)")
    _notebook(chapters / "04-not-selected.ipynb", "raise SystemExit")
    out = tmp_path / "out"
    status = gpu_check.main(["--allow-cpu", "--no-tests", "--chapters-dir", str(chapters),
                             "--chapters", "01", "02", "03", "--timeout", "10", "--out", str(out)])
    assert status == 1
    rows = json.loads((out / "gpu_check.json").read_text())["rows"]
    assert [(r["step"], r["result"]) for r in rows] == [
        ("01-ok", "passed"), ("02-fails", "failed"), ("03-slow", "timeout")]
    assert rows[0]["device_line"] == "running on cpu"
    assert rows[1]["error"].startswith("AssertionError: y is 2") and "assert y == 3" in rows[1]["error"]
    assert 10 <= rows[2]["seconds"] < 60
    table = (out / "gpu_check.md").read_text()
    assert "| 02-fails |" in table and "| timeout |" in table and "FAILURES" in table
    assert table in capsys.readouterr().out
    assert gpu_check.main(["--allow-cpu", "--no-tests", "--chapters-dir", str(chapters),
                           "--chapters", "01"]) == 0


def test_junit_summary_counts_and_names_the_first_failure(gpu_check, tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase name="test_a"/>'
        '<testcase name="test_b"><skipped message="needs a CUDA device"/></testcase>'
        '<testcase name="test_c"><failure message="assert 1 == 2&#10;more">tb</failure></testcase>'
        '<testcase name="test_d"><error message="fixture broke">tb</error></testcase>'
        '</testsuite></testsuites>')
    counts, failure = gpu_check._junit_summary(report)
    assert counts == {"passed": 1, "failed": 2, "skipped": 1}
    assert failure == "test_c: assert 1 == 2"


def test_chapters_are_found_by_glob_and_prefix(gpu_check):
    everything = gpu_check.select_chapters(ROOT / "chapters", None)
    assert everything == sorted((ROOT / "chapters").glob("*.ipynb")) and len(everything) >= 5
    assert [p.name[:2] for p in gpu_check.select_chapters(ROOT / "chapters", ["01", "03"])] == ["01", "03"]
