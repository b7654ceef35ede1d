"""The benchmarks' results as files: benchmarks/results.json (every part's latest rows, with when and where each part
was measured) and benchmarks/results.md (one markdown table of them, which docs/benchmarks.md includes).

`make bench` measures every part; `python -m benchmarks resolve cli` measures those parts alone and replaces only
their rows, so the table always holds each part's latest run, each row stamped with its part's date."""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from benchmarks.common import Row, table

HERE = Path(__file__).resolve().parent
RESULTS_JSON = HERE / "results.json"
RESULTS_MD = HERE / "results.md"

PARTS: tuple[str, ...] = ("cli", "resolve", "gpus", "launch", "launch_script", "metrics", "memory")
"""The parts of `make bench`, in the table's order (`python -m benchmarks PART ...` runs some alone)."""


@attrs.frozen(kw_only=True)
class PartResult:
    """One part's latest run: its rows, the day, the machine and how busy it was."""

    measured: str
    machine: str
    conditions: str
    rows: tuple[Row, ...]


def this_run(rows: Sequence[Row], *, today: datetime.date | None = None) -> PartResult:
    """`rows` stamped with today's date, this machine and its load average when the part ended."""
    load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "load not known"
    return PartResult(
        measured=(today or datetime.date.today()).isoformat(),
        machine=f"{platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}",
        conditions=load,
        rows=tuple(rows),
    )


def load(path: Path = RESULTS_JSON) -> dict[str, PartResult]:
    """The parts recorded in `path` (none when it does not exist); a part the benchmarks no longer have is refused."""
    if not path.exists():
        return {}
    recorded = json.loads(path.read_text())
    unknown = sorted(set(recorded) - set(PARTS))
    if unknown:
        raise ValueError(f"{path}: unknown benchmark part(s) {unknown}; the parts are {list(PARTS)}")
    return {
        name: PartResult(
            measured=part["measured"],
            machine=part["machine"],
            conditions=part["conditions"],
            rows=tuple(Row(**row) for row in part["rows"]),
        )
        for name, part in recorded.items()
    }


def render(parts: Mapping[str, PartResult]) -> str:
    """results.md: when and where each part was measured, then one table of every part's rows (in `PARTS` order)."""
    ordered = [(name, parts[name]) for name in PARTS if name in parts]
    lines = [
        "<!-- Written by `make bench` (benchmarks/results.py) from benchmarks/results.json: do not edit by hand. -->",
        "",
        "Each part's rows come from its latest run:",
        "",
    ]
    lines += [f"- **{name}**: {part.measured}, {part.machine}, {part.conditions}" for name, part in ordered]
    lines += ["", table([row for _, part in ordered for row in part.rows])]
    return "\n".join(lines) + "\n"


def record(
    measured: Mapping[str, PartResult], *, json_path: Path = RESULTS_JSON, markdown_path: Path = RESULTS_MD
) -> None:
    """Replace the measured parts' rows in `json_path` (the others stay as they were) and write `markdown_path`."""
    parts = {**load(json_path), **measured}
    ordered = {name: parts[name] for name in PARTS if name in parts}
    data = {
        name: {
            "measured": part.measured,
            "machine": part.machine,
            "conditions": part.conditions,
            "rows": [attrs.asdict(row) for row in part.rows],
        }
        for name, part in ordered.items()
    }
    json_path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    markdown_path.write_text(render(ordered))
