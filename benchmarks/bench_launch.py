"""Launch overhead: from `launch` to the first completed all_reduce and back, CPU workers over gloo.

Ours: `trainplan.launch(plan, fn)` (supervision, failure handling, results back). Theirs:
`torch.multiprocessing.start_processes` with the same set-up written by hand (environment, process
group over TCP, the all_reduce, teardown).

- spawn, at 2, 4 and 8 workers: each launch in a fresh caller process that has imported torch (what a training
  script's first launch costs). Ours starts spawn plans from a forkserver that imports torch once; torch's
  spawn starts an interpreter per worker, each importing torch. Also a second launch in the same caller (the
  forkserver is then running already).
- fork, 2 workers, in this process, alternated runs.
"""

from __future__ import annotations

import datetime
import socket
import statistics
import subprocess
import sys
import time

from benchmarks.common import Row, human
from trainplan import Environment, Request, launch
from trainplan.resolve import resolve

WORKERS = (2, 4, 8)
SPAWN_RUNS = 3
FORK_RUNS = 21  # fork runs take ~70 ms: more of them steady the median on a busy machine


def _reduce() -> float:
    import torch
    from torch import distributed

    value = torch.ones(1)
    distributed.all_reduce(value)
    return float(value.item())


def _by_hand(local_rank: int, port: int, world: int) -> None:
    import torch
    from torch import distributed

    distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=local_rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    value = torch.ones(1)
    distributed.all_reduce(value)
    distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


_FRESH_CALLER = """
import sys, time
import torch
from benchmarks import bench_launch
which, workers = sys.argv[1], int(sys.argv[2])
if __name__ == "__main__":
    if which == "ours":
        import trainplan
        plan = trainplan.resolve(
            trainplan.Request(accelerator="cpu", strategy="ddp_spawn", devices=workers),
            trainplan.Environment(cpu_count=workers),
        )
        times = []
        for _ in range(2):
            start = time.perf_counter()
            assert trainplan.launch(plan, bench_launch._reduce) == [float(workers)] * workers
            times.append(time.perf_counter() - start)
    else:
        from torch.multiprocessing.spawn import start_processes
        start = time.perf_counter()
        start_processes(bench_launch._by_hand, args=(bench_launch._free_port(), workers), nprocs=workers,
                        start_method="spawn")
        times = [time.perf_counter() - start]
    print(" ".join(f"{item:.6f}" for item in times))
"""


def _fresh(which: str, workers: int) -> list[float]:
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_CALLER, which, str(workers)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return [float(item) for item in result.stdout.split()]


def spawn_curves() -> dict[str, dict[int, float]]:
    """Median seconds per launch against workers: ours (first and second launch in a caller), torch's spawn."""
    curves: dict[str, dict[int, float]] = {"ours": {}, "ours, second launch": {}, "torch.multiprocessing": {}}
    for workers in WORKERS:
        first: list[float] = []
        second: list[float] = []
        theirs: list[float] = []
        for _ in range(SPAWN_RUNS):  # alternated, so a busy moment costs both alike
            cold, warm = _fresh("ours", workers)
            first.append(cold)
            second.append(warm)
            theirs += _fresh("theirs", workers)
        curves["ours"][workers] = statistics.median(first)
        curves["ours, second launch"][workers] = statistics.median(second)
        curves["torch.multiprocessing"][workers] = statistics.median(theirs)
    return curves


def run(curves: dict[str, dict[int, float]] | None = None) -> list[Row]:
    from torch.multiprocessing.spawn import start_processes

    curves = spawn_curves() if curves is None else curves
    rows = []
    for workers in WORKERS:
        anchor = curves["torch.multiprocessing"][workers]
        for label, key, target in (
            ("first launch in a fresh caller", "ours", "≥ 2× (within 0.5×)"),
            ("second launch (forkserver running)", "ours, second launch", "—"),
        ):
            mine = curves[key][workers]
            rows.append(
                Row(
                    f"launch → first all_reduce → back, {workers} workers (spawn plan), {label}",
                    human(mine),
                    human(anchor),
                    "torch.multiprocessing spawn by hand, fresh caller",
                    anchor / mine,
                    target,
                )
            )
    plan = resolve(Request(accelerator="cpu", strategy="ddp_fork", devices=2), Environment(cpu_count=2))
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(FORK_RUNS):
        start = time.perf_counter()
        assert launch(plan, _reduce) == [2.0, 2.0]
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        start_processes(_by_hand, args=(_free_port(), 2), nprocs=2, start_method="fork")  # type: ignore[no-untyped-call]
        theirs.append(time.perf_counter() - start)
    mine, anchor = statistics.median(ours), statistics.median(theirs)
    rows.append(
        Row(
            "launch → first all_reduce → back, 2 workers (fork)",
            human(mine),
            human(anchor),
            "torch.multiprocessing.start_processes by hand",
            anchor / mine,
            "≥ 0.91× (within 1.1×)",
        )
    )
    return rows
