"""`python -m benchmarks`: every benchmark in one run, printed as one markdown table of ratios, and the curves
written as figures (benchmarks/figures/*.svg, shown in docs/benchmarks.md). `python -m benchmarks resolve`: the resolve
rows alone."""

from __future__ import annotations

import datetime
import os
import platform
import sys

from benchmarks import bench_cli, bench_gpus, bench_launch, bench_launch_script, bench_metrics, bench_resolve, plots
from benchmarks.common import table


def main() -> None:
    if sys.argv[1:] == ["resolve"]:  # `python -m benchmarks resolve`: the resolve rows alone, in a minute
        print(f"Measured {datetime.date.today().isoformat()} on {_machine()} (the resolve part alone).\n")
        print(table(bench_resolve.run()))
        return
    if sys.argv[1:]:
        raise SystemExit("usage: python -m benchmarks [resolve]")
    metric_curves = bench_metrics.curves()
    launch_curves = bench_launch.spawn_curves()
    rows = bench_cli.run() + bench_resolve.run() + bench_gpus.run() + bench_launch.run(launch_curves)
    rows += bench_launch_script.run() + bench_metrics.run(metric_curves)
    print(f"Measured {datetime.date.today().isoformat()} on {_machine()}.\n")
    print(table(rows))
    print()
    print(bench_cli.importtime_report())
    for path in plots.write(metric_curves, launch_curves):
        print(f"\nwrote {path}")


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}"


if __name__ == "__main__":
    main()
