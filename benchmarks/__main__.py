"""`python -m benchmarks`: every benchmark in one run, printed as one markdown table of ratios."""

from __future__ import annotations

import datetime
import os
import platform

from benchmarks import bench_gpus, bench_launch, bench_launch_script, bench_metrics, bench_resolve
from benchmarks.common import table


def main() -> None:
    rows = bench_resolve.run() + bench_gpus.run() + bench_launch.run() + bench_launch_script.run()
    rows += bench_metrics.run()
    machine = f"{platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}"
    print(f"Measured {datetime.date.today().isoformat()} on {machine}.\n")
    print(table(rows))


if __name__ == "__main__":
    main()
