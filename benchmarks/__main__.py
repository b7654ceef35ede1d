"""`python -m benchmarks`: every benchmark in one run, printed as one markdown table of ratios, and the curves
written as figures (benchmarks/figures/*.svg, shown in the README)."""

from __future__ import annotations

import datetime
import os
import platform

from benchmarks import bench_gpus, bench_launch, bench_launch_script, bench_metrics, bench_resolve, plots
from benchmarks.common import table


def main() -> None:
    metric_curves = bench_metrics.curves()
    launch_curves = bench_launch.spawn_curves()
    rows = bench_resolve.run() + bench_gpus.run() + bench_launch.run(launch_curves)
    rows += bench_launch_script.run() + bench_metrics.run(metric_curves)
    machine = f"{platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}"
    print(f"Measured {datetime.date.today().isoformat()} on {machine}.\n")
    print(table(rows))
    for path in plots.write(metric_curves, launch_curves):
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
