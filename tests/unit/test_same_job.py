"""Two jobs that chose one port: a late rank of the second finds the first job's store and is refused at once with
both jobs named, instead of joining and waiting in its first collective (a real TCPStore pair on loopback)."""

from __future__ import annotations

import datetime

import pytest

from trainplan.effects.launching import choose_free_port
from trainplan.effects.world import JoinError, job_identity, same_job


def _stores() -> tuple[object, object]:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    port = choose_free_port("127.0.0.1")
    timeout = datetime.timedelta(seconds=20)
    server = TCPStore("127.0.0.1", port, 2, True, timeout, wait_for_workers=False)
    client = TCPStore("127.0.0.1", port, 2, False, timeout)
    return server, client


def test_a_rank_of_the_same_job_meets_its_store() -> None:
    server, client = _stores()
    job = job_identity({"SLURM_JOB_ID": "177", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0"})
    assert job == "SLURM_JOB_ID=177;SLURM_STEP_ID=1", "what all ranks share, not a rank's own"
    same_job(server, 0, job, "127.0.0.1:1")
    same_job(client, 1, job_identity({"SLURM_JOB_ID": "177", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1"}), "x")


def test_a_rank_of_another_job_on_the_same_port_is_refused_with_both_named() -> None:
    server, client = _stores()
    same_job(server, 0, job_identity({"SLURM_JOB_ID": "177", "SLURM_STEP_ID": "1"}), "127.0.0.1:16186")
    with pytest.raises(JoinError, match=r"belongs to another job \(SLURM_JOB_ID=177;SLURM_STEP_ID=1\).*1186"):
        same_job(client, 1, job_identity({"SLURM_JOB_ID": "1186", "SLURM_STEP_ID": "0"}), "127.0.0.1:16186")


def test_launchers_without_a_job_variable_are_not_compared_apart() -> None:
    server, client = _stores()
    same_job(server, 0, job_identity({}), "h:1")
    same_job(client, 1, job_identity({"PMI_RANK": "1"}), "h:1")
