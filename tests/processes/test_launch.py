"""launch(): real worker processes and real gloo collectives on CPU, and every failure mode."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests import workers
from trainplan import (
    Environment,
    LaunchTimeout,
    NotImportable,
    Plan,
    Request,
    WorkerFailed,
    launch,
    launch_with,
)
from trainplan.resolve import resolve

pytestmark = pytest.mark.processes
ROOT = Path(__file__).resolve().parents[2]
CPU = Environment(cpu_count=4)


def cpu_plan(strategy: str = "ddp", devices: int = 2, **facts: object) -> Plan:
    env = Environment(cpu_count=4, **facts)  # type: ignore[arg-type]
    return resolve(Request(accelerator="cpu", strategy=strategy, devices=devices), env)  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def recorded_pids(directory: Path) -> list[int]:
    return [int(path.read_text()) for path in directory.glob("*.pid")]


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork"])
def test_each_launcher_runs_a_real_collective(strategy: str) -> None:
    plan = cpu_plan(strategy)
    assert plan.launcher in ("subprocess", "spawn", "fork")
    assert launch(plan, workers.all_reduce_rank) == [(0, 2, 3.0), (1, 2, 3.0)]


def test_workers_get_the_environment_arguments_and_their_plan() -> None:
    plan = cpu_plan("ddp_fork")
    environments = launch(plan, workers.environment)
    assert [env["RANK"] for env in environments] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in environments} == {"2"}
    assert {env["MASTER_ADDR"] for env in environments} == {"127.0.0.1"}
    assert launch(plan, workers.add, 1, 2, scale=3) == [9, 9]
    assert launch(plan, workers.my_plan) == [(0, 0, "ddp_fork"), (1, 1, "ddp_fork")]


def test_a_spawned_worker_takes_a_rule_set_as_an_argument() -> None:
    """A rule set pickles: `launch` hands a downstream one to spawned workers, who resolve with it."""
    from tests.downstream_rules import RULES

    plan = cpu_plan("ddp_spawn")
    assert plan.launcher == "spawn"
    assert launch(plan, workers.plan_with_rules, RULES) == [("tests.downstream_rules:RULES", "npu", True)] * 2


def test_inline_plan_runs_in_this_process() -> None:
    plan = resolve(Request(accelerator="cpu"), CPU)
    assert plan.launcher == "none"
    before = os.environ.get("RANK")
    assert launch(plan, workers.environment)[0]["RANK"] == "0"
    assert launch(plan, os.getpid) == [os.getpid()]
    assert os.environ.get("RANK") == before, "the inline run restores the environment"


def test_a_raising_worker_stops_its_siblings(tmp_path: Path) -> None:
    plan = cpu_plan("ddp_fork", devices=3)
    with pytest.raises(WorkerFailed) as caught:
        launch(plan, workers.fail_after_siblings_started, str(tmp_path), 1)
    failure = caught.value
    assert failure.rank == 1 and "ValueError: rank 1 refuses" in failure.traceback_text
    assert "rank 1" in str(failure) and "rank 1 refuses" in str(failure)
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3 and not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_worker_that_exits_non_zero(strategy: str) -> None:
    with pytest.raises(WorkerFailed) as caught:
        launch_with(cpu_plan(strategy), workers.exit_on_rank, args=(0, 3), grace_period=1)
    assert (caught.value.rank, caught.value.exitcode, caught.value.signal_name) == (0, 3, None)
    assert "exited with code 3" in str(caught.value)


def test_a_worker_killed_by_a_signal() -> None:
    with pytest.raises(WorkerFailed) as caught:
        launch_with(cpu_plan("ddp_fork"), workers.kill_on_rank, args=(1,), grace_period=1)
    assert (caught.value.rank, caught.value.signal_name) == (1, "SIGKILL")


def test_a_world_that_overruns_its_timeout_is_stopped(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(LaunchTimeout):
        launch_with(cpu_plan("ddp_fork"), workers.write_pid_and_hang, args=(str(tmp_path),), timeout=3, grace_period=1)
    assert time.monotonic() - started < 30
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_unpicklable_result_is_reported() -> None:
    with pytest.raises(WorkerFailed, match="could not be sent back"):
        launch(cpu_plan("ddp_fork"), workers.unpicklable_result)


def test_functions_a_fresh_interpreter_cannot_import() -> None:
    with pytest.raises(NotImportable, match="lambda"):
        launch(cpu_plan("ddp"), lambda: 1)
    with pytest.raises(NotImportable, match="spawn"):
        launch(cpu_plan("ddp_spawn"), lambda: 1)

    def nested() -> int:
        return 2

    with pytest.raises(NotImportable, match="inside another function"):
        launch(cpu_plan("ddp"), nested)
    assert launch(cpu_plan("ddp_fork"), nested) == [2, 2]  # fork needs no import


def test_a_taken_port_is_retried() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        chosen: list[int] = []

        def chooser(address: str) -> int:
            port = busy if not chosen else _free_port()
            chosen.append(port)
            return port

        assert launch_with(cpu_plan("ddp_fork"), workers.all_reduce_rank, choose_port=chooser)[0][2] == 3.0
        assert chosen[0] == busy and len(chosen) == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_two_nodes_over_loopback_form_one_world() -> None:
    port = _free_port()
    plans = [
        resolve(
            Request(accelerator="cpu", strategy="ddp_fork", devices=2, num_nodes=2),
            Environment(
                cpu_count=4,
                variables={"NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
            ),
        )
        for node in (0, 1)
    ]
    results: dict[int, list[tuple[int, int, float]]] = {}

    def node(rank: int) -> None:
        results[rank] = launch_with(plans[rank], workers.all_reduce_rank, timeout=120)

    second = threading.Thread(target=node, args=(1,))
    second.start()
    node(0)
    second.join(150)
    assert results[0] == [(0, 4, 10.0), (1, 4, 10.0)]
    assert results[1] == [(2, 4, 10.0), (3, 4, 10.0)]


def _run_launcher_then_signal(tmp_path: Path, signal_number: int) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests import workers
        from trainplan import Environment, Request, launch
        from trainplan.resolve import resolve

        if __name__ == "__main__":
            plan = resolve(Request(accelerator="cpu", strategy="ddp_spawn", devices=2), Environment(cpu_count=4))
            launch(plan, workers.write_pid_and_hang, {str(tmp_path)!r})
        """
    )
    script = tmp_path / "caller.py"
    script.write_text(code)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(recorded_pids(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(recorded_pids(tmp_path)) == 2, "the workers did not start"
    process.send_signal(signal_number)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), recorded_pids(tmp_path)


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_caller_stops_the_workers(tmp_path: Path, signal_number: int) -> None:
    result, pids = _run_launcher_then_signal(tmp_path, signal_number)
    assert result.returncode != 0
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("depth", ["short", "deep"])
def test_no_temporary_files_are_left(depth: str, tmp_path: Path) -> None:
    # "deep": a TMPDIR too long for the forkserver's unix socket (108 bytes): ddp_spawn starts its workers unserved.
    short = Path(tempfile.mkdtemp(prefix="tp-", dir="/tmp")) if Path("/tmp").is_dir() else tmp_path
    scratch = short / "tmp" if depth == "short" else short / ("d" * 60) / ("e" * 60)
    scratch.mkdir(parents=True)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests import workers
        from trainplan import Environment, Request, launch
        from trainplan.resolve import resolve

        if __name__ == "__main__":
            for strategy in ("ddp", "ddp_spawn", "ddp_fork"):
                plan = resolve(Request(accelerator="cpu", strategy=strategy, devices=2), Environment(cpu_count=4))
                assert launch(plan, workers.add, 1, 1) == [2, 2]
        """
    )
    script = tmp_path / "caller.py"
    script.write_text(code)
    environment = {**os.environ, "TMPDIR": str(scratch)}
    result = subprocess.run(
        [sys.executable, str(script)], env=environment, capture_output=True, text=True, timeout=180, check=False
    )
    try:
        assert result.returncode == 0, result.stderr
        assert list(scratch.iterdir()) == []
    finally:
        if short != tmp_path:
            shutil.rmtree(short, ignore_errors=True)


def test_cli_launch_runs_a_torchrun_style_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch, torch.distributed as dist
            dist.init_process_group("gloo")
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            print("sum", value.item(), "args", sys.argv[1:])
            rank = dist.get_rank()
            dist.destroy_process_group()
            if "--fail" in sys.argv and rank == 1:
                sys.exit(7)
            """
        )
    )
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--no-probe", "--accelerator", "cpu", "--devices", "2"]
    result = subprocess.run(
        [*command, "--", str(script), "--lr", "1"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[rank 0] sum 3.0 args ['--lr', '1']" in result.stdout
    assert "[rank 1] sum 3.0 args ['--lr', '1']" in result.stdout
    failing = subprocess.run(
        [*command, "--", str(script), "--fail"], capture_output=True, text=True, timeout=120, check=False
    )
    assert failing.returncode == 7
    assert "worker rank 1 failed" in failing.stderr  # trainplan's own lines go to stderr


def test_a_plan_of_a_downstream_rule_set_launches() -> None:
    """Its workers read the plan back against the rule set it records (DeepSpeed on CPU: a replaced family row)."""
    from tests.downstream_rules import RULES, STATIC_DEEPSPEED

    env = Environment(cpu_count=4, packages=frozenset({"deepspeed"}))
    plan = resolve(Request(accelerator="cpu", strategy=STATIC_DEEPSPEED, devices=2), env, RULES)
    assert (plan.strategy.family, plan.launcher) == ("deepspeed", "subprocess")
    assert launch(plan, workers.all_reduce_rank) == [(0, 2, 3.0), (1, 2, 3.0)]
