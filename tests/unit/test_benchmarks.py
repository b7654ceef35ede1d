"""The benchmark tooling that CI can run: the GPU check's no-GPU path and the figures' writer."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import plots, results
from benchmarks.common import Row

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


def _part(measure: str, day: str) -> results.PartResult:
    row = Row(measure, "1.0 ms", "2.0 ms", "the anchor", 2.0, "≥ 1×")
    return results.PartResult(measured=day, machine="x86_64, 2 CPU(s)", conditions="load average 1.0", rows=(row,))


def test_a_part_measured_alone_replaces_only_its_own_rows(tmp_path: Path) -> None:
    paths = {"json_path": tmp_path / "results.json", "markdown_path": tmp_path / "results.md"}
    results.record({"metrics": _part("compute", "2026-01-01"), "cli": _part("import", "2026-01-01")}, **paths)
    results.record({"metrics": _part("compute again", "2026-01-02")}, **paths)
    parts = results.load(paths["json_path"])
    assert list(parts) == ["cli", "metrics"], "the table's order is PARTS', not the order measured"
    assert [row.measure for row in parts["metrics"].rows] == ["compute again"] and parts["cli"].measured == "2026-01-01"
    markdown = paths["markdown_path"].read_text()
    assert markdown == results.render(parts)
    assert "- **metrics**: 2026-01-02, x86_64, 2 CPU(s), load average 1.0" in markdown
    assert (
        "| compute again | 1.0 ms | the anchor | 2.0 ms | 2.00× | ≥ 1× |" in markdown and "| compute |" not in markdown
    )


def test_a_results_file_naming_a_part_the_benchmarks_lack_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text('{"speed": {}}')
    with pytest.raises(ValueError, match=r"unknown benchmark part\(s\) \['speed'\]"):
        results.load(tmp_path / "results.json")


def test_the_results_table_is_generated_from_the_results_file() -> None:
    recorded = results.load()
    assert list(recorded) == list(results.PARTS), "every part has rows (make bench measures them all)"
    assert results.RESULTS_MD.read_text() == results.render(recorded), "regenerate with: python -m benchmarks PART"


def test_the_benchmarks_page_includes_the_results_table_once() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page.count('--8<-- "benchmarks/results.md"') == 1
    assert "| measure |" not in page, "the page's numbers come from benchmarks/results.md alone"
    assert results.RESULTS_MD.read_text().count("| measure |") == 1


def test_python_m_benchmarks_refuses_a_part_it_does_not_have() -> None:
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit, match="PART one of cli, resolve, gpus"):
        main(["speed"])


def test_an_import_below_the_noise_gets_no_ratio() -> None:
    from benchmarks import bench_resolve
    from benchmarks.common import IMPORT_FLOOR

    busy = bench_resolve.import_rows(lambda module: IMPORT_FLOOR if module == "trainplan" else 80.0)
    assert busy and all(row.ours == "below the noise" and row.ratio is None for row in busy)
    quiet = bench_resolve.import_rows(lambda module: 0.004 if module == "trainplan" else 2.0)
    assert [row.ratio for row in quiet] == [500.0] * len(quiet) and quiet[0].ours == "4.0 ms"
