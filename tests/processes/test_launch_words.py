"""`trainplan launch`: what follows the script is the script's, the workers get what the plan was made from,
and nothing a worker started outlives a started job (review findings on issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.effects.launching import choose_free_port

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TRAINPLAN = [sys.executable, "-m", "trainplan.cli"]


def _environment(**extra: str) -> dict[str, str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINPLAN_", "SLURM_", "PET_", "TORCHELASTIC_", "MASTER_", "WORLD_", "RANK"))
        and key not in ("OMP_NUM_THREADS", "LOCAL_RANK", "NODE_RANK", "MYVAR")
    }
    environment.update(PYTHONPATH=str(ROOT), **extra)
    return environment


def _run(arguments: list[str], *, timeout: float = 90.0, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINPLAN, *arguments],
        cwd=ROOT,
        env=_environment(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


ABBREVIATIONS = ["--a", "1", "--p", "1", "--se", "1", "--local", "1", "--ma", "1", "--d", "1", "-q", "--m", "x"]
"""Each one a prefix of a trainplan or torchrun flag: they are the script's, not the launcher's."""


def test_words_after_the_script_are_the_scripts_even_when_they_abbreviate_launch_flags() -> None:
    for target in (["tests/scripts/argv_module.py"], ["-m", "tests.scripts.argv_module"]):
        launched = _run(["launch", "--quiet", "--devices", "1", *target, *ABBREVIATIONS])
        assert launched.returncode == 0, launched.stderr
        assert f"[rank 0] module __main__ args {ABBREVIATIONS!r} rank 0" in launched.stdout, launched.stdout
