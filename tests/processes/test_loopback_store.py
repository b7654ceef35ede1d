"""A world on one node meets on loopback: rank 0's rendezvous store listens on 127.0.0.1 alone, also when the main
address is the node's name (every SLURM job names its first node, even a job of one node), never on every
interface. Under torchrun's agent store the store is torchrun's, and trainplan opens none.

Each world is real (two processes, gloo, an all-reduce); rank 0 reads the listening socket's address from
/proc/net/tcp* (`tests/scripts/listening_world.py`). Nothing connects to the store from outside.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainplan.effects.launching import choose_free_port

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening sockets from /proc/net/tcp"),
]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests/scripts/listening_world.py")
TIMEOUT = 90.0


def loopback_name() -> str | None:
    """A host name of this machine (not `localhost`, not an address) that resolves to loopback addresses only: the
    main address a one-node job names, kept on loopback. None when this machine has none."""
    candidates = [socket.gethostname()]
    with contextlib.suppress(OSError):
        for line in Path("/etc/hosts").read_text().splitlines():
            candidates += line.partition("#")[0].split()[1:]
    for name in candidates:
        if name == "localhost" or _is_address(name):
            continue
        try:
            found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if found and all(ipaddress.ip_address(str(entry[4][0])).is_loopback for entry in found):
            return name
    return None


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _environment(**extra: str) -> dict[str, str]:
    prefixes = ("TRAINPLAN_", "SLURM_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(prefixes)}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        environment.pop(name, None)
    environment.update(PATH=str(Path(sys.executable).parent) + os.pathsep + environment.get("PATH", ""))
    environment.update(PYTHONPATH=str(ROOT), **extra)
    return environment


def _reports(outputs: list[str]) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(part)[0] for output in outputs for part in output.split("REPORT ")[1:]]
    return sorted(reports, key=lambda report: int(report["rank"]))


def _run_ranks(variables: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One process per rank, each with its launcher's variables; every wait bounded, none left running."""
    running = [
        subprocess.Popen(
            [sys.executable, SCRIPT],
            cwd=ROOT,
            env=_environment(**rank),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in variables
    ]
    try:
        outputs = [process.communicate(timeout=TIMEOUT) for process in running]
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    assert all(process.returncode == 0 for process in running), outputs
    return _reports([out for out, _ in outputs])


def _srun_tasks(name: str, port: int) -> list[dict[str, str]]:
    """What srun sets in the two tasks of `srun -N1 --ntasks-per-node=2` on the node `name`."""
    job = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": name,
        "SLURM_NODELIST": name,
        "SLURM_STEP_NODELIST": name,
        "SLURMD_NODENAME": name,
        "MASTER_PORT": str(port),
    }
    return [{**job, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0"} for rank in (0, 1)]


def _torchrun_workers_without_agent_store(name: str, port: int) -> list[dict[str, str]]:
    """torchrun's variables for two workers of one node, its agent store switched off (the workers meet alone)."""
    shared = {
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": name,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "4242",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    return [{**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in (0, 1)]


JOBS = {"srun tasks": _srun_tasks, "torchrun workers without its agent store": _torchrun_workers_without_agent_store}


@pytest.mark.parametrize("job", list(JOBS))
def test_a_one_node_world_named_by_its_host_listens_on_loopback_only(job: str) -> None:
    name = loopback_name()
    if name is None:
        pytest.skip("no host name of this machine resolves to loopback only")
    port = choose_free_port("127.0.0.1")
    reports = _run_ranks(JOBS[job](name, port))
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["sum"] == 3.0, "a real all_reduce over both ranks"
        assert (report["num_nodes"], report["main_address"], report["main_port"]) == (1, name, port)
    assert reports[0]["listening"] == ["127.0.0.1"], "rank 0's store listens on loopback, not on every interface"


def test_under_torchruns_agent_store_the_store_is_torchruns() -> None:
    name = loopback_name()
    if name is None:
        pytest.skip("no host name of this machine resolves to loopback only")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    result = subprocess.run(
        [*command, f"--local-addr={name}", SCRIPT],
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = _reports([result.stdout])
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["sum"] == 3.0 and report["agent_store"] == "True" and report["main_address"] == name
    # Rank 0 opened no store of its own on torchrun's port (it would have failed with EADDRINUSE): the one
    # listening there is torchrun's.
    assert reports[0]["listening"], "torchrun's agent store listens on the main port"


def test_trainplan_launch_on_one_node_keeps_every_store_on_loopback() -> None:
    """The stores torch's elastic engine opens in `trainplan launch` (the c10d rendezvous's, and the agent's store
    the workers meet at) listen on 127.0.0.1 alone for a one-node world; torch's own would listen on every
    interface (`*`, read off torch 2.13 before this was fixed)."""
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--accelerator", "cpu", "--devices", "2", SCRIPT]
    result = subprocess.run(
        command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = _reports([result.stdout])
    assert [report["rank"] for report in reports] == [0, 1] and reports[0]["sum"] == 3.0
    stores = reports[0]["parent_listening"]
    assert len(stores) >= 2, f"the launcher's rendezvous store and agent store: {stores}"
    assert {store.rpartition(":")[0] for store in stores} == {"127.0.0.1"}, stores
    assert reports[0]["listening"] == ["127.0.0.1"], "the workers' main port is the agent store's, on loopback"
