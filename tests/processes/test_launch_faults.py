"""Launch faults from the reliability review, each with real processes: grandchildren, a closed stdout, a
lingering worker, a second Ctrl-C, results and arguments that do not travel, bad numbers, a module in the
working directory, the rendezvous store's address, and the handlers a forked worker inherits."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import trainplan as tp
from tests import workers
from tests.helpers import alive, child_environment
from trainplan.cli import main as cli_main
from trainplan.effects.launching import LaunchError, NotImportable, choose_free_port
from trainplan.resolve import resolve

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = ["ddp_fork", "ddp_spawn", "ddp"]  # fork, spawn, subprocess


def cpu_plan(strategy: str = "ddp_fork", devices: int = 2) -> tp.Plan:
    return resolve(tp.Request(accelerator="cpu", strategy=strategy, devices=devices), tp.Environment(cpu_count=2))  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", LAUNCHERS)
def test_no_grandchild_outlives_launch(strategy: str) -> None:
    pids = tp.launch(cpu_plan(strategy), workers.start_a_sleeper)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_no_grandchild_outlives_trainplan_launch(tmp_path: Path) -> None:
    record = tmp_path / "pids"
    code = (
        "import subprocess, os; "
        f"open({str(record)!r}, 'a').write(str(subprocess.Popen(['sleep', '300']).pid) + chr(10))"
    )
    assert cli_main(["launch", "--accelerator", "cpu", "--devices", "2", "--", "-c", code]) == 0
    pids = [int(line) for line in record.read_text().split()]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_a_closed_stdout_never_deadlocks_trainplan_launch() -> None:
    # One line of code: the shell passes it as it is (a "\\n" inside it would be a syntax error in the workers).
    noisy = "[print('line', i) for i in range(200000)]"
    command = f"{sys.executable} -m trainplan.cli launch --devices 2 -- -c {noisy!r} | head -2"
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        cwd=ROOT,
        check=False,
    )
    assert result.stdout.splitlines()[0].endswith("] line 0") and result.stdout.count("line") == 2, result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def test_the_deadline_covers_workers_that_linger_after_returning() -> None:
    with pytest.raises(tp.LaunchTimeout, match="returned its result but had not exited"):
        tp.launch_with(cpu_plan("ddp_fork"), workers.return_then_linger, timeout=3, grace_period=1)


def _pids_from(record: Path, count: int, caller: subprocess.Popen[str] | None = None) -> list[int]:
    """The pids `count` workers wrote to `record`, waiting (bounded: a loaded machine imports torch slowly)."""
    deadline = time.monotonic() + 120
    while not (record.exists() and len(record.read_text().split()) >= count):
        if caller is not None and caller.poll() is not None:
            pytest.fail(f"the caller exited ({caller.returncode}) before its workers started")
        if time.monotonic() > deadline:
            pytest.fail(f"{count} workers did not start within 120 s")
        time.sleep(0.05)
    return [int(line) for line in record.read_text().split()]


@pytest.mark.parametrize("how", ["library", "cli"])
def test_a_second_ctrl_c_during_the_grace_period_stops_everything(how: str, tmp_path: Path) -> None:
    record = tmp_path / "pids"
    script = str(ROOT / "tests" / "scripts" / "stubborn_workers.py")
    if how == "library":
        command = [sys.executable, script, str(record), "library"]
    else:
        command = [sys.executable, "-m", "trainplan.cli", "launch", "--devices", "2", "--grace-period", "30"]
        command += ["--", script, str(record), "cli-inner"]
    caller = subprocess.Popen(
        command, env=child_environment(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    pids = _pids_from(record, 2, caller)
    assert len(pids) == 2
    caller.send_signal(signal.SIGINT)
    time.sleep(1.0)
    caller.send_signal(signal.SIGINT)  # the grace period is 30 s: only the second Ctrl-C ends it
    try:
        _, stderr = caller.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        caller.kill()
        pytest.fail("the caller did not exit after a second Ctrl-C")
    for _ in range(100):
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids), "a stubborn worker was left running"
    if how == "cli":
        assert caller.returncode == 130 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp"])
def test_a_result_that_cannot_be_rebuilt_is_a_worker_failure(strategy: str) -> None:
    with pytest.raises(tp.WorkerFailed, match="could not be read back in the caller") as caught:
        tp.launch(cpu_plan(strategy), workers.return_unloadable)
    assert "this result cannot be rebuilt" in caught.value.traceback_text


def test_arguments_the_subprocess_launcher_cannot_send_are_not_importable() -> None:
    generator = (item for item in range(0))
    unsendable: list[object] = [threading.Lock(), lambda: 1, generator]
    for argument in unsendable:
        with pytest.raises(NotImportable, match="could not send the arguments"):
            tp.launch_with(cpu_plan("ddp"), workers.add, args=(argument, 1))


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": math.nan}, "timeout=nan"),
        ({"timeout": math.inf}, "timeout=inf"),
        ({"timeout": 0}, "timeout=0"),
        ({"grace_period": "5"}, "grace_period='5'"),
        ({"grace_period": None}, "grace_period=None"),
        ({"grace_period": math.nan}, "grace_period=nan"),
        ({"kwargs": [1]}, "kwargs=[1]"),
        ({"args": 5}, "args=5"),
    ],
)
def test_bad_launch_options_are_refused_before_anything_starts(options: dict[str, object], words: str) -> None:
    with pytest.raises(LaunchError, match=words.replace("[", r"\[").replace("]", r"\]")):
        tp.launch_with(cpu_plan(), os.getpid, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arguments",
    [
        ["launch", "--timeout", "nan", "--", "x.py"],
        ["launch", "--grace-period", "inf", "--", "x.py"],
        ["gpus", "--timeout", "nan"],
        ["launch", "--no-probe", "--", "/nonexistent_binary_xyz"],
        ["launch", "--no-probe", "--", "/etc"],  # a directory is no script (a file is run as one, as torchrun)
        ["launch", "--no-probe", "--", ""],
        ["launch", "-1", ""],  # not an option of the interpreter (torch's engine would fail on the empty word)
    ],
)
def test_the_cli_refuses_bad_launches_with_a_message(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli_main(arguments)
    assert caught.value.code == 2
    assert capsys.readouterr().err.startswith("trainplan: error: ")


def test_a_probe_timeout_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(tp.InvalidRequest, match="finite, positive number of seconds"):
        tp.find_usable_cuda_devices(1, timeout=math.nan)


def test_a_port_is_never_chosen_on_another_machines_address() -> None:
    # Binding is local: nothing is sent anywhere. 192.0.2.1 is a documentation address this machine lacks.
    for address in ("192.0.2.1", "[::1]"):
        try:
            choose_free_port(address)
        except LaunchError as error:
            assert "not an address of this machine" in str(error)


def test_the_subprocess_launcher_never_imports_from_the_working_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "attrs.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'a').write('imported\\n')\n")
    caller = tmp_path / "caller.py"
    caller.write_text(
        "import os, trainplan as tp\n"
        "plan = tp.resolve(tp.Request(accelerator='cpu', devices=2, strategy='ddp'))\n"
        "print(len(tp.launch(plan, os.getpid)))\n"
    )
    result = subprocess.run(
        [sys.executable, str(caller)],
        cwd=shared,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "2", result.stderr
    assert not (tmp_path / "PWNED").exists(), "a worker imported attrs.py from the working directory"


@pytest.mark.parametrize("strategy", LAUNCHERS)
def test_the_rendezvous_store_listens_on_loopback_only(strategy: str) -> None:
    found = tp.launch(cpu_plan(strategy), workers.listening_addresses)[0]
    assert found, "rank 0 hosts the store on MASTER_PORT"
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc writes them
    assert set(found) <= loopback, found


def test_a_forked_worker_does_not_inherit_the_launchers_sigterm_handler() -> None:
    assert tp.launch(cpu_plan("ddp_fork"), workers.sigterm_handler_is_default) == [True, True]


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_spawn"])
def test_launching_the_same_request_inside_a_worker_runs_in_place(strategy: str) -> None:
    inner = tp.launch(cpu_plan(strategy), workers.launch_the_same_request_inside)
    assert [len(pids) for pids in inner] == [1, 1], "each worker ran the function once, itself"


def test_launching_something_that_is_not_a_function_is_refused() -> None:
    for plan in (cpu_plan("ddp_fork"), resolve(tp.Request(accelerator="cpu"), tp.Environment())):
        with pytest.raises(LaunchError, match="not callable"):
            tp.launch(plan, 5)  # type: ignore[arg-type]


def test_a_result_whose_loading_exits_is_a_worker_failure() -> None:
    with pytest.raises(tp.WorkerFailed, match="could not be read back"):
        tp.launch(cpu_plan("ddp_fork"), workers.return_exits_when_loaded)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_an_argument_whose_pickling_raises_is_not_importable(strategy: str) -> None:
    with pytest.raises(NotImportable, match="no pickling for me"):
        tp.launch_with(cpu_plan(strategy), workers.add, args=(workers.RefusesToPickle(), 1))


def test_spawned_workers_never_import_from_the_working_directory(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("PYTHONSAFEPATH arrived in Python 3.11")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "multiprocessing.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'a').write('imported\\n')\n")
    caller = tmp_path / "caller.py"
    caller.write_text(
        "import os, trainplan as tp\n"
        "if __name__ == '__main__':\n"
        "    plan = tp.resolve(tp.Request(accelerator='cpu', devices=2, strategy='ddp_spawn'))\n"
        "    pids = tp.launch(plan, os.getpid)\n"
        "    print(len(pids), os.environ.get('PYTHONSAFEPATH'))\n"
    )
    result = subprocess.run(
        [sys.executable, str(caller)],
        cwd=shared,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.split() == ["2", "None"], result.stderr[-2000:]
    assert not (tmp_path / "PWNED").exists(), "a spawned worker imported multiprocessing.py from the working directory"


def test_progress_bars_and_endless_lines_are_passed_on_bounded(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(3): sys.stdout.write(f'step {i}\\r')\nsys.stdout.write('x' * 200000)\n"
    out = tmp_path / "out"
    with out.open("w") as sink:
        from trainplan.effects.elastic import launch_script

        plan = resolve(tp.Request(accelerator="cpu"), tp.Environment())
        assert launch_script(plan, ["-c", code], stdout=sink) == 0
    lines = out.read_text().splitlines()
    assert lines[:3] == ["[rank 0] step 0", "[rank 0] step 1", "[rank 0] step 2"]
    assert all(len(line) <= 65536 + 20 for line in lines) and sum(line.count("x") for line in lines) == 200000


def test_a_hangup_stops_trainplan_launch_and_its_workers(tmp_path: Path) -> None:
    record = tmp_path / "pids"
    script = str(ROOT / "tests" / "scripts" / "stubborn_workers.py")
    command = [sys.executable, "-m", "trainplan.cli", "launch", "--devices", "2", "--grace-period", "1"]
    caller = subprocess.Popen(
        [*command, "--", script, str(record), "cli-inner"],
        env=child_environment(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids = _pids_from(record, 2)
    caller.send_signal(signal.SIGHUP)
    assert caller.wait(timeout=30) != 0
    for _ in range(100):
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("shell", ["trainplan matrix | head -c 10", "trainplan matrix > /dev/full"])
def test_the_cli_survives_a_closed_or_full_stdout(shell: str) -> None:
    command = shell.replace("trainplan", f"{sys.executable} -m trainplan.cli")
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        cwd=ROOT,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr


def test_worker_output_that_cannot_be_written_is_reported() -> None:
    command = f"{sys.executable} -m trainplan.cli launch --no-probe --devices 1 -- -c 'print(1)' > /dev/full"
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2 and "could not be written" in result.stderr


@pytest.mark.parametrize("chunk", [1000, 65535, 65536, 65537, 131073])
def test_a_line_without_end_is_cut_at_the_limit_whatever_the_pipe_hands_over(chunk: int) -> None:
    import io

    from trainplan.effects.elastic import _LINE_LIMIT, _pump, _Sink

    text = ("é" * 50001 + "x" * 77777 + "€" * 40000).encode()

    class Pipe(io.RawIOBase):
        """A pipe that hands over `chunk` bytes at a time, as a busy worker's would."""

        def __init__(self) -> None:
            self.data = memoryview(text)

        def read1(self, size: int = -1) -> bytes:
            piece, self.data = bytes(self.data[: min(size, chunk)]), self.data[min(size, chunk) :]
            return piece

    out = io.StringIO()
    _pump(Pipe(), "[rank 0] ", _Sink(out))
    lines = out.getvalue().splitlines()
    assert all(len(line.encode()) <= _LINE_LIMIT + len("[rank 0] ") for line in lines)
    assert "".join(line.removeprefix("[rank 0] ") for line in lines) == text.decode()  # no character split


class TestForkserver:
    """Spawn plans start their workers from a forkserver: spawn's guarantees, torch imported once."""

    def test_workers_fork_from_a_fresh_server_and_see_the_callers_environment_of_now(self) -> None:
        import multiprocessing

        if "forkserver" not in multiprocessing.get_all_start_methods():
            pytest.skip("this platform has no forkserver: spawn plans start plain spawn workers")
        workers.CALLER_STATE = "changed by the caller"  # a fresh interpreter must not see this
        try:
            first = tp.launch(cpu_plan("ddp_spawn"), workers.how_i_was_started, "TRAINPLAN_TEST_LATER")
            os.environ["TRAINPLAN_TEST_LATER"] = "set after the server started"
            second = tp.launch(cpu_plan("ddp_spawn"), workers.how_i_was_started, "TRAINPLAN_TEST_LATER")
        finally:
            workers.CALLER_STATE = "as imported"
            os.environ.pop("TRAINPLAN_TEST_LATER", None)
        parents = {report["parent"] for report in first + second}
        assert len(parents) == 1 and os.getpid() not in parents, "every worker forks from one server, not the caller"
        for report in first + second:
            assert report["cuda_initialised"] is False and report["caller_state"] == "as imported"
            assert report["main_module"] == "__mp_main__" or report["main_module"] == "__main__"
        assert [report["rank"] for report in first] == ["0", "1"]
        assert {report["variable"] for report in first} == {None}
        assert {report["variable"] for report in second} == {"set after the server started"}

    def test_workers_take_the_callers_omp_num_threads_of_now(self) -> None:
        previous = os.environ.get("OMP_NUM_THREADS")
        try:
            os.environ.pop("OMP_NUM_THREADS", None)
            tp.launch(cpu_plan("ddp_spawn"), workers.torch_threads)  # the server may start here, without it
            os.environ["OMP_NUM_THREADS"] = "1"
            assert tp.launch(cpu_plan("ddp_spawn"), workers.torch_threads) == [("1", 1), ("1", 1)]
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous

    def test_without_a_forkserver_spawn_plans_spawn(self) -> None:
        from trainplan.mapping.workers import worker_start_method

        spawn, fork, script = cpu_plan("ddp_spawn"), cpu_plan("ddp_fork"), cpu_plan("ddp")
        assert worker_start_method(spawn, ["fork", "spawn", "forkserver"]) == "forkserver"
        assert worker_start_method(spawn, ["spawn"]) == "spawn"
        assert worker_start_method(fork, ["fork", "spawn", "forkserver"]) == "fork"
        assert worker_start_method(script, ["fork", "spawn", "forkserver"]) is None


def test_forked_workers_run_large_operations_after_the_caller_used_torchs_thread_pool() -> None:
    import torch

    assert float(torch.ones(1_000_000).mul(2).sum()) == 2_000_000.0  # the caller's pool is now in use
    assert tp.launch_with(cpu_plan("ddp_fork"), workers.large_tensor_operations, timeout=60) == [400_008.0] * 2


def _processes_with(marker: str) -> list[int]:
    """Pids of the processes whose environment holds `marker` (Linux: /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if marker.encode() in environ.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("delay", [0.3, 0.9])
def test_ctrl_c_while_the_first_workers_are_started_leaves_nothing(delay: float) -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("finds the processes through /proc")
    marker = f"TRAINPLAN_TEST_MARKER_{os.getpid()}_{int(delay * 10)}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "interrupted_first_launch.py"), str(delay)],
        env={**child_environment(), marker: "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 130 and "interrupted" in result.stdout, result.stderr[-2000:]
    deadline = time.monotonic() + 20
    while _processes_with(f"{marker}=1") and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _processes_with(f"{marker}=1")
    for pid in left:  # never leave them to the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after the interrupted launch: {left}"
