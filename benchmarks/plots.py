"""The curves of `make bench` as SVG figures (matplotlib, from the `bench` extra), which docs/benchmarks.md shows:
compute cost against keys, and launch cost against workers, trainplan beside the anchors."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

FIGURES = Path(__file__).resolve().parent / "figures"

LABELS = {
    "ours": "trainplan",
    "floor": "floor (stack, one tolist, sorted dict)",
    "lightning": "Lightning _ResultCollection (sync_dist)",
    "torchmetrics": "torchmetrics MeanMetric per key",
    "ours, second launch": "trainplan, second launch (forkserver running)",
    "torch.multiprocessing": "torch.multiprocessing spawn",
}


def _pyplot() -> Any:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # files only, no display
    return importlib.import_module("matplotlib.pyplot")


def _figure(
    curves: dict[str, dict[int, float]], *, title: str, xlabel: str, path: Path, log_x: bool, unit: float, ylabel: str
) -> None:
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7.0, 4.2))
    for name, points in curves.items():
        xs = sorted(points)
        style = "-o" if name.startswith("ours") else "--s"
        axes.plot(
            xs,
            [points[x] * unit for x in xs],
            style,
            label=LABELS.get(name, name),
            linewidth=2 if name == "ours" else 1,
        )
    if log_x:
        axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(sorted({x for points in curves.values() for x in points}))
    axes.get_xaxis().set_major_formatter(importlib.import_module("matplotlib.ticker").ScalarFormatter())
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    pyplot.close(figure)


def write(
    metrics: dict[str, dict[int, float]], launch: dict[str, dict[int, float]], folder: Path = FIGURES
) -> list[Path]:
    """Write both figures into `folder`; the paths written (none when matplotlib is not installed)."""
    try:
        _pyplot()
    except ImportError:
        print("matplotlib is not installed (it comes with the `bench` extra): no figures written")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    compute_path, launch_path = folder / "metric_compute.svg", folder / "launch_spawn.svg"
    _figure(
        metrics,
        title="Synced compute() against keys (collective stubbed, 2 ranks)",
        xlabel="0-d tensor keys (weighted means)",
        ylabel="milliseconds per compute()",
        path=compute_path,
        log_x=True,
        unit=1e3,
    )
    _figure(
        launch,
        title="launch → first all_reduce → back, spawn-class, fresh caller",
        xlabel="workers (CPU, gloo)",
        ylabel="seconds",
        path=launch_path,
        log_x=False,
        unit=1.0,
    )
    return [compute_path, launch_path]
