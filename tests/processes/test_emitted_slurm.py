"""The emitted sbatch script under a real SLURM, submitted as it is (`tests/cluster/engines.sh start` makes one of
two nodes on this machine, with task/affinity so CPU binding is real). Skipped where there is no `srun`.

- Each worker of a node has CPUs of its own: the one task per node asks for a CPU per worker and srun passes them
  on (without them SLURM binds every worker of the node to one CPU).
- `--job-name` names the job.
- A node that fails stops the others (`srun --kill-on-bad-exit=1`), and the job's exit code is what the script's
  note says: not the worker's, but torchrun's 1 or the stopped node's 137/143.
- A one-node srun world, whose main address is the node's name, meets on a store that listens on loopback only.

Every wait is bounded: the jobs by `sbatch --time`, the test's wait by a deadline, after which it cancels the job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),  # beyond the wait for a job (JOB_WAIT), which may queue behind others' jobs
    pytest.mark.skipif(
        shutil.which("srun") is None or shutil.which("sbatch") is None, reason="needs SLURM (srun and sbatch)"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = str(ROOT / "tests/scripts/emitted_job.py")
LISTENING_SCRIPT = str(ROOT / "tests/scripts/listening_world.py")
BIN = str(Path(sys.executable).parent)
JOB_WAIT = 200.0
"""Seconds a test waits for its job to end (a job runs for seconds, most of them importing torch; it may queue)."""
JOB_TIME_LIMIT = "5"
"""Minutes SLURM lets a test's job run (`sbatch --time`) before it stops it, whatever the test does."""
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
EXIT_BARRIER = 300.0
"""torchrun's exit barrier: how long a node whose workers finished waits for the others."""


def _environment(**extra: str) -> dict[str, str]:
    """This session's environment for a job: no SLURM or trainplan variables of its own, this interpreter's scripts
    (`trainplan`, `torchrun`) first on PATH, the repository importable."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINPLAN_", "SLURM_"))}
    environment.update(PATH=BIN + os.pathsep + environment.get("PATH", ""), PYTHONPATH=str(ROOT), **extra)
    return environment


def _run(command: list[str], *, timeout: float = 60.0, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, env=_environment(**extra), capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def nodes() -> int:
    """The number of nodes SLURM runs jobs on here (skipped when it runs none)."""
    try:
        ready = _run(["srun", "-N1", "-n1", f"--time={JOB_TIME_LIMIT}", "true"], timeout=60)
        listed = _run(["sinfo", "-h", "-o", "%D"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.skip("SLURM did not run a one-task job within 60 s")
    if ready.returncode != 0 or listed.returncode != 0:
        pytest.skip(f"SLURM does not run jobs here: {(ready.stderr or listed.stderr).strip()}")
    return sum(int(count) for count in listed.stdout.split() if count.isdigit())


def _emit(tmp_path: Path, *flags: str) -> Path:
    result = _run(["trainplan", "plan", "--accelerator", "cpu", *flags, "--emit", "slurm", "--", JOB_SCRIPT])
    assert result.returncode == 0, result.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(result.stdout)
    return script


def _job(fields: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", fields))


def _submit_and_wait(script: Path, **extra: str) -> tuple[dict[str, str], str]:
    """sbatch the script as it is: its final record (`scontrol show job`) and its output."""
    output = script.with_suffix(".out")
    submitted = _run(
        ["sbatch", "--parsable", f"--time={JOB_TIME_LIMIT}", f"--output={output}", str(script)], timeout=60, **extra
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_WAIT
    record: dict[str, str] = {}
    try:
        while time.monotonic() < deadline:
            shown = _run(["scontrol", "show", "job", "-o", job_id], timeout=30)
            assert shown.returncode == 0, f"job {job_id} is gone from scontrol before it was seen ending"
            record = _job(shown.stdout)
            if record.get("JobState") in TERMINAL:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"job {job_id} did not end within {JOB_WAIT:.0f} s (state {record.get('JobState')})")
    finally:
        if record.get("JobState") not in TERMINAL:
            _run(["scancel", job_id], timeout=30)
    return record, output.read_text() if output.exists() else ""


def _seconds(run_time: str) -> int:
    """SLURM's RunTime, [days-][hours:]minutes:seconds, in seconds."""
    days, _, clock = run_time.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def _reports(output: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]]
    return sorted(reports, key=lambda report: int(report["rank"]))


def _cpus_each() -> int:
    """CPUs each of two workers of a node can have: two, where this machine has them."""
    return min(2, len(os.sched_getaffinity(0)))


def test_each_worker_of_the_emitted_one_node_job_has_its_cpus_and_the_job_its_name(nodes: int, tmp_path: Path) -> None:
    script = _emit(tmp_path, "--devices", "2", "--job-name", "tp-emitted-cpus")
    record, output = _submit_and_wait(script)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert record["JobName"] == "tp-emitted-cpus" and record["NumCPUs"] == "2", record
    reports = _reports(output)
    assert [report["rank"] for report in reports] == [0, 1], output
    for report in reports:
        assert report["sum"] == 3.0 and report["job_name"] == "tp-emitted-cpus"
        assert len(report["cpus"]) >= _cpus_each(), f"each worker may run on its own CPUs: {reports}"
    if _cpus_each() > 1:
        assert not all(report["cpus"] == [0] for report in reports), "both workers bound to CPU 0"


def test_the_emitted_two_node_job_forms_one_world_with_the_cpus_of_its_workers(nodes: int, tmp_path: Path) -> None:
    if nodes < 2:
        pytest.skip(f"SLURM runs {nodes} node(s) here; the job needs 2")
    script = _emit(tmp_path, "--devices", "2", "--num-nodes", "2")
    record, output = _submit_and_wait(script)
    assert (record["JobState"], record["ExitCode"], record["NumNodes"]) == ("COMPLETED", "0:0", "2"), output
    reports = _reports(output)
    assert [report["rank"] for report in reports] == [0, 1, 2, 3], output
    assert len({report["node"] for report in reports}) == 2, "two workers on each of the two nodes"
    for report in reports:
        assert report["sum"] == 10.0 and len(report["cpus"]) >= _cpus_each(), reports


@pytest.mark.parametrize("failing_node", [0, 1])
def test_a_failing_node_stops_the_emitted_job_with_the_exit_code_its_note_names(
    nodes: int, tmp_path: Path, failing_node: int
) -> None:
    if nodes < 2:
        pytest.skip(f"SLURM runs {nodes} node(s) here; the job needs 2")
    script = _emit(tmp_path, "--devices", "2", "--num-nodes", "2")
    record, output = _submit_and_wait(script, EMITTED_EXIT_NODE=str(failing_node), EMITTED_EXIT_CODE="7")
    # The other node's workers finished: without --kill-on-bad-exit its torchrun would wait out the exit barrier.
    ran = _seconds(record["RunTime"])
    assert ran < EXIT_BARRIER / 3, f"the job held its nodes for {ran} s after a node failed:\n{output}"
    # The script's note: srun's exit code is its tasks' highest, not the worker's: the failed node's torchrun's 1,
    # or 137/143 for the node SLURM stopped (SIGKILL/SIGTERM). The log shows the worker's 7.
    assert record["JobState"] == "FAILED" and record["ExitCode"] in ("1:0", "137:0", "143:0"), (record, output)
    assert re.search(r"exitcode\s*:\s*7\b", output), output


def test_a_one_node_srun_world_named_by_its_node_listens_on_loopback_only(nodes: int) -> None:
    command = ["srun", "-N1", "--ntasks-per-node=2", f"--time={JOB_TIME_LIMIT}", sys.executable, LISTENING_SCRIPT]
    result = _run(command, timeout=JOB_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = _reports(result.stdout)
    assert [report["rank"] for report in reports] == [0, 1], result.stdout + result.stderr
    main = reports[0]
    assert main["cluster"] == "slurm" and main["num_nodes"] == 1 and main["sum"] == 3.0, main
    assert main["main_address"] not in ("localhost", "127.0.0.1"), "SLURM names the node: the case under test"
    assert main["listening"] == ["127.0.0.1"], "rank 0's store listens on loopback, not on every interface"
