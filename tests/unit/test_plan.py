"""The plan as a value: JSON round-trip, explanation, device strings, the normalised request."""

from __future__ import annotations

import json
import pickle

import pytest

from tests.helpers import SLURM_2x4, cpu, cuda, plan_for
from trainplan import DeepSpeedOptions, Plan, PlanFormatError, Request
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import resolve_uncached
from trainplan.spec.frozen import FrozenMap


def test_json_round_trip_gives_an_equal_plan() -> None:
    plan = plan_for(
        cuda(4, packages={"deepspeed"}, variables=SLURM_2x4),
        strategy="deepspeed_stage_3",
        devices=4,
        num_nodes=2,
        precision=16,
        strategy_options=DeepSpeedOptions(offload_optimizer=True),
    )
    text = json.dumps(plan.to_dict())
    assert plan_from_json_text(text) == plan
    assert Plan.from_dict(json.loads(text)).notes == plan.notes


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda data: data.pop("accelerator"), "plan.accelerator"),
        (lambda data: data.update(accelerator="gpux"), "plan.accelerator"),
        (lambda data: data.update(devices=[0, "1"]), "plan.devices"),
        (lambda data: data["cluster"].update(node_rank=True), "plan.cluster.node_rank"),
        (lambda data: data.update(version=2), "plan.version"),
        (lambda data: data.pop("device_type"), "plan.device_type"),
        (lambda data: data.update(device_type="cpu"), "plan.device_type"),
        (lambda data: data["metrics"].update(device_type="cpu"), "plan.metrics.device_type"),
        (lambda data: data["strategy"].update(options={"kind": "ddp", "bogus": 1}), "plan.strategy.options"),
    ],
)
def test_bad_plan_data_names_the_path(mutate: object, path: str) -> None:
    data = json.loads(json.dumps(plan_for(cuda(2)).to_dict()))
    mutate(data)  # type: ignore[operator]
    with pytest.raises(PlanFormatError) as caught:
        Plan.from_dict(data)
    assert caught.value.path == path


def test_non_json_text_is_a_plan_format_error() -> None:
    with pytest.raises(PlanFormatError):
        plan_from_json_text("{not json")


def test_explain_gives_every_choice_and_its_reason() -> None:
    text = plan_for(cuda(2), precision="16-mixed").explain()
    for word in ("accelerator", "cuda:0, cuda:1", "ddp", "subprocess", "nccl", "16-mixed", "why:", "notes:"):
        assert word in text


def test_device_strings_per_local_rank() -> None:
    plan = plan_for(cuda(8), devices=[3, 5])
    assert plan.device_strings == ("cuda:3", "cuda:5")
    assert plan.device_for(1) == "cuda:5"
    with pytest.raises(IndexError, match="local_rank=2"):
        plan.device_for(2)


def test_the_device_type_is_the_accelerator_rows() -> None:
    """A plan carries its accelerator's device type (from the row), and writes devices with it: not with the metric
    placement's, which only says where logged values live."""
    for plan, expected in ((plan_for(cuda(2)), "cuda"), (plan_for(cpu(), devices=2), "cpu")):
        assert plan.device_type == expected
        assert plan.device_strings[0].split(":")[0] == expected
    plan = plan_for(cuda(2))
    assert plan.device_for(1) == "cuda:1"


def test_dp_drives_several_devices_from_one_process() -> None:
    plan = plan_for(cuda(4), strategy="dp")
    assert (plan.devices, plan.processes_per_node, plan.world_size) == ((0, 1, 2, 3), 1, 1)
    assert plan.device_strings == ("cuda:0",)


def test_plan_request_is_normalised_and_typed() -> None:
    plan = plan_for(cpu(), accelerator="CPU", devices="2", precision="BF16", strategy="DDP")
    assert plan.request == Request(accelerator="cpu", strategy="ddp", devices=2, precision="bf16-mixed")


def test_records_are_immutable_values() -> None:
    plan = plan_for(cpu())
    with pytest.raises(AttributeError):
        plan.world_size = 3  # type: ignore[misc]
    assert hash(plan) == hash(plan_for(cpu()))


def test_reasons_written_when_read_are_the_same_value_as_written_ones() -> None:
    """The resolver leaves its reasons to be rendered on first read: the value is the map of the rendered texts."""
    env = cuda(4, variables=SLURM_2x4)
    for request in (Request(), Request(strategy="ddp", devices=4, num_nodes=2), Request(process_group_backend="gloo")):
        plan, again = resolve_uncached(request, env), resolve_uncached(request, env)
        written = FrozenMap(dict(again.reasons))
        assert hash(plan.reasons) == hash(written) and plan.reasons == written and written == plan.reasons
        assert plan == again and hash(plan) == hash(again)
        assert len(plan.reasons) == len(written) and list(plan.reasons) == list(written)
        assert "accelerator" in plan.reasons and plan.reasons["strategy"] == written["strategy"]
        assert repr(plan.reasons) == repr(written)
        copied = pickle.loads(pickle.dumps(plan.reasons))
        assert type(copied) is FrozenMap and copied == written
        assert all(type(text) is str for text in plan.reasons.values())
    assert resolve_uncached(Request(), cpu()).reasons["accelerator"].startswith("the best available of only cpu")


def test_a_plan_read_back_keeps_the_options_its_strategy_name_fixes() -> None:
    """`ddp_find_unused_parameters_true` fixes find_unused_parameters=True: a plan saying otherwise is refused when
    read back, as resolve refuses such options (a worker trusts the plan it reads)."""
    plan = plan_for(cpu(), strategy="ddp_find_unused_parameters_true", devices=2)
    data = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(data) == plan
    data["strategy"]["options"]["find_unused_parameters"] = False
    with pytest.raises(PlanFormatError) as caught:
        Plan.from_dict(data)
    assert caught.value.path == "plan.strategy.options.find_unused_parameters"
