"""Emitted jobs carry a plan's values as data, never as code, whatever text the plan holds.

Hostile text (`x";touch${IFS}CANARY;"`, newlines, `$(...)`, backticks, `---\\nkind: Pod`, C1 and line-separator
characters) goes into every text field the emitters read: the main address, the notes, the reasons, the physical
GPUs' names, and the script's own words. Two ways in:

- through `Plan.from_dict` (a `plan.json` loaded, then emitted): the plan is refused (`PlanFormatError`), or it
  is emitted and checked below;
- straight into a `Plan` record (what a caller may build without reading JSON): the emitters alone must hold.

Every torchrun line and sbatch script passes `bash -n`, and run by bash with stand-in `torchrun`, `srun` and
`scontrol` on PATH, it starts torchrun with exactly the argv the plan asks for and creates no CANARY file. Every
PyTorchJob manifest is exactly one YAML document, and its container command, expanded as the kubelet expands it,
is exactly the script's argv.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainplan import Environment, Plan, PlanFormatError, Request, TrainplanError
from trainplan.render.emit import emit_kubeflow, emit_slurm, emit_torchrun
from trainplan.resolve import resolve
from trainplan.spec.notes import Note

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HOSTILE = [
    'x";touch${IFS}CANARY;"',
    "x';touch CANARY;'",
    "runs as ddp\ntouch CANARY",
    "a\rtouch CANARY",
    "$(touch CANARY)",
    "`touch CANARY`",
    "${IFS}touch${IFS}CANARY",
    "x\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: miner}\n---",
    "---\nkind: Pod",
    "# \n#SBATCH --nodes=99\ntouch CANARY",
    "p\x85q\u2028touch CANARY\u2029",
    "\x7f\x80\x9b[2J",
    "$$(RANK)$$$(X)$",
    "é ü 中 \U0001f600",
    "node0",
    "fe80::1%eth0;touch CANARY",
    "'\"\\",
    "",
]
TEXT = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=16),
)
ARGV_WORD = st.one_of(st.sampled_from([word for word in HOSTILE if word]), st.sampled_from(["--lr", "0.1", "-x"]))

BASE_PLANS = {
    "cpu, 2 nodes, a named host": (
        Request(accelerator="cpu", devices=2, num_nodes=2),
        Environment(cpu_count=4, variables={"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}),
    ),
    "4 gpus, 2 nodes": (
        Request(devices=4, num_nodes=2),
        Environment(cuda_device_count=4, variables={"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}),
    ),
    "gpus 1 and 3 of 4, one node": (Request(devices=[1, 3]), Environment(cuda_device_count=4)),
    "ddp_spawn on cpu (a script-strategy note)": (
        Request(accelerator="cpu", strategy="ddp_spawn", devices=2),
        Environment(cpu_count=4),
    ),
}
PLANS = {name: resolve(request, env) for name, (request, env) in BASE_PLANS.items()}

STAND_INS = {
    # torchrun records its argv, NUL-separated (a word may hold a newline), and the variables it was given.
    "torchrun": '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$RECORD"\n',
    # srun drops its own options and runs the task's command; scontrol names the allocation's first node.
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho node1\n",
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bin")
    for name, text in STAND_INS.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _mutated(plan: Plan, data: st.DataObject) -> dict[str, Any]:
    """The plan's JSON with hostile text in the fields the emitters and explain() read."""
    mutated: dict[str, Any] = plan.to_dict()
    fields = data.draw(
        st.sets(st.sampled_from(["address", "note", "note_code", "reason", "physical", "explanation"]), min_size=1)
    )
    if "address" in fields:
        mutated["cluster"] = {**mutated["cluster"], "main_address": data.draw(TEXT)}
    if "note" in fields:
        mutated["notes"] = [*mutated["notes"], {"code": "script-strategy", "level": "info", "message": data.draw(TEXT)}]
    if "note_code" in fields:
        mutated["notes"] = [*mutated["notes"], {"code": data.draw(TEXT), "level": "warning", "message": "m"}]
    if "reason" in fields:
        mutated["reasons"] = {**mutated["reasons"], data.draw(TEXT): data.draw(TEXT)}
    if "physical" in fields and mutated["devices"]:
        mutated["physical_devices"] = [data.draw(TEXT) for _ in mutated["devices"]]
    if "explanation" in fields:
        mutated["metrics"] = {**mutated["metrics"], "explanation": data.draw(TEXT)}
    return mutated


def _hostile_record(plan: Plan, data: st.DataObject) -> Plan:
    """A plan record with hostile text where the emitters read it, built without `Plan.from_dict`'s checks."""
    physical = tuple(data.draw(TEXT) for _ in plan.devices) if data.draw(st.booleans()) else plan.physical_devices
    address = data.draw(TEXT) if plan.num_nodes > 1 and data.draw(st.booleans()) else plan.cluster.main_address
    notes = (*plan.notes, Note(code="script-strategy", level="info", message=data.draw(TEXT)))
    return attrs.evolve(
        plan, cluster=attrs.evolve(plan.cluster, main_address=address), notes=notes, physical_devices=physical
    )


def _expected_torchrun(plan: Plan, command: list[str], *, address: str, port: str, run_id: str) -> list[str]:
    """torchrun's argv for the plan, written from the plan alone (not from the emitter's code)."""
    if plan.num_nodes == 1:
        layout = ["--standalone", "--nnodes=1"]
    else:
        layout = [
            f"--nnodes={plan.num_nodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-id={run_id}",
        ]
    return [*layout, f"--nproc-per-node={plan.processes_per_node}", *command]


def _run_shell(text: str, tmp: Path, stand_ins: Path, variables: dict[str, str]) -> list[str]:
    """Check `text` with `bash -n`, run it in an empty folder, and return the argv torchrun was started with."""
    script = tmp / "job.sh"
    script.write_text(text, encoding="utf-8")
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert syntax.returncode == 0, syntax.stderr
    record = tmp / "argv"
    environment = {"PATH": f"{stand_ins}{os.pathsep}/usr/bin:/bin", "RECORD": str(record), **variables}
    ran = subprocess.run(["bash", str(script)], cwd=tmp, env=environment, capture_output=True, timeout=30, check=False)
    assert ran.returncode == 0, ran.stderr
    leftovers = sorted(path.name for path in tmp.iterdir() if path.name not in ("job.sh", "argv"))
    assert leftovers == [], f"the job created {leftovers}"
    words = record.read_bytes().decode("utf-8").split("\0")
    assert words[-1] == ""
    return words[:-1]


def _kubelet(words: list[str], environment: dict[str, str]) -> list[str]:
    """Kubernetes' expansion of a container's command: `$$` is `$`, `$(NAME)` a variable's value (kept as written
    when the pod has no such variable)."""

    def expand(found: re.Match[str]) -> str:
        return "$" if found.group(0) == "$$" else environment.get(found.group(1), found.group(0))

    return [re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, word) for word in words]


def _check_emitted(plan: Plan, command: list[str], tmp: Path, stand_ins: Path) -> None:
    line = emit_torchrun(plan, command)
    variables = {"MASTER_ADDR": "node9", "MASTER_PORT": "29999", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1"}
    port = str(plan.cluster.main_port) if plan.cluster.main_port is not None else "29999"
    address = plan.cluster.main_address
    address = "node9" if address in ("127.0.0.1", "localhost", "::1") else address  # the job's MASTER_ADDR then
    asked = _expected_torchrun(plan, command, address=address, port=port, run_id="trainplan")
    assert _run_shell(line, tmp, stand_ins, variables) == asked

    script = emit_slurm(plan, command)
    asked = _expected_torchrun(plan, command, address="node9", port="29999", run_id="77")
    assert _run_shell(script, tmp, stand_ins, variables) == asked

    manifest = emit_kubeflow(plan, command, image="ghcr.io/me/train:1.0", name="llm")
    documents = list(yaml.safe_load_all(manifest))
    assert len(documents) == 1 and documents[0]["kind"] == "PyTorchJob"
    container = documents[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    pod = {"RANK": "0", "MASTER_ADDR": "llm-master-0", "MASTER_PORT": "23456"}
    carried = {entry["name"]: _kubelet([entry["value"]], pod)[0] for entry in container.get("env", [])}
    ran = _kubelet(container["command"], pod)
    assert ran[-len(command) :] == command
    assert set(carried) <= {"TRAINPLAN_REQUEST", "TRAINPLAN_RULES"}


@SETTINGS
@given(name=st.sampled_from(list(PLANS)), data=st.data(), command=st.lists(ARGV_WORD, max_size=3))
def test_a_plan_read_from_json_is_refused_or_emitted_as_data(
    name: str, data: st.DataObject, command: list[str], tmp_path_factory: pytest.TempPathFactory, stand_ins: Path
) -> None:
    mutated = _mutated(PLANS[name], data)
    try:
        plan = Plan.from_dict(mutated)
    except PlanFormatError:
        return
    plan.explain().encode("utf-8")  # printable: nothing unencodable came in
    _check_emitted(plan, ["train.py", *command], tmp_path_factory.mktemp("job"), stand_ins)


@SETTINGS
@given(name=st.sampled_from(list(PLANS)), data=st.data(), command=st.lists(ARGV_WORD, max_size=3))
def test_the_emitters_quote_every_value_of_a_plan_built_without_reading_json(
    name: str, data: st.DataObject, command: list[str], tmp_path_factory: pytest.TempPathFactory, stand_ins: Path
) -> None:
    plan = _hostile_record(PLANS[name], data)
    with contextlib.suppress(TrainplanError):  # refused with a typed error: nothing emitted
        _check_emitted(plan, ["train.py", *command], tmp_path_factory.mktemp("job"), stand_ins)
