"""Usable-GPU probing on simulated devices: parallel child probes vs the sequential context-per-device way.

Each simulated device takes `LATENCY` seconds to answer (the cost of creating a CUDA context and
allocating). Ours starts one fresh interpreter per device, all at once (the real launcher, with the
device work replaced by a sleep); the sequential approach (Lightning's `auto_select_gpus`) pays the
latency once per device, in turn, in the caller (modelled as an in-process sleep, which spares it the
interpreter starts ours pays).
"""

from __future__ import annotations

import time

from benchmarks.common import Row, human
from trainplan.effects.gpus import SubprocessProbeLauncher, probe_in_parallel

LATENCY = 0.25
SIMULATED_PROBE = f"import json, time\ntime.sleep({LATENCY})\nprint(json.dumps({{'ok': True}}))\n"


def _ours(devices: int) -> float:
    launcher = SubprocessProbeLauncher(probe_code=SIMULATED_PROBE)
    start = time.perf_counter()
    outcomes = probe_in_parallel(list(range(devices)), launcher, timeout=60)
    elapsed = time.perf_counter() - start
    assert all(outcome.state == "ok" for outcome in outcomes.values())
    return elapsed


def _sequential(devices: int) -> float:
    start = time.perf_counter()
    for _ in range(devices):
        time.sleep(LATENCY)  # one context after another, in the caller
    return time.perf_counter() - start


def run() -> list[Row]:
    ours_one = min(_ours(1) for _ in range(3))
    ours_eight = min(_ours(8) for _ in range(3))
    theirs_eight = _sequential(8)
    return [
        Row(
            f"usable-GPU probe, 8 simulated devices ({LATENCY:g} s each)",
            human(ours_eight),
            human(theirs_eight),
            "sequential context per device (auto_select_gpus)",
            theirs_eight / ours_eight,
            "—",
        ),
        Row(
            "usable-GPU probe, 8 devices vs 1 device (ours)",
            human(ours_eight),
            human(ours_one),
            "ours with 1 device",
            ours_one / ours_eight,
            "≥ 0.67× (8 devices within 1.5× of 1)",
        ),
    ]
