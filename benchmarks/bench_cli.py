"""What a user waits for before anything happens: `import trainplan` and the `trainplan` command (the plan for this
machine), each in a fresh interpreter, with bytecode written (as after `pip install`) and without it (an editable
install under PYTHONDONTWRITEBYTECODE=1 compiles trainplan's source on every run). Medians of alternated runs; the
`-X importtime` lines of the slowest imports are printed after the table (`importtime_report`)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import Row, human

RUNS = 15
TRAINPLAN = [sys.executable, "-m", "trainplan.cli"]
"""The command as the console script runs it (`trainplan` is `_trainplan_entry:main`, which imports trainplan.cli)."""


def _environment(bytecode: bool) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    if not bytecode:
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
    return environment


def _medians(commands: dict[str, list[str]], environment: dict[str, str]) -> dict[str, float]:
    for command in commands.values():  # warm: bytecode written where it may be, files in the page cache
        subprocess.run(command, check=True, capture_output=True, env=environment)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(RUNS):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=environment)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def run() -> list[Row]:
    rows: list[Row] = []
    commands = {
        "pass": [sys.executable, "-c", "pass"],
        "import": [sys.executable, "-c", "import trainplan"],
        "attrs": [sys.executable, "-c", "import attrs, argparse"],
        "plan": TRAINPLAN,
    }
    for bytecode in (True, False):
        how = "bytecode written" if bytecode else "PYTHONDONTWRITEBYTECODE=1"
        seconds = _medians(commands, _environment(bytecode))
        bare = seconds["pass"]
        imported = max(1e-6, seconds["import"] - bare)
        rows.append(
            Row(f"import trainplan ({how})", human(imported), "30.0 ms", "the target", 0.030 / imported, "≥ 1×")
        )
        rows.append(
            Row(
                f"trainplan (the plan for this machine), whole command ({how})",
                human(seconds["plan"]),
                human(bare),
                "python -c pass",
                bare / seconds["plan"],
                "≥ 0.2× (≤ 5× python -c pass)",
            )
        )
        rows.append(
            Row(
                f"the floor under it: python -c 'import attrs, argparse' ({how})",
                human(seconds["plan"]),
                human(seconds["attrs"]),
                "python -c 'import attrs, argparse'",
                seconds["attrs"] / seconds["plan"],
                "—",
            )
        )
    return rows


def importtime_report(top: int = 12) -> str:
    """The slowest imports (cumulative, `-X importtime`) of `import trainplan` and of the `trainplan` command."""
    lines: list[str] = []
    for title, command in (
        ("import trainplan", [sys.executable, "-X", "importtime", "-c", "import trainplan"]),
        ("trainplan (plan)", [*TRAINPLAN[:1], "-X", "importtime", *TRAINPLAN[1:]]),
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=True, env=_environment(True))
        entries: list[tuple[int, str]] = []
        for line in result.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                entries.append((int(parts[1]), line))
        entries.sort(reverse=True)
        lines.append(f"-X importtime, {title}: the {top} largest cumulative (µs)")
        lines.extend(line for _, line in entries[:top])
    return "\n".join(lines)


if __name__ == "__main__":
    from benchmarks.common import table

    print(table(run()))
    print()
    print(importtime_report())
