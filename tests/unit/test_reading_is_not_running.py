"""A plan read from JSON is checked as resolve would have made it, and the emitters carry its values as data: the
red-team review's reproductions (round three, N1, N7, N10), each as a test."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import attrs
import pytest
import yaml

import trainplan as tp
from trainplan import ClusterEnvironmentError, Environment, Plan, PlanFormatError, Request
from trainplan.parse.plan_json import plan_from_json_text, request_from_json_text
from trainplan.parse.wire import MAX_DEPTH, MAX_INTEGER_BITS, MAX_TEXT, MAX_VALUES
from trainplan.render.emit import emit_kubeflow, emit_slurm, emit_torchrun
from trainplan.resolve import resolve
from trainplan.resolve.cluster import detect
from trainplan.spec.notes import Note
from trainplan.spec.text import host_address, one_line, unsafe_character

INJECTED_ADDRESS = 'x";touch${IFS}CANARY;"'


@pytest.fixture(scope="module")
def two_nodes() -> dict[str, Any]:
    env = Environment(cuda_device_count=4, variables={"MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    data: dict[str, Any] = tp.resolve(Request(devices=4, num_nodes=2), env).to_dict()
    return data


def _refused_at(data: object, path: str) -> str:
    with pytest.raises(PlanFormatError) as caught:
        Plan.from_dict(data)
    assert f"at {path} " in str(caught.value), str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(
    "address", [INJECTED_ADDRESS, "node0;touch CANARY", "$(id)", "node 0", "fe80::1%eth0;x", "[::1]", "", "n" * 300]
)
def test_a_main_address_that_resolve_would_not_write_is_refused(two_nodes: dict[str, Any], address: str) -> None:
    mutated = dict(two_nodes, cluster={**two_nodes["cluster"], "main_address": address})
    _refused_at(mutated, "plan.cluster.main_address")


@pytest.mark.parametrize("address", ["node0", "10.0.0.1", "::1", "fe80::1", "gpu-01.cluster.local"])
def test_every_address_resolve_writes_reads_back(two_nodes: dict[str, Any], address: str) -> None:
    mutated = dict(two_nodes, cluster={**two_nodes["cluster"], "main_address": address})
    assert Plan.from_dict(mutated).cluster.main_address == address


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("note", "runs as ddp\ntouch CANARY"),
        ("note", "\x1b[2J\x1b[31mred"),
        ("note", "nul\x00"),
        ("note", "p\x85q"),
        ("note", "line\u2028separator"),
        ("reason", "because\rtouch CANARY"),
        ("explanation", "tab\tand more"),
        ("note", "\ud800"),
    ],
)
def test_text_with_line_breaks_controls_or_surrogates_is_refused(
    two_nodes: dict[str, Any], where: str, text: str
) -> None:
    if where == "note":
        note = {"code": "script-strategy", "level": "info", "message": text}
        mutated = dict(two_nodes, notes=[*two_nodes["notes"], note])
        path = f"plan.notes[{len(two_nodes['notes'])}].message"
    elif where == "reason":
        mutated = dict(two_nodes, reasons={**two_nodes["reasons"], "devices": text})
        path = "plan.reasons.devices"
    else:
        mutated = dict(two_nodes, metrics={**two_nodes["metrics"], "explanation": text})
        path = "plan.metrics.explanation"
    character = unsafe_character(text)
    assert character is not None and ascii(character) in _refused_at(mutated, path)


def test_a_lone_surrogate_in_plan_json_text_is_refused(two_nodes: dict[str, Any]) -> None:
    text = json.dumps(dict(two_nodes, cluster={**two_nodes["cluster"], "main_address": "\ud800"}))
    assert "\\ud800" in text
    with pytest.raises(PlanFormatError, match="main_address"):
        plan_from_json_text(text)


@pytest.mark.parametrize("field", ["precision", "request"])
def test_a_value_nested_far_too_deep_is_a_plan_format_error_not_a_recursion_error(
    two_nodes: dict[str, Any], field: str
) -> None:
    nested: object = "x"
    for _ in range(5000):
        nested = [nested]
    if field == "request":
        mutated = dict(two_nodes, request={**two_nodes["request"], "metrics_store": nested})
    else:
        mutated = dict(two_nodes, precision=nested)
    with pytest.raises(PlanFormatError, match=f"nests more than {MAX_DEPTH} deep"):
        Plan.from_dict(mutated)


def test_size_bounds_are_plan_format_errors(two_nodes: dict[str, Any]) -> None:
    with pytest.raises(PlanFormatError, match=f"at most {MAX_TEXT}"):
        Plan.from_dict(dict(two_nodes, reasons={**two_nodes["reasons"], "devices": "x" * (MAX_TEXT + 1)}))
    with pytest.raises(PlanFormatError, match=f"more than {MAX_VALUES} values"):
        Plan.from_dict(dict(two_nodes, physical_devices=["0"] * (MAX_VALUES + 1)))
    with pytest.raises(PlanFormatError, match="a key is an int"):
        Plan.from_dict(dict(two_nodes, reasons={1: "x"}))
    with pytest.raises(PlanFormatError, match=r"request\.notes"):
        request_from_json_text(json.dumps({"notes": [{"code": "c", "level": "info", "message": "a\nb"}]}))


@pytest.mark.parametrize("field", ["world_size", "num_nodes", "version"])
def test_an_integer_past_64_bits_is_a_plan_format_error_naming_it(two_nodes: dict[str, Any], field: str) -> None:
    # 10**5000 raised Python's ValueError (past 4300 digits) from the message of the check that compared it
    for number in (2**64, 10**5000):
        with pytest.raises(PlanFormatError, match=rf"plan\.{field}.*bits \(at most {MAX_INTEGER_BITS}\)"):
            Plan.from_dict(dict(two_nodes, **{field: number}))


def test_every_resolved_plan_reads_back_and_its_explanation_encodes(two_nodes: dict[str, Any]) -> None:
    plan = Plan.from_dict(two_nodes)
    assert plan.to_dict() == two_nodes
    assert unsafe_character(plan.explain().replace("\n", " ")) is None


def _record(data: dict[str, Any], **changes: Any) -> Plan:
    """A plan record with hostile values, built without reading JSON (the emitters alone must hold)."""
    plan = Plan.from_dict(data)
    return attrs.evolve(plan, **changes)


def test_an_injected_address_stays_one_word_of_the_torchrun_line(two_nodes: dict[str, Any]) -> None:
    plan = Plan.from_dict(two_nodes)
    plan = attrs.evolve(plan, cluster=attrs.evolve(plan.cluster, main_address=INJECTED_ADDRESS))
    words = shlex.split(emit_torchrun(plan, ["train.py"]))
    assert f"--rdzv-endpoint={INJECTED_ADDRESS}:29500" in words
    assert words[-1] == "train.py" and not any(word.startswith("touch") for word in words)


def test_a_note_with_a_newline_stays_one_comment_line(two_nodes: dict[str, Any]) -> None:
    note = Note(code="script-strategy", level="info", message="runs as ddp\ntouch CANARY\r\u2028x")
    plan = _record(two_nodes, notes=(note,))
    line = emit_torchrun(plan, ["train.py"])
    assert line.splitlines()[0] == "# note: runs as ddp\\ntouch CANARY\\r\\u2028x"
    assert len(line.splitlines()) == 2
    script = emit_slurm(plan, ["train.py"])
    assert "# note: runs as ddp\\ntouch CANARY" in script and "\ntouch CANARY" not in script
    manifest = emit_kubeflow(plan, ["train.py"], image="ghcr.io/me/train:1.0")
    assert len(list(yaml.safe_load_all(manifest))) == 1


def test_a_note_holding_a_second_yaml_document_stays_a_comment(two_nodes: dict[str, Any]) -> None:
    pod = "x\napiVersion: v1\nkind: Pod\nmetadata: {name: miner}\nspec: {containers: [{image: evil/miner}]}\n---"
    plan = _record(two_nodes, notes=(Note(code="script-strategy", level="info", message=pod),))
    documents = list(yaml.safe_load_all(emit_kubeflow(plan, ["train.py"], image="ghcr.io/me/train:1.0")))
    assert [document["kind"] for document in documents] == ["PyTorchJob"]


def _kubelet(word: str, environment: dict[str, str]) -> str:
    def expand(found: re.Match[str]) -> str:
        return "$" if found.group(0) == "$$" else environment.get(found.group(1), found.group(0))

    return re.sub(r"\$\$|\$\((\w+)\)", expand, word)


@pytest.mark.parametrize("word", ["$$(RANK)", "$$", "$$$(X)", "$(RANK)", "cost$HOME", "p\x85q", "\x7f", "\x80", "é中"])
def test_a_pytorchjob_hands_the_script_every_word_as_written(word: str) -> None:
    plan = resolve(Request(accelerator="cpu", num_nodes=2), Environment(cpu_count=2))
    manifest = emit_kubeflow(plan, ["train.py", word], image="ghcr.io/me/train:1.0")
    assert manifest.isascii() or all(character.isprintable() for character in manifest if character != "\n")
    (document,) = yaml.safe_load_all(manifest)
    command = document["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    assert [_kubelet(part, {"RANK": "0", "X": "x"}) for part in command] == ["python", "train.py", word]


def test_carried_values_in_a_pytorchjob_are_kept_from_the_kubelet() -> None:
    plan = resolve(Request(accelerator="cpu", num_nodes=2, precision="bf16-mixed"), Environment(cpu_count=2))
    carried = attrs.evolve(
        plan, request=attrs.evolve(plan.request, notes=(Note(code="c", level="info", message="$(RANK)"),))
    )
    (document,) = yaml.safe_load_all(emit_kubeflow(carried, ["train.py"], image="ghcr.io/me/train:1.0"))
    env = document["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    (value,) = [entry["value"] for entry in env if entry["name"] == "TRAINPLAN_REQUEST"]
    assert "$(RANK)" in _kubelet(value, {"RANK": "0"})
    assert request_from_json_text(_kubelet(value, {"RANK": "0"})) == carried.request


def test_the_text_helpers() -> None:
    assert host_address("node0") == "node0" and host_address("[::1]") == "::1"
    assert host_address(INJECTED_ADDRESS) is None and host_address("a:1") is None
    assert unsafe_character("plain é 中") is None and unsafe_character("a\x1bb") == "\x1b"
    assert one_line("a\nb\x85c\ud800") == "a\\nb\\x85c\\ud800"


def test_an_lsf_rank_host_is_checked_as_every_address_is() -> None:
    job = {"LSB_JOBID": "4321", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "3"}
    job |= {"JSM_NAMESPACE_LOCAL_RANK": "3", "LSB_MCPU_HOSTS": "node1;touch${IFS}CANARY 4"}
    with pytest.raises(ClusterEnvironmentError, match="not a host name") as caught:
        detect("auto", job)
    assert caught.value.variable == "LSB_MCPU_HOSTS"


def test_a_host_list_of_many_bracket_groups_is_read_without_expanding_it() -> None:
    from trainplan.resolve.cluster import first_host

    # 2,000 groups of 99,999 names each: expanded, 99,999**2000 names; only the first is built.
    with pytest.raises(ValueError, match="is not a host name"):
        first_host("n" + "[1-99999]" * 2000)  # its first name is 2,001 characters long
    assert first_host("n" + "[1-99999]" * 20) == "n" + "1" * 20


@pytest.mark.parametrize("name", ["0,1,2,3", "0 1", "GPU-1,GPU-2", "$(id)", "", "GPU-" + "a" * 200])
def test_a_physical_device_is_one_index_or_uuid(name: str) -> None:
    """`physical_devices: ["0,1,2,3", "4"]` for devices [1, 3] emitted CUDA_VISIBLE_DEVICES=0,1,2,3,4: a 2-GPU plan
    made 5 GPUs visible (fresh-eyes review of issue 24, D6)."""
    env = Environment(cuda_device_count=8, variables={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    data = resolve(Request(devices=[1, 3]), env).to_dict()
    assert data["physical_devices"] == ["5", "7"]
    assert Plan.from_dict({**data, "physical_devices": ["GPU-5e1c-ab", "MIG-GPU-5e1c/1/0"]}).physical_devices
    with pytest.raises(PlanFormatError, match="physical_devices") as refused:
        Plan.from_dict({**data, "physical_devices": [name, "4"]})
    assert "CUDA_VISIBLE_DEVICES" in str(refused.value)
