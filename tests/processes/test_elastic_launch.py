"""`trainplan launch` on torch's elastic engine, with real processes on loopback: two nodes forming one world,
a restart after a failure, torchrun's and Fabric's spellings, log files and error files from the engine, the
console filter, a node waiting for its peer (said, and ended by Ctrl-C or the timeout), and no descendant left
after a failure."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import alive, child_environment
from trainplan.cli import main as cli_main
from trainplan.effects.launching import choose_free_port

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TRAINPLAN = [sys.executable, "-m", "trainplan.cli"]


def _run(arguments: list[str], *, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINPLAN, *arguments],
        cwd=ROOT,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _reports(output: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in output.split("REPORT ")[1:]]


def test_two_nodes_given_in_torchruns_spelling_form_one_world_over_loopback() -> None:
    port = str(choose_free_port("127.0.0.1"))
    nodes = []
    for node in (0, 1):
        command = [*TRAINPLAN, "launch", "--accelerator", "cpu", "--nnodes", "2", "--node-rank", str(node)]
        command += ["--master-addr", "127.0.0.1", "--master-port", port, "tests/scripts/env_world.py"]
        nodes.append(
            subprocess.Popen(
                command, cwd=ROOT, env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    for node, (stdout, stderr) in enumerate(outputs):
        (report,) = _reports(stdout)
        assert stdout.startswith(f"[rank {node}] REPORT ")
        assert report["rank"] == node and report["sum"] == 3.0, "a real all_reduce across both nodes"
        assert report["plan"] == {"world_size": 2, "num_nodes": 2, "launcher": "external", "cluster": "local"}
        # Something is said before the workers speak: the plan, then the wait for the other node.
        summary = stderr.index(f"trainplan: cpu ddp 32-true, node {node} of 2 × 1 process(es), world size 2")
        assert summary < stderr.index(f"node {node} is waiting for the other 1 node(s) at 127.0.0.1:{port}")
        assert "--nnodes is torchrun's spelling; trainplan's is --num-nodes" in stderr
        assert "--master-port is torchrun's spelling; trainplan's is --main-port" in stderr


def test_max_restarts_restarts_a_world_whose_rank_failed_once() -> None:
    restarted = _run(["launch", "--accelerator", "cpu", "--devices", "2", "--max-restarts", "1", "restart_world.py"])
    # (the script is looked up where it is: a missing path is refused before anything starts)
    assert restarted.returncode == 2 and "No such script: 'restart_world.py'" in restarted.stderr
    script = "tests/scripts/restart_world.py"
    restarted = _run(["launch", "--accelerator", "cpu", "--devices", "2", "--max-restarts", "1", script])
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "[rank 1] rank 1 fails in attempt 0" in restarted.stdout
    assert "[rank 0] attempt 1 rank 0 sum 3.0" in restarted.stdout
    assert "[rank 1] attempt 1 rank 1 sum 3.0" in restarted.stdout
    assert "trainplan: restarting the workers (restart 1 of 1)" in restarted.stderr


def test_module_no_python_and_the_omp_default(tmp_path: Path) -> None:
    module = _run(["launch", "--devices", "2", "-m", "tests.scripts.argv_module", "--lr", "1", "--devices", "9"])
    assert module.returncode == 0, module.stderr
    for rank in (0, 1):
        # The script's own flags (--devices 9 among them) reach it; torchrun's OMP_NUM_THREADS default holds.
        assert f"[rank {rank}] module __main__ args ['--lr', '1', '--devices', '9'] rank {rank} omp 1" in module.stdout
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in module.stderr
    program = _run(["launch", "--quiet", "--nproc_per_node", "1", "--no-python", "echo", "hello", "world"])
    assert program.returncode == 0 and program.stdout == "[rank 0] hello world\n", program
    assert "trainplan: cpu" not in program.stderr, "--quiet drops the summary"
    assert "--nproc-per-node is torchrun's spelling; trainplan's is --devices: --devices 1 (a count" in program.stderr


def test_log_files_error_files_and_the_console_filter_come_from_the_engine(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    code = "import os, sys; print('out', os.environ['RANK']); print('err', os.environ['RANK'], file=sys.stderr)"
    shown = _run(["launch", "--devices", "2", "--log-dir", str(logs), "--local-ranks-filter", "0", "--", "-c", code])
    assert shown.returncode == 0, shown.stderr
    assert "[rank 0] out 0" in shown.stdout and "[rank 0] err 0" in shown.stderr
    assert "[rank 1]" not in shown.stdout + shown.stderr, "local rank 1 is filtered out"
    (attempt,) = logs.glob("*/attempt_0")
    assert (attempt / "1" / "stdout.log").read_text() == "out 1\n" and (attempt / "1" / "stderr.log").read_text() == (
        "err 1\n"
    )
    redirected = _run(["launch", "--devices", "1", "--redirects", "1", "--log-dir", str(logs), "--", "-c", code])
    assert redirected.returncode == 0 and redirected.stdout == "" and "[rank 0] err 0" in redirected.stderr
    failing = _run(["launch", "--devices", "1", "--log-dir", str(logs), "tests/scripts/recorded_failure.py"])
    assert failing.returncode == 1
    assert "worker rank 0 failed (exit code 1)" in failing.stderr
    assert "error.json): ValueError: the learning rate is negative" in failing.stderr, failing.stderr
    assert "[rank 0] ValueError: the learning rate is negative" in failing.stderr, "the traceback, rank-prefixed"


def test_a_failing_rank_is_one_line_and_its_exit_code_without_the_engines_traceback(tmp_path: Path) -> None:
    """A rank's sys.exit(3): exit 3 and the launch's one line, not torch's engine logging its own polling traceback
    (`ProcessExitedException`), each sibling it stops, or a stopped sibling as a failure of its own; a rank that
    raises shows its traceback once, rank-prefixed, not again inside the engine's frames."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    if sys.argv[1:] == ['raise']:\n"
        "        raise ValueError('rank one gives up')\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    engine_words = ("Traceback", "failed (exitcode", "Terminating process", "closing signal", "Exception")
    for program in ([str(script)], ["--no-python", sys.executable, str(script)]):  # forked from the server; a process
        result = _run(["launch", "--quiet", "--accelerator", "cpu", "--devices", "2", *program])
        assert result.returncode == 3, result.stderr[-3000:]
        assert "trainplan: worker rank 1 failed (exit code 3); the others were stopped\n" in result.stderr
        assert not [word for word in engine_words if word in result.stderr], result.stderr
        assert "rank 0 failed" not in result.stderr, "a sibling the engine stopped is no failure"
    raised = _run(["launch", "--quiet", "--accelerator", "cpu", "--devices", "2", str(script), "raise"])
    assert raised.returncode == 1 and "trainplan: worker rank 1 failed (exit code 1)" in raised.stderr
    assert raised.stderr.count("Traceback") == 1 and "[rank 1] Traceback" in raised.stderr, raised.stderr
    assert "ProcessRaisedException" not in raised.stderr and "trainplan: its error: ValueError" in raised.stderr


def _start_lonely_node(*flags: str) -> subprocess.Popen[str]:
    port = str(choose_free_port("127.0.0.1"))
    command = [*TRAINPLAN, "launch", "--accelerator", "cpu", "--num-nodes", "2", "--node-rank", "0", *flags]
    command += ["--main-address", "127.0.0.1", "--main-port", port, "--", "-c", "print('never')"]
    return subprocess.Popen(
        command, cwd=ROOT, env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_line(process: subprocess.Popen[str], words: str) -> str:
    assert process.stderr is not None
    seen = ""
    deadline = time.monotonic() + 60
    while words not in seen and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen += line
    assert words in seen, seen
    return seen


def test_a_node_waiting_for_its_peer_says_so_and_ends_on_ctrl_c() -> None:
    node = _start_lonely_node()
    _wait_for_line(node, "node 0 is waiting for the other 1 node(s)")
    time.sleep(0.5)  # inside torch's store now, where Python's own handlers never run
    node.send_signal(signal.SIGINT)
    try:
        _, stderr = node.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        node.kill()
        pytest.fail("Ctrl-C did not end a node waiting for its peer")
    assert node.returncode == 130 and "stopped by SIGINT while waiting for the other nodes" in stderr


def test_a_node_waiting_for_its_peer_ends_at_the_timeout() -> None:
    node = _start_lonely_node("--timeout", "3")
    _wait_for_line(node, "waiting for the other 1 node(s)")
    try:
        _, stderr = node.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        node.kill()
        pytest.fail("the timeout did not end a node waiting for its peer")
    assert node.returncode == 124 and "did not finish within 3 s" in stderr, stderr


def test_a_failed_workers_children_do_not_outlive_trainplan_launch(tmp_path: Path) -> None:
    # torchrun 2.13 leaves these running (the engine signals only workers that still run): trainplan stops them.
    record = tmp_path / "pids"
    code = (
        "import subprocess, os, sys; "
        f"open({str(record)!r}, 'a').write(str(subprocess.Popen(['sleep', '300']).pid) + chr(10)); "
        "sys.exit(int(os.environ['RANK']) + 4)"
    )
    assert cli_main(["launch", "--accelerator", "cpu", "--devices", "2", "--", "-c", code]) in (4, 5)
    pids = [int(line) for line in record.read_text().split()]
    assert pids and not any(alive(pid) for pid in pids)


def test_the_launchs_choices_reach_a_script_with_its_own_request() -> None:
    flags = ["launch", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--precision", "bf16-mixed"]
    flags += ["--strategy-option", "timeout_seconds=5", "tests/scripts/launch_choices.py"]
    taken = _run(flags)
    assert taken.returncode == 0, taken.stderr
    assert "a script's own Request takes" in taken.stderr and "precision='bf16-mixed'" in taken.stderr
    assert [report["precision"] for report in _reports(taken.stdout)] == ["bf16-mixed"] * 2
    assert all("timeout_seconds=5" in report["options"] for report in _reports(taken.stdout))
    overridden = _run([*flags, "64-true"])
    assert [report["precision"] for report in _reports(overridden.stdout)] == ["64-true"] * 2
    assert overridden.stderr.count("launch-choice-overridden") >= 2, "a warning on every rank"


def test_nodes_launched_with_different_devices_are_refused_on_every_node() -> None:
    # c10d assigns node ranks as nodes arrive: the banner says so, then names the rank each node got.
    port = str(choose_free_port("127.0.0.1"))
    nodes = []
    for devices in ("1", "2"):
        command = [*TRAINPLAN, "launch", "--accelerator", "cpu", "--num-nodes", "2", "--devices", devices]
        command += ["--json"] if devices == "2" else []  # its refusal is the error record on stdout
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--timeout", "90"]
        command += ["tests/scripts/env_only_world.py"]  # a plain env:// script: the launchers themselves refuse
        nodes.append(
            subprocess.Popen(
                command, cwd=ROOT, env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [2, 2], outputs  # refused by the launchers, not timed out
    ranks = set()
    for (stdout, stderr), devices in zip(outputs, ("1", "2"), strict=True):
        assert "this node (its rank is assigned at the rendezvous) of 2 ×" in stderr
        ranks |= {rank for rank in ("0", "1") if f"starting node {rank}'s {devices} worker(s)" in stderr}
        refusal = json.loads(stdout)["error"]["message"] if devices == "2" else stderr
        assert "the nodes were launched with different --devices" in refusal
        assert f"Launch every node with the same --devices (here {devices})" in refusal
    assert json.loads(outputs[1][0])["exit_code"] == 2
    assert "WORLD" not in outputs[0][0], "no worker started"
    assert ranks == {"0", "1"}, "each node names the rank the rendezvous gave it"


SERVED_WORLD = """\
import json, os, sys
import torch
from torch import distributed

distributed.init_process_group("gloo")
value = torch.ones(1)
distributed.all_reduce(value)
state = {
    "sum": value.item(),
    "argv": sys.argv[1:],
    "path0": sys.path[0],
    "cuda": torch.cuda.is_initialized(),
    "launcher_modules": sorted(m for m in sys.modules if m in ("trainplan.cli", "trainplan.effects.elastic")),
    "own_session": os.getsid(0) == os.getpid(),
    "safe_path": os.environ.get("PYTHONSAFEPATH"),
    "given": os.environ.get("TRAINPLAN_TEST_GIVEN"),
    "rank": os.environ["RANK"],
    "main": __name__,
}
print("REPORT " + json.dumps(state))
distributed.destroy_process_group()
if sys.argv[1:] == ["fail"] and os.environ["RANK"] == "1":
    raise ValueError("rank one refuses")
"""


@pytest.mark.timeout(300)  # two launches
def test_a_script_forked_from_the_preloaded_server_runs_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    """The workers are forked from a forkserver that imported torch: each still runs the script as `__main__` with
    its arguments and its directory first on sys.path, in a session of its own, with the launch's environment,
    no CUDA state and none of the launcher's modules; an uncaught exception is shown on the rank's stderr and
    ends the run with exit code 1, as `python script.py` would."""
    script = tmp_path / "served_world.py"
    script.write_text(SERVED_WORLD)
    command = [*TRAINPLAN, "launch", "--quiet", "--accelerator", "cpu", "--devices", "2", str(script), "a", "-b"]
    result = subprocess.run(
        command,
        cwd=ROOT,
        env={**child_environment(), "TRAINPLAN_TEST_GIVEN": "yes"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = sorted(_reports(result.stdout), key=lambda report: report["rank"])
    assert [report["rank"] for report in reports] == ["0", "1"]
    for report in reports:
        assert report["sum"] == 2.0 and report["argv"] == ["a", "-b"] and report["main"] == "__main__"
        assert report["path0"] == str(tmp_path)
        assert report["cuda"] is False and report["launcher_modules"] == []
        assert report["own_session"] is True and report["safe_path"] is None and report["given"] == "yes"
    failed = subprocess.run(
        [*command[:-2], "fail"],
        cwd=ROOT,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "[rank 1] ValueError: rank one refuses" in failed.stderr
    shown = [line for line in failed.stderr.splitlines() if line.startswith("[rank 1] ")]
    assert not [line for line in shown if "served_script" in line or "runpy" in line]  # the script's frames alone
    assert "worker rank 1 failed (exit code 1)" in failed.stderr
