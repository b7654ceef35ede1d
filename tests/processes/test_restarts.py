"""`trainplan launch --max-restarts` recovers a world whose rank failed once, whenever it failed: each attempt
meets in an agent store of its own (a new one each round of the rendezvous), so a restarted rank never reads the
keys its failed attempt left; torch's one shared store makes a restart after a mid-run failure fail with
`connectFullMesh ... refused`, or hang. The store of each attempt stays on loopback on one node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_environment
from tests.processes.test_loopback_store import SCRIPT as LISTENING_WORLD
from tests.processes.test_loopback_store import _environment, _reports
from trainplan.effects.elastic import _fresh_store_per_round

pytestmark = pytest.mark.processes
ROOT = Path(__file__).resolve().parents[2]


def test_only_a_world_that_may_restart_has_its_rendezvous_patched() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    original = DynamicRendezvousHandler.next_rendezvous
    with _fresh_store_per_round(False):
        assert DynamicRendezvousHandler.next_rendezvous is original
    with _fresh_store_per_round(True):
        assert DynamicRendezvousHandler.next_rendezvous is not original
    assert DynamicRendezvousHandler.next_rendezvous is original


@pytest.mark.parametrize("phase", ["mid-run", "end"])
def test_a_world_whose_rank_failed_mid_run_or_at_the_end_recovers_on_restart(phase: str) -> None:
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--accelerator", "cpu", "--devices", "2"]
    command += ["--max-restarts", "1", "--timeout", "120", "tests/scripts/restart_phases.py"]
    ran = subprocess.run(
        command,
        cwd=ROOT,
        env=child_environment(RESTART_PHASE=phase),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "[rank 0] RECOVERED 0 4.0" in ran.stdout and "[rank 1] RECOVERED 1 4.0" in ran.stdout
    assert "trainplan: restarting the workers (restart 1 of 1)" in ran.stderr


def test_a_world_that_may_restart_keeps_its_stores_on_loopback() -> None:
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--accelerator", "cpu", "--devices", "2"]
    command += ["--max-restarts", "1", LISTENING_WORLD]
    result = subprocess.run(
        command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=90, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = _reports([result.stdout])
    stores = reports[0]["parent_listening"]
    assert len(stores) >= 2 and {store.rpartition(":")[0] for store in stores} == {"127.0.0.1"}, stores
    assert reports[0]["listening"] == ["127.0.0.1"], "the workers meet at the agent store, on loopback"
