"""`trainplan launch --max-restarts` recovers a world whose rank failed once, whenever it failed: each attempt
meets in a store of its own, so a restarted rank never reads the keys its failed attempt left (torch's shared
store makes a restart after a mid-run failure fail with `connectFullMesh ... refused`, or hang)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_environment
from trainplan.effects.elastic import FRESH_STORE_VARIABLE, EngineOptions, _fresh_store_per_attempt, _Meeting

ROOT = Path(__file__).resolve().parents[2]


def _meeting(backend: str) -> _Meeting:
    return _Meeting(backend, "127.0.0.1:0", "trainplan-1", 0, None)


def test_only_a_restartable_c10d_world_is_given_a_store_per_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FRESH_STORE_VARIABLE, raising=False)
    restarts = EngineOptions(max_restarts=1)
    assert _fresh_store_per_attempt(restarts, _meeting("c10d"), {}) == {FRESH_STORE_VARIABLE: "1"}
    assert _fresh_store_per_attempt(EngineOptions(), _meeting("c10d"), {}) == {}
    assert _fresh_store_per_attempt(restarts, _meeting("static"), {}) == {}  # torch has no such switch there
    assert _fresh_store_per_attempt(restarts, _meeting("c10d"), {FRESH_STORE_VARIABLE: "0"}) == {}
    monkeypatch.setenv(FRESH_STORE_VARIABLE, "0")  # the caller's own choice stands
    assert _fresh_store_per_attempt(restarts, _meeting("c10d"), {}) == {}


@pytest.mark.processes
@pytest.mark.parametrize("phase", ["mid-run", "end"])
def test_a_world_whose_rank_failed_mid_run_or_at_the_end_recovers_on_restart(phase: str) -> None:
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--accelerator", "cpu", "--devices", "2"]
    command += ["--max-restarts", "1", "--timeout", "120", "tests/scripts/restart_phases.py"]
    environment = {key: value for key, value in child_environment().items() if key != FRESH_STORE_VARIABLE}
    ran = subprocess.run(
        command,
        cwd=ROOT,
        env={**environment, "RESTART_PHASE": phase},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "[rank 0] RECOVERED 0 4.0" in ran.stdout and "[rank 1] RECOVERED 1 4.0" in ran.stdout
    assert "trainplan: restarting the workers (restart 1 of 1)" in ran.stderr
