"""How often `--max-restarts 1` recovers a 2-worker CPU world whose rank 1 fails once, for `trainplan launch` and
plain `torchrun`: `python -m benchmarks.bench_restarts [RUNS]` (default 5 runs per case; slow: a run that hangs
costs its whole limit).

Rank 1 fails (exit 3) in the first attempt only, at one of three moments (`tests/scripts/restart_phases.py`); the
second attempt runs the same script to the end:

- `start-up`: at once, while rank 0 is inside `init_process_group`;
- `mid-run`: after one all_reduce, while rank 0 waits in the next collective;
- `end`: after the work and `destroy_process_group`, as the script ends.

A run recovered when it exits 0 and both ranks of the second attempt report the reduced value; it failed when it
exits otherwise; it hung when it is still running after `LIMIT` seconds (`trainplan launch --timeout` ends it
with 124; torchrun, which has no such option, is killed). Not part of a plain `python -m benchmarks` (minutes
per run on a busy machine): the rates go to docs/reliability.md (the Reliability page).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

RUNS = 5
LIMIT = 60
CASES = ("start-up", "mid-run", "end")
SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "restart_phases.py"


def _commands(script: Path) -> list[tuple[str, list[str]]]:
    ours = [sys.executable, "-m", "trainplan.cli", "launch", "--quiet", "--accelerator", "cpu", "--devices", "2"]
    ours += ["--max-restarts", "1", "--timeout", str(LIMIT), str(script)]
    theirs = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    theirs += ["--max-restarts", "1", str(script)]
    return [("trainplan launch", ours), ("torchrun", theirs)]


def _kill_marked(mark: str) -> None:
    """Kill every process whose environment carries `mark`: the workers of a hung run, which torch's engine starts
    in sessions of their own (so killing the launcher's process group leaves them, holding its output pipe)."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


MARK_VARIABLE = "BENCH_RESTARTS_RUN"


def _outcome(command: list[str], phase: str, cwd: str) -> str:
    mark = uuid.uuid4().hex
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "RESTART_PHASE": phase, MARK_VARIABLE: mark},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=LIMIT + 15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _kill_marked(mark)
        output = process.communicate()[0]
        outcome = "hung"
    else:
        _kill_marked(mark)  # anything the run left behind, so it cannot slow the next one
        recovered = process.returncode == 0 and output.count("RECOVERED") == 2 and "4.0" in output
        outcome = "hung" if process.returncode == 124 else "recovered" if recovered else "failed"
    logs = os.environ.get("BENCH_RESTARTS_LOGS")  # a folder to keep the output of every run that did not recover
    if logs and outcome != "recovered":
        kept = Path(logs) / f"{phase}-{outcome}-{process.pid}.txt"
        kept.write_text(f"{command}\nexit {process.returncode}\n{output}")
    return outcome


def measure(runs: int = RUNS) -> dict[tuple[str, str], Counter[str]]:
    """Per (launcher, phase): how many of `runs` recovered, failed or hung (the launchers alternate)."""
    results: dict[tuple[str, str], Counter[str]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        commands = _commands(SCRIPT)
        # Round by round over every case (not case by case), so that a run cut short still covers each of them.
        for _ in range(runs):
            for phase in CASES:
                for launcher, command in commands:
                    outcome = _outcome(command, phase, scratch)
                    results.setdefault((launcher, phase), Counter())[outcome] += 1
                    print(f"{launcher:16} {phase:9} {outcome}", file=sys.stderr, flush=True)
    return results


def table(results: dict[tuple[str, str], Counter[str]]) -> str:
    lines = ["| failure of rank 1 | launcher | recovered | failed | hung |", "|---|---|---|---|---|"]
    for (launcher, phase), counts in results.items():
        total = sum(counts.values())
        lines.append(
            f"| {phase} | {launcher} | {counts['recovered']}/{total} | {counts['failed']}/{total} | "
            f"{counts['hung']}/{total} |"
        )
    return "\n".join(lines)


def main(arguments: list[str] | None = None) -> None:
    given = sys.argv[1:] if arguments is None else arguments
    if len(given) > 1 or (given and not (given[0].isascii() and given[0].isdigit() and int(given[0]) > 0)):
        raise SystemExit("usage: python -m benchmarks.bench_restarts [RUNS]  (RUNS: runs per case, a whole number > 0)")
    print(table(measure(int(given[0]) if given else RUNS)))


if __name__ == "__main__":
    main()
