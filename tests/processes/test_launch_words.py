"""`trainplan launch`: what follows the script is the script's, the workers get what the plan was made from,
and nothing a worker started outlives a started job (review findings on issue 14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import alive, child_environment
from trainplan.effects.launching import choose_free_port

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TRAINPLAN = [sys.executable, "-m", "trainplan.cli"]


def _run(arguments: list[str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINPLAN, *arguments],
        cwd=ROOT,
        env=child_environment(**(extra or {})),
        capture_output=True,
        text=True,
        timeout=90.0,
        check=False,
    )


ABBREVIATIONS = ["--a", "1", "--p", "1", "--se", "1", "--local", "1", "--ma", "1", "--d", "1", "-q", "--m", "x"]
"""Each one a prefix of a trainplan or torchrun flag: they are the script's, not the launcher's."""


def test_words_after_the_script_are_the_scripts_even_when_they_abbreviate_launch_flags() -> None:
    for target in (["tests/scripts/argv_module.py"], ["-m", "tests.scripts.argv_module"]):
        launched = _run(["launch", "--quiet", "--devices", "1", *target, *ABBREVIATIONS])
        assert launched.returncode == 0, launched.stderr
        assert f"[rank 0] module __main__ args {ABBREVIATIONS!r} rank 0" in launched.stdout, launched.stdout


def _pod() -> dict[str, str]:
    """The master pod of a two-pod Kubeflow job, as the operator gives it: the plan's launcher is `external`."""
    port = str(choose_free_port("127.0.0.1"))
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": port,
        "WORLD_SIZE": "2",
        "RANK": "0",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "0",
        "PET_NNODES": "2",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }


def test_inside_a_started_job_nothing_the_script_started_survives_and_stderr_stays_stderr(tmp_path: Path) -> None:
    record = tmp_path / "pids"
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen(['sleep', '302'], start_new_session=True); "
        f"open({str(record)!r}, 'a').write(str(child.pid) + chr(10)); "
        "print('to stdout'); print('to stderr', file=sys.stderr); sys.stdout.flush(); "
        "time.sleep(float(sys.argv[1]))"
    )
    done = _run(["launch", "--quiet", "--accelerator", "cpu", "--", "-c", code, "0"], _pod())
    assert done.returncode == 0, done.stderr
    assert "[rank 0] to stdout" in done.stdout and "to stderr" not in done.stdout, done.stdout
    assert "[rank 0] to stderr" in done.stderr
    stopped = _run(["launch", "--quiet", "--accelerator", "cpu", "--timeout", "2", "--", "-c", code, "60"], _pod())
    assert stopped.returncode == 124, stopped.stderr
    assert "did not finish within 2 s" in stopped.stderr and "did not finish" not in stopped.stdout
    pids = [int(line) for line in record.read_text().split()]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids), "a child in a session of its own is reaped too"


def test_the_workers_get_the_variables_the_plan_was_made_from(tmp_path: Path) -> None:
    dotenv = tmp_path / "w.env"
    dotenv.write_text("MYVAR=hello\n")
    code = "import os; print('MYVAR', os.environ.get('MYVAR'), 'OTHER', os.environ.get('OTHER'))"
    launched = _run(
        ["launch", "--quiet", "--devices", "2", "--env-file", str(dotenv), "--set-env", "OTHER=x", "--", "-c", code]
    )
    assert launched.returncode == 0, launched.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] MYVAR hello OTHER x" in launched.stdout, launched.stdout
    inside = _run(["launch", "--quiet", "--accelerator", "cpu", "--env-file", str(dotenv), "--", "-c", code], _pod())
    assert inside.returncode == 0 and "[rank 0] MYVAR hello OTHER None" in inside.stdout, inside.stderr


def test_a_first_word_is_a_python_script_as_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "noext"
    script.write_text("import sys\nprint('python', sys.version_info[0], sys.argv[1:])\n")  # no shebang, no .py
    launched = _run(["launch", "--quiet", "--devices", "1", str(script), "a"])
    assert launched.returncode == 0 and "[rank 0] python 3 ['a']" in launched.stdout, launched.stderr


def test_kept_log_files_are_named_and_a_quoted_error_file_still_exists() -> None:
    redirected = _run(["launch", "--devices", "1", "--redirects", "1", "--", "-c", "print('hidden')"])
    assert redirected.returncode == 0, redirected.stderr
    (line,) = [line for line in redirected.stderr.splitlines() if "log files" in line]
    kept = Path(line.split(" are kept in ")[1].split(" ")[0])
    try:
        assert (next(kept.glob("*/attempt_0")) / "0" / "stdout.log").read_text() == "hidden\n"
    finally:
        import shutil

        shutil.rmtree(kept)
    failing = _run(["launch", "--devices", "1", "tests/scripts/recorded_failure.py"])
    assert failing.returncode == 1
    assert "trainplan: its error: ValueError: the learning rate is negative" in failing.stderr, failing.stderr
    assert "error.json" not in failing.stderr, "no path to a file removed at the end"


@pytest.mark.parametrize("where", ["engine", "inside a started job"])
def test_a_launch_that_ends_by_itself_never_waits_out_its_grace_period(where: str) -> None:
    # The launch's own lifeline watcher is no leftover to reap: it once took the whole grace period (it ignores
    # SIGTERM) after every launch. With a grace period of 600 s, such a wait would outlast the 90 s allowed here.
    extra = _pod() if where != "engine" else None
    flags = ["--devices", "1"] if where == "engine" else ["--accelerator", "cpu"]
    done = _run(["launch", "--quiet", *flags, "--grace-period", "600", "--", "-c", "print('done')"], extra)
    assert done.returncode == 0 and "[rank 0] done" in done.stdout, done.stderr
