"""One plan, one world: the same plain script under torchrun, `trainplan launch` and `trainplan.launch`.

The script (`tests/scripts/plain_world.py`) starts no workers: `trainplan.resolve()` must take the job's
layout (world size 2, its ranks, launcher `external`), `trainplan.join` must join that world, a metric
store must reduce exactly across the ranks, and `trainplan.launch` inside the job must run in place.
The emitted torchrun and sbatch forms are run for real on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainplan as tp
from tests import workers
from tests.scripts import plain_world
from trainplan.effects.launching import choose_free_port
from trainplan.render.emit import emit_kubeflow, emit_slurm, emit_torchrun, slurm_worker_line
from trainplan.resolve import resolve

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "tests/scripts/plain_world.py"
ENV_SCRIPT = "tests/scripts/env_world.py"
BIN = str(Path(sys.executable).parent)


def _environment(**extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINPLAN_", "SLURM_"))}
    environment.update(
        PATH=BIN + os.pathsep + environment.get("PATH", ""),
        PET_LOCAL_ADDR="127.0.0.1",  # torchrun's --local-addr: its rendezvous and MASTER_ADDR stay on loopback
        # The caller's own path after the root's (a checkout's src/ ahead of an installed copy).
        PYTHONPATH=os.pathsep.join(path for path in (str(ROOT), os.environ.get("PYTHONPATH", "")) if path),
    )
    environment.update(extra)
    return environment


def _run(command: list[str] | str, *, timeout: float = 90.0, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=ROOT,
        env=_environment(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        shell=isinstance(command, str),
        check=False,
    )


def _reports(output: str) -> list[dict[str, Any]]:
    # Workers share one stdout under torchrun, so two reports may interleave on a line: decode each from its tag.
    decoder = json.JSONDecoder()
    reports = [decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]]
    return sorted(reports, key=lambda report: int(report["rank"]))


def _check_world(reports: list[dict[str, Any]], cluster: str) -> None:
    assert [report["rank"] for report in reports] == [0, 1]
    assert [report["local_rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["world_size"] == 2 and report["group_size"] == 2 and report["group_rank"] == report["rank"]
        assert report["launcher"] == "external" and report["cluster"] == cluster
        # (1·1 + 2·2) / (1 + 2) and 1000 + 2000, on every rank.
        assert report["values"] == {"loss": pytest.approx(5 / 3), "tokens": 3000}
        assert report["in_place"], "trainplan.launch inside the job runs the function here"


def test_the_script_under_real_torchrun() -> None:
    port = str(choose_free_port("127.0.0.1"))
    result = _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port, SCRIPT]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    _check_world(_reports(result.stdout), "torchelastic")


def test_the_script_under_trainplan_launch() -> None:
    result = _run([sys.executable, "-m", "trainplan.cli", "launch", "--devices", "2", "--", SCRIPT])
    assert result.returncode == 0, result.stdout + result.stderr
    _check_world(_reports(result.stdout), "local")


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_the_script_through_trainplan_launch(strategy: str) -> None:
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy=strategy))  # type: ignore[arg-type]
    _check_world(tp.launch(plan, plain_world.main), "local")


def test_the_script_under_a_launcher_that_sets_torchs_env_variables_alone() -> None:
    # As DeepSpeed's launcher, torch.distributed.launch --use_env or a hand-written wrapper start them: RANK,
    # WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR/PORT, without TORCHELASTIC_RUN_ID or GROUP_RANK.
    port = str(choose_free_port("127.0.0.1"))
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    running = [
        subprocess.Popen(
            [sys.executable, SCRIPT],
            cwd=ROOT,
            env=_environment(**world, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=90) for process in running]
    assert all(process.returncode == 0 for process in running), outputs
    _check_world(_reports("".join(out for out, _ in outputs)), "torch_env")


def test_the_process_group_timeout_is_the_strategys() -> None:
    # Rank 1 reaches the collective only after 60 s; a 3 s group timeout must end rank 0's wait first.
    options = tp.DDPOptions(timeout_seconds=3)
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy="ddp_fork", strategy_options=options))
    with pytest.raises(tp.WorkerFailed) as caught:
        tp.launch(plan, workers.all_reduce_while_rank_1_sleeps, 60.0)
    assert caught.value.rank == 0 and "Timed out waiting 3000ms" in caught.value.traceback_text


def test_a_started_process_refuses_to_start_a_second_world() -> None:
    # Inside a worker, a plan that was not resolved there (it still says 'subprocess') must not start more.
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy="ddp_fork"))
    outcomes = tp.launch(plan, workers.launch_a_foreign_plan)
    for outcome in outcomes:
        assert outcome.startswith("NestedLaunch: ") and "a second world inside the first" in outcome


def test_the_emitted_torchrun_line_runs_twice_at_once_on_one_box() -> None:
    options = tp.DDPOptions(timeout_seconds=7)
    request = tp.Request(accelerator="cpu", devices=2, precision="bf16-mixed", strategy_options=options)
    plan = resolve(request, tp.Environment(cpu_count=2))
    line = emit_torchrun(plan, [SCRIPT])
    assert line.startswith("TRAINPLAN_REQUEST=") and " torchrun --standalone " in line
    first = subprocess.Popen(line, shell=True, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen(line, shell=True, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE, text=True)
    outputs = [process.communicate(timeout=90)[0] for process in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs
    for output in outputs:
        reports = _reports(output)
        _check_world(reports, "torchelastic")
        # The job honours the request's choices beyond the layout: its precision and the group's timeout.
        assert {(report["precision"], report["timeout"]) for report in reports} == {("bf16-mixed", 7)}


def test_the_emitted_sbatch_worker_line_runs_a_plain_env_script() -> None:
    # Two nodes of one process each, as srun starts one task per node: emulated on loopback.
    plan = resolve(
        tp.Request(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp"),
        tp.Environment(cpu_count=2, variables={"MASTER_ADDR": "127.0.0.1"}),
    )
    worker = slurm_worker_line(emit_slurm(plan, [ENV_SCRIPT]))
    port = str(choose_free_port("127.0.0.1"))
    tasks = []
    for task in range(2):
        srun = {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": "2",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_PROCID": str(task),
            "SLURM_STEP_ID": "0",  # an srun task (the batch script and salloc's shell have none)
            "SLURM_NODEID": str(task),
            "SLURM_LOCALID": "0",
            "SLURM_JOB_NODELIST": "localhost",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        tasks.append(
            subprocess.Popen(worker, shell=True, cwd=ROOT, env=_environment(**srun), stdout=subprocess.PIPE, text=True)
        )
    outputs = [task.communicate(timeout=90)[0] for task in tasks]
    assert all(task.returncode == 0 for task in tasks), outputs
    reports = _reports("".join(outputs))
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["sum"] == 3.0, "a real all_reduce over both nodes"
        assert report["plan"] == {"world_size": 2, "num_nodes": 2, "launcher": "external", "cluster": "torchelastic"}


def _readme_block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index(marker) :]
    start = after.index("```") + len("```")
    start = after.index("\n", start) + 1
    return after[start : after.index("```", start)]


def test_the_readme_script_runs_as_written_under_every_launcher(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(_readme_block("<!-- scaling-out:script -->"))
    commands = [line for line in _readme_block("<!-- scaling-out:commands -->").splitlines() if line.strip()]
    assert len(commands) == 3
    expected = [f"rank {rank} of 2: {{'loss': 1.6666666666666667, 'tokens': 3000}}" for rank in (0, 1)]
    for command in commands:
        result = subprocess.run(
            command,
            shell=True,
            cwd=tmp_path,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        for line in expected:
            assert line in result.stdout, (command, result.stdout, result.stderr)


def test_the_emitted_kubeflow_pods_form_one_world_with_a_plain_env_script() -> None:
    import yaml

    from tests.unit.test_emit import kubelet_command, operator_environment, pods

    plan = resolve(tp.Request(accelerator="cpu", num_nodes=2), tp.Environment(cpu_count=2))
    manifest = yaml.safe_load(emit_kubeflow(plan, [ENV_SCRIPT], image="img"))
    port = str(choose_free_port("127.0.0.1"))
    running = []
    for kind, index in pods(manifest):
        container = manifest["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"][0]
        pod = operator_environment(manifest, kind, index)
        pod.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # the master's service, on loopback here
        command = kubelet_command(container, pod)
        assert command[0] == "python"
        running.append(
            subprocess.Popen(
                [sys.executable, *command[1:]], cwd=ROOT, env=_environment(**pod), stdout=subprocess.PIPE, text=True
            )
        )
    outputs = [pod.communicate(timeout=90)[0] for pod in running]
    assert all(pod.returncode == 0 for pod in running), outputs
    reports = _reports("".join(outputs))
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["sum"] == 3.0, "a real all_reduce over both pods"
        assert report["plan"] == {"world_size": 2, "num_nodes": 2, "launcher": "external", "cluster": "kubeflow"}
