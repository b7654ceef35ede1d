"""The benchmark tooling that CI can run: the GPU check's no-GPU path and the figures' writer."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import plots

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_cleanly_to_its_no_gpu_message_here() -> None:
    result = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu_check.sh")],
        cwd="/",
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("no GPU: nothing to check here"), result.stdout


@pytest.mark.parametrize("python", ["/nonexistent/python", "python-without-trainplan"])
def test_a_broken_setup_is_never_reported_as_no_gpu(tmp_path: Path, python: str) -> None:
    if python == "python-without-trainplan":  # an interpreter that cannot import trainplan or torch
        python = str(tmp_path / "bare")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", python], check=True, timeout=120)
        python += "/bin/python"
    result = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu_check.sh")],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "cannot run the GPU checks" in result.stderr, (result.stdout, result.stderr)
    assert "no GPU" not in result.stdout


def test_the_figures_are_written_where_matplotlib_is_installed(tmp_path: Path) -> None:
    curves = {"ours": {1: 2e-5, 100: 4e-5}, "floor": {1: 2e-6, 100: 3e-5}}
    written = plots.write(curves, {"ours": {2: 1.2, 4: 1.3}, "torch.multiprocessing": {2: 3.0, 4: 6.0}}, tmp_path)
    if importlib.util.find_spec("matplotlib") is None:
        assert written == []
        return
    assert [path.name for path in written] == ["metric_compute.svg", "launch_spawn.svg"]
    assert all(path.read_text().lstrip().startswith("<?xml") and "<svg" in path.read_text() for path in written)
