"""`python -m benchmarks` (`make bench`): every benchmark in one run, printed as one markdown table of ratios and
written to benchmarks/results.md (which docs/benchmarks.md includes), the curves drawn as figures
(benchmarks/figures/*.svg). `python -m benchmarks resolve [cli ...]`: those parts alone, which replace only their
own rows in the results."""

from __future__ import annotations

import sys
from collections.abc import Callable

from benchmarks import (
    bench_cli,
    bench_gpus,
    bench_launch,
    bench_launch_script,
    bench_memory,
    bench_metrics,
    bench_resolve,
    plots,
)
from benchmarks.common import Row, table
from benchmarks.results import PARTS, PartResult, record, this_run


def main(arguments: list[str]) -> None:
    unknown = [name for name in arguments if name not in PARTS]
    if unknown:
        raise SystemExit(f"usage: python -m benchmarks [PART ...], PART one of {', '.join(PARTS)} (got {unknown})")
    wanted = [name for name in PARTS if name in arguments] or list(PARTS)
    curves: dict[str, dict[str, dict[int, float]]] = {}
    runners: dict[str, Callable[[], list[Row]]] = {
        "cli": bench_cli.run,
        "resolve": bench_resolve.run,
        "gpus": bench_gpus.run,
        "launch": lambda: bench_launch.run(curves.setdefault("launch", bench_launch.spawn_curves())),
        "launch_script": bench_launch_script.run,
        "metrics": lambda: bench_metrics.run(curves.setdefault("metrics", bench_metrics.curves())),
        "memory": bench_memory.run,
    }
    measured: dict[str, PartResult] = {}
    for name in wanted:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        measured[name] = this_run(runners[name]())
    record(measured)
    print(table([row for part in measured.values() for row in part.rows]))
    if "cli" in measured:
        print()
        print(bench_cli.importtime_report())
    if "launch" in curves and "metrics" in curves:  # both figures come from one run
        for path in plots.write(curves["metrics"], curves["launch"]):
            print(f"\nwrote {path}")
    print("\nwrote benchmarks/results.json and benchmarks/results.md")


if __name__ == "__main__":
    main(sys.argv[1:])
