"""Timing helpers shared by the benchmarks: best-of-repeats per-call cost, and a markdown table."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import attrs


@attrs.frozen
class Row:
    """One line of the report: what was measured, ours, theirs, and the ratio theirs / ours."""

    measure: str
    ours: str
    theirs: str
    anchor: str
    ratio: float | None
    target: str


def per_call_seconds(function: Callable[[], object], *, budget: float = 0.4, repeats: int = 5) -> float:
    """Best-of-`repeats` seconds per call, each repeat running about `budget` seconds."""
    function()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            function()
        elapsed = time.perf_counter() - start
        if elapsed >= budget / repeats or calls >= 1 << 22:
            break
        calls *= 2
    best = elapsed / calls
    for _ in range(repeats - 1):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


IMPORT_FLOOR = 1e-6
"""What `import_seconds` returns when an import costs no more than the interpreter's start-up varies (a busy machine):
a figure below the noise, which no ratio should be taken from."""


def import_seconds(module: str, *, runs: int = 5) -> float:
    """Median wall time of `import module` in a fresh interpreter, less the interpreter's own start-up (at least
    `IMPORT_FLOOR`)."""

    # Byte-code caching on, and one warm-up import, so every module is timed from its compiled form (as an
    # installed package would be), not from source.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}

    def once(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=environment)
        return time.perf_counter() - start

    once(f"import {module}")
    baseline = statistics.median(once("pass") for _ in range(runs))
    return max(IMPORT_FLOOR, statistics.median(once(f"import {module}") for _ in range(runs)) - baseline)


def human(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


def table(rows: list[Row]) -> str:
    lines = [
        "| measure | trainplan | anchor | anchor's figure | anchor / trainplan | target |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = "—" if row.ratio is None else f"{row.ratio:.2f}×" if row.ratio < 10 else f"{row.ratio:.0f}×"
        lines.append(f"| {row.measure} | {row.ours} | {row.anchor} | {row.theirs} | {ratio} | {row.target} |")
    return "\n".join(lines)
