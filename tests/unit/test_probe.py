"""probe(): facts of this machine, with the GPU driver behind an injected inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, ClassVar

import pytest

from trainplan import GpuFacts
from trainplan.effects import ProbeError, probe
from trainplan.resolve.visible import AmbiguousDevice, visible_device_order

if TYPE_CHECKING:
    pass

UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-bbbc3333", "GPU-dddd4444"]


class FakeInventory:
    def __init__(self, uuids: list[str] | None) -> None:
        self.uuids = uuids

    def gpus(self) -> list[GpuFacts] | None:
        return None if self.uuids is None else [GpuFacts(uuid=uuid) for uuid in self.uuids]


class TestVisibleDevices:
    """CUDA's own reading of CUDA_VISIBLE_DEVICES (as torch implements it)."""

    @pytest.mark.parametrize(
        ("value", "order"),
        [
            (None, (0, 1, 2, 3)),
            ("", ()),
            ("-1", ()),
            ("2,0", (2, 0)),
            ("1gpu2,3", (1, 3)),
            ("0,7,1", (0,)),
            ("0,-1,1", (0,)),
            ("1,1", ()),
            ("GPU-dddd,GPU-aaaa", (3, 0)),
            ("GPU-aaaa,GPU-zzzz,GPU-dddd", (0,)),
            ("GPU-aaaa,1", (0,)),
            ("GPU-aaaa,GPU-aaaa1111", ()),
        ],
    )
    def test_forms(self, value: str | None, order: tuple[int, ...]) -> None:
        assert visible_device_order(value, UUIDS) == order

    def test_ambiguous_prefix_is_an_error(self) -> None:
        with pytest.raises(AmbiguousDevice):
            visible_device_order("GPU-bbb", UUIDS)


def test_probe_counts_visible_gpus_through_the_inventory() -> None:
    env = probe(environ={"CUDA_VISIBLE_DEVICES": "3,1"}, nvml=FakeInventory(UUIDS))
    assert env.cuda_device_count == 2
    assert env.variables["CUDA_VISIBLE_DEVICES"] == "3,1"


def test_probe_without_a_driver_sees_no_gpu() -> None:
    assert probe(environ={}, nvml=FakeInventory(None)).cuda_device_count == 0


def test_probe_keeps_only_relevant_variables() -> None:
    env = probe(environ={"SLURM_NTASKS": "2", "HOME": "/root", "RANK": "0"}, nvml=FakeInventory(None))
    assert dict(env.variables) == {"SLURM_NTASKS": "2", "RANK": "0"}


def test_probe_reports_an_ambiguous_uuid() -> None:
    with pytest.raises(ProbeError, match="longer UUID prefix"):
        probe(environ={"CUDA_VISIBLE_DEVICES": "GPU-bbb"}, nvml=FakeInventory(UUIDS))


def test_probe_on_this_machine_neither_imports_torch_nor_initialises_cuda() -> None:
    code = (
        "import sys, trainplan\n"
        "env = trainplan.probe()\n"
        "assert 'torch' not in sys.modules, 'probe imported torch'\n"
        "assert env.cpu_count >= 1 and 'spawn' in env.start_methods\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(env.cuda_device_count)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr


_FACTS_SCRIPT = """import json, os
from trainplan.effects.probing import process_tree_facts
print("FACTS " + json.dumps(process_tree_facts(dict(os.environ))))
"""


def _facts_under(tmp_path: object, chain: str, **variables: str) -> dict[str, str]:
    """process_tree_facts in a python process under a chain of real processes named like the launchers' daemons
    (copies of bash named slurmstepd, orted, hydra_pmi_proxy: /proc names a process after its executable)."""
    import json
    import shutil
    from pathlib import Path

    folder = Path(str(tmp_path))
    for name in ("slurmstepd", "orted", "hydra_pmi_proxy"):
        shutil.copy("/bin/bash", folder / name)
    (folder / "facts.py").write_text(_FACTS_SCRIPT)
    python = f"{sys.executable} {folder / 'facts.py'}"
    (folder / "typed.txt").write_text(f"{python}\nexit\n")
    command = chain.format(folder=folder, python=python)
    environment = {**os.environ, **variables}
    done = subprocess.run(
        [str(folder / "slurmstepd"), "-c", command + "; true"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = [line for line in done.stdout.splitlines() if line.startswith("FACTS ")]
    assert done.returncode == 0 and len(found) == 1, done.stdout + done.stderr
    facts: dict[str, str] = json.loads(found[0][len("FACTS ") :])
    return facts


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/bin/bash"), reason="reads /proc")
class TestProcessTree:
    """The facts the probe reads off the process tree, under real processes named as the engines' daemons are."""

    STEP: ClassVar[dict[str, str]] = {
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }

    def test_a_rank_under_orted_under_slurmstepd_is_mpis_with_the_steps_nodes(self, tmp_path: object) -> None:
        ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
        facts = _facts_under(tmp_path, "{folder}/orted -c '{python}; true'", **self.STEP, **ompi)
        assert facts == {"TRAINPLAN_MPI_DAEMON": "orted", "TRAINPLAN_MPI_NODES": "2"}

    def test_a_hydra_rank_names_its_proxy(self, tmp_path: object) -> None:
        pmi = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}
        facts = _facts_under(tmp_path, "{folder}/hydra_pmi_proxy -c '{python}; true'", **self.STEP, **pmi)
        assert facts["TRAINPLAN_MPI_DAEMON"] == "hydra_pmi_proxy" and facts["TRAINPLAN_MPI_PROXY"].isdigit()
        assert facts["TRAINPLAN_MPI_NODES"] == "2"

    def test_srun_started_ranks_with_mpis_variables_have_no_daemon(self, tmp_path: object) -> None:
        # srun --mpi=pmi2: the rank is slurmstepd's own child.
        assert _facts_under(tmp_path, "{python}", **self.STEP, PMI_RANK="0", PMI_SIZE="2") == {}

    def test_a_script_typed_into_an_interactive_shell_of_a_step_is_marked(self, tmp_path: object) -> None:
        facts = _facts_under(tmp_path, "bash --norc -i < {folder}/typed.txt", **self.STEP)
        assert facts == {"TRAINPLAN_SLURM_SHELL": "bash"}

    def test_a_shell_running_a_command_is_not_interactive(self, tmp_path: object) -> None:
        # srun bash -c '...; python train.py': the tasks run the script themselves.
        assert _facts_under(tmp_path, "bash -c 'cd /; {python}; true'", **self.STEP) == {}


class TestProbeAgain:
    """A second probe in the same process reads the environment's variables again (only the facts that cannot change
    within a process, the driver's GPUs, the packages and the start methods, are read once), and it stays correct
    however the variables changed between the two calls."""

    def test_a_variable_set_between_two_calls_is_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("SLURM_NTASKS", raising=False)
        first = probe()
        monkeypatch.setenv("SLURM_NTASKS", "4")
        second = probe()
        assert "SLURM_NTASKS" not in first.variables
        assert second.variables["SLURM_NTASKS"] == "4"

    def test_a_changed_or_removed_variable_is_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        assert probe().variables["CUDA_VISIBLE_DEVICES"] == ""
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
        assert probe().variables["CUDA_VISIBLE_DEVICES"] == "-1"
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        assert "CUDA_VISIBLE_DEVICES" not in probe().variables

    def test_a_renamed_variable_with_the_same_count_of_names_is_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # The names are rescanned when the set of names changes, not only its size.
        monkeypatch.setenv("TRAINPLAN_TEST_PLACEHOLDER", "1")
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        before = probe()
        monkeypatch.delenv("TRAINPLAN_TEST_PLACEHOLDER")
        monkeypatch.setenv("WORLD_SIZE", "2")
        after = probe()
        assert "WORLD_SIZE" not in before.variables
        assert after.variables["WORLD_SIZE"] == "2"

    @pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
    def test_the_cpus_this_process_may_run_on_are_read_again(self) -> None:
        # taskset, a cgroup or the job's own code may narrow a running process to fewer CPUs between two calls.
        allowed = os.sched_getaffinity(0)
        first = probe()
        try:
            os.sched_setaffinity(0, {min(allowed)})
            narrowed = probe()
        finally:
            os.sched_setaffinity(0, allowed)
        assert first.cpu_count == len(allowed)
        assert narrowed.cpu_count == 1
        assert probe().cpu_count == len(allowed)

    def test_an_interactive_session_begun_between_two_calls_is_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
        monkeypatch.delattr(sys, "ps1", raising=False)
        assert probe().interactive is False
        monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # the REPL sets it when it starts
        assert probe().interactive is True

    def test_a_given_mapping_changed_in_place_is_read_again(self) -> None:
        environ = {"RANK": "0", "HOME": "/root"}
        assert dict(probe(environ=environ, nvml=FakeInventory(None)).variables) == {"RANK": "0"}
        environ["RANK"] = "1"
        environ["LOCAL_RANK"] = "1"
        assert dict(probe(environ=environ, nvml=FakeInventory(None)).variables) == {"RANK": "1", "LOCAL_RANK": "1"}

    def test_the_same_facts_give_an_equal_environment_and_other_facts_another(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("MASTER_PORT", raising=False)
        first, again = probe(), probe()
        assert first == again
        monkeypatch.setenv("MASTER_PORT", "29555")
        changed = probe()
        assert changed != first
        assert changed.variables["MASTER_PORT"] == "29555"

    def test_a_resolve_without_an_environment_sees_the_new_variables(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import trainplan

        monkeypatch.delenv("TRAINPLAN_REQUEST", raising=False)
        request = trainplan.Request(accelerator="cpu", devices=2, strategy="ddp")
        for name in [name for name in os.environ if name.startswith(("SLURM_", "OMPI_", "PMI_", "LSB_"))]:
            monkeypatch.delenv(name)
        assert trainplan.resolve(request).num_nodes == 1
        monkeypatch.setenv("SLURM_JOB_ID", "5")
        monkeypatch.setenv("SLURM_NTASKS", "4")
        monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
        monkeypatch.setenv("SLURM_NNODES", "2")
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
        monkeypatch.setenv("SLURM_NODEID", "0")
        monkeypatch.setenv("SLURM_PROCID", "0")
        monkeypatch.setenv("SLURM_LOCALID", "0")
        monkeypatch.setenv("SLURM_NODELIST", "node[0-1]")
        monkeypatch.setenv("SLURM_JOB_NAME", "train")
        monkeypatch.setenv("SLURM_STEP_ID", "0")
        plan = trainplan.resolve(request)  # a second call, in a SLURM job of 2 nodes now
        assert (plan.num_nodes, plan.world_size, plan.launcher) == (2, 4, "external")
        assert plan.cluster.kind == "slurm"


def test_the_variables_probe_reads_from_its_own_copy_are_relevant_ones() -> None:
    """probe() reads CUDA_VISIBLE_DEVICES and the launcher variables of the process-tree facts from the relevant
    variables it copied (not from the environment again): each must be one of them."""
    from trainplan.rules import RELEVANT_VARIABLE_PREFIXES, RELEVANT_VARIABLES

    read = ["CUDA_VISIBLE_DEVICES", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "SLURM_STEP_ID"]
    read += ["SLURM_STEP_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE"]
    assert [
        name for name in read if name not in RELEVANT_VARIABLES and not name.startswith(RELEVANT_VARIABLE_PREFIXES)
    ] == []


def test_resolve_again_without_an_environment_raises_nothing_on_its_way() -> None:
    """`trainplan.resolve(request)` a framework calls again (it probes each time) asks for no variable that is not
    there: outside a launched worker it reads the probe's copy of trainplan's variables, not `os.environ` (whose
    lookup of a missing name raises and catches a KeyError, most of a probe's cost once). Traced in a fresh
    interpreter, trainplan's frames only: under a test worker's state a tracer in-process once span for good."""
    code = """
import sys
import trainplan

request = trainplan.Request(accelerator="cpu", devices=2, strategy="ddp")
trainplan.resolve(request)
raised = []

def trace(frame, event, argument):
    if "/trainplan/" not in frame.f_code.co_filename:
        return None
    if event == "exception":
        raised.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {argument[0].__name__}")
    return trace

sys.settrace(trace)
try:
    plan = trainplan.resolve(request)
finally:
    sys.settrace(None)
print(plan.world_size, raised)
"""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TRAINPLAN_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    world_size, raised = done.stdout.strip().split(" ", 1)
    assert world_size == "2"
    assert raised == "[]"
