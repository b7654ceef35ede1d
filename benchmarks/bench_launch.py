"""Launch overhead: from `launch` to the first completed all_reduce and back, 2 CPU workers.

Ours: `trainplan.launch(plan, fn)` (supervision, failure handling, results back). Theirs:
`torch.multiprocessing.start_processes` with the same set-up written by hand (environment, process
group over TCP, the all_reduce, teardown). Same start method, same interpreter, alternated runs.
"""

from __future__ import annotations

import datetime
import socket
import statistics
import time

from benchmarks.common import Row, human
from trainplan import Environment, Request, StrategyFlag, launch
from trainplan.resolve import resolve

RUNS = {"spawn": 5, "fork": 21}  # fork runs take ~70 ms: more of them steady the median on a busy machine


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
        timeout=datetime.timedelta(seconds=60),
    )
    value = torch.ones(1)
    distributed.all_reduce(value)
    distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run() -> list[Row]:
    from torch.multiprocessing.spawn import start_processes

    rows = []
    pairs: tuple[tuple[StrategyFlag, str], ...] = (("ddp_spawn", "spawn"), ("ddp_fork", "fork"))
    for strategy, method in pairs:
        plan = resolve(Request(accelerator="cpu", strategy=strategy, devices=2), Environment(cpu_count=2))
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(RUNS[method]):
            start = time.perf_counter()
            assert launch(plan, _reduce) == [2.0, 2.0]
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            start_processes(_by_hand, args=(_free_port(), 2), nprocs=2, start_method=method)  # type: ignore[no-untyped-call]
            theirs.append(time.perf_counter() - start)
        mine, anchor = statistics.median(ours), statistics.median(theirs)
        rows.append(
            Row(
                f"launch → first all_reduce → back, 2 workers ({method})",
                human(mine),
                human(anchor),
                "torch.multiprocessing.start_processes by hand",
                anchor / mine,
                "≥ 0.91× (within 1.1×)",
            )
        )
    return rows
