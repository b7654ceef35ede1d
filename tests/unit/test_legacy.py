"""The deprecation bridge: old Trainer flags → the modern request, with notes that teach the new spelling."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import cuda
from trainplan import (
    DeepSpeedOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    InvalidRequest,
    Plan,
    Request,
    TrainplanError,
    Unavailable,
)
from trainplan.cli import main
from trainplan.render.spelling import flag_spelling, python_spelling
from trainplan.resolve import resolve

# old flags → (the modern request, the note codes)
TABLE: dict[str, tuple[dict[str, Any], Request, set[str]]] = {
    "gpus int, ddp as accelerator": (
        {"gpus": 2, "accelerator": "ddp"},
        Request(accelerator="gpu", devices=2, strategy="ddp"),
        {"legacy-gpus", "legacy-accelerator"},
    ),
    "gpus list": ({"gpus": [0, 3]}, Request(accelerator="gpu", devices=(0, 3)), {"legacy-gpus"}),
    "gpus string": ({"gpus": "0,1"}, Request(accelerator="gpu", devices=(0, 1)), {"legacy-gpus"}),
    "gpus all": ({"gpus": -1}, Request(accelerator="gpu", devices=-1), {"legacy-gpus"}),
    "gpus zero means cpu": ({"gpus": 0}, Request(accelerator="cpu"), {"legacy-gpus"}),
    "tpu cores": ({"tpu_cores": 8}, Request(accelerator="xla", devices=8), {"legacy-tpu_cores"}),
    "tpu core index": ({"tpu_cores": [5]}, Request(accelerator="xla", devices=(5,)), {"legacy-tpu_cores"}),
    "ddp_cpu with processes": (
        {"num_processes": 4, "accelerator": "ddp_cpu"},
        Request(accelerator="cpu", devices=4, strategy="ddp"),
        {"legacy-num_processes", "legacy-accelerator"},
    ),
    "distributed_backend": (
        {"gpus": 2, "distributed_backend": "ddp_spawn"},
        Request(accelerator="gpu", devices=2, strategy="ddp_spawn"),
        {"legacy-gpus", "legacy-distributed_backend"},
    ),
    "training_type": ({"training_type": "ddp"}, Request(strategy="ddp"), {"legacy-training_type"}),
    "sharded plugin": (
        {"gpus": 2, "plugins": "ddp_sharded"},
        Request(
            accelerator="gpu",
            devices=2,
            strategy="fsdp",
            strategy_options=FSDPOptions(sharding_strategy="SHARD_GRAD_OP"),
        ),
        {"legacy-gpus", "legacy-plugins"},
    ),
    "sharded spawn plugin list": (
        {"gpus": 2, "plugins": ["ddp_sharded_spawn"]},
        Request(
            accelerator="gpu",
            devices=2,
            strategy="fsdp",
            strategy_options=FSDPOptions(sharding_strategy="SHARD_GRAD_OP"),
        ),
        {"legacy-gpus", "legacy-plugins"},
    ),
    "deepspeed plugin": (
        {"gpus": 4, "plugins": "deepspeed_stage_3_offload"},
        Request(accelerator="gpu", devices=4, strategy="deepspeed_stage_3_offload"),
        {"legacy-gpus", "legacy-plugins"},
    ),
    "sharded as strategy": (
        {"strategy": "ddp_sharded", "devices": 2},
        Request(devices=2, strategy="fsdp", strategy_options=FSDPOptions(sharding_strategy="SHARD_GRAD_OP")),
        {"legacy-strategy"},
    ),
    "precision plugin": ({"plugins": "native_amp"}, Request(precision="16-mixed"), {"legacy-plugins"}),
    "old precision spellings": ({"precision": 16}, Request(precision="16-mixed"), {"precision-alias"}),
    "bf16 spelling": ({"precision": "bf16"}, Request(precision="bf16-mixed"), {"precision-alias"}),
    "native amp backend": (
        {"precision": "16-mixed", "amp_backend": "native"},
        Request(precision="16-mixed"),
        {"legacy-amp_backend"},
    ),
    "auto select": (
        {"gpus": 2, "auto_select_gpus": True},
        Request(accelerator="gpu", devices=2, select_usable_gpus=True),
        {"legacy-gpus", "legacy-auto_select_gpus"},
    ),
    "metrics to cpu": (
        {"move_metrics_to_cpu": True},
        Request(metrics_store="cpu"),
        {"legacy-move_metrics_to_cpu"},
    ),
    "modern flags pass through": (
        {"accelerator": "cuda", "strategy": "ddp", "devices": 2, "num_nodes": 2},
        Request(accelerator="cuda", strategy="ddp", devices=2, num_nodes=2),
        set(),
    ),
    "gpus agrees with devices and cuda": (
        {"gpus": 2, "devices": "2", "accelerator": "cuda"},
        Request(accelerator="cuda", devices=2),
        {"legacy-gpus"},
    ),
    "None values are absent": ({"gpus": None, "tpu_cores": None}, Request(), set()),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_old_config_becomes_the_modern_request(name: str) -> None:
    old, modern, codes = TABLE[name]
    request = Request.from_legacy(**old)
    assert request == modern
    assert {note.code for note in request.notes} == codes
    for note in request.notes:
        assert (note.level == "deprecation" and "→" in note.message) or note.code == "precision-alias"


CONFLICTS: dict[str, tuple[dict[str, Any], type[TrainplanError], tuple[str, ...]]] = {
    "gpus and devices": ({"gpus": 2, "devices": 4}, Incompatible, ("gpus=2", "devices=4", "devices= once")),
    "ddp accelerator and ddp_spawn strategy": (
        {"accelerator": "ddp", "strategy": "ddp_spawn"},
        Incompatible,
        ("accelerator='ddp'", "strategy='ddp_spawn'"),
    ),
    "tpu and gpus": ({"tpu_cores": 8, "gpus": 2}, Incompatible, ("tpu_cores=8", "gpus=2")),
    "gpus and num_processes": ({"gpus": 2, "num_processes": 2}, Incompatible, ("gpus=2", "num_processes=2")),
    "gpus with cpu": ({"gpus": 2, "accelerator": "cpu"}, Incompatible, ("accelerator='cpu'",)),
    "precision plugin and precision": (
        {"plugins": "native_amp", "precision": "16-mixed"},
        Incompatible,
        ("only one may",),
    ),
    "sharded name and options": (
        {"plugins": "ddp_sharded", "strategy_options": FSDPOptions()},
        Incompatible,
        ("strategy_options",),
    ),
    "ddp2": ({"accelerator": "ddp2"}, Incompatible, ("ddp2", "strategy='ddp'")),
    "horovod": ({"distributed_backend": "horovod"}, Incompatible, ("torchrun",)),
    "apex": ({"amp_backend": "apex"}, Incompatible, ("precision='16-mixed'",)),
    "amp level": ({"amp_level": "O2"}, Incompatible, ("apex",)),
    "ipus": ({"ipus": 8}, Incompatible, ("IPUs",)),
    "hpu accelerator": ({"accelerator": "hpu"}, Incompatible, ("HPUs",)),
    "unknown flag": ({"gpuss": 2}, InvalidRequest, ("Did you mean flag='gpus'",)),
    "unknown plugin": ({"plugins": "apex_magic"}, InvalidRequest, ("plugins",)),
    "bad gpus": ({"gpus": "two"}, InvalidRequest, ("devices",)),
    "bad auto select": ({"auto_select_gpus": "yes please"}, InvalidRequest, ("auto_select_gpus",)),
}


@pytest.mark.parametrize("name", list(CONFLICTS))
def test_conflicts_and_removed_strategies_raise_the_right_error(name: str) -> None:
    old, error_type, words = CONFLICTS[name]
    with pytest.raises(error_type) as caught:
        Request.from_legacy(**old)
    for word in words:
        assert word in str(caught.value)


def test_notes_flow_into_the_plan() -> None:
    plan = resolve(Request.from_legacy(gpus=2, accelerator="ddp"), cuda(2))
    assert {"legacy-gpus", "legacy-accelerator"} <= {note.code for note in plan.notes}


def test_auto_select_takes_the_usable_gpus_from_the_environment() -> None:
    request = Request.from_legacy(gpus=2, auto_select_gpus=True)
    env = cuda(4, usable_cuda_devices=(1, 3))
    assert resolve(request, env).devices == (1, 3)
    with pytest.raises(Unavailable, match=r"busy: \[0, 2\]"):
        resolve(Request.from_legacy(gpus=3, auto_select_gpus=True), env)
    with pytest.raises(Unavailable, match="not probed"):
        resolve(request, cuda(4))
    with pytest.raises(Incompatible, match="already names them"):
        resolve(Request.from_legacy(gpus=[0, 1], auto_select_gpus=True), env)


def test_move_metrics_to_cpu_explains_the_move_for_nccl() -> None:
    plan = resolve(Request.from_legacy(gpus=2, move_metrics_to_cpu=True), cuda(2))
    assert plan.metrics.default_store == "cpu" and plan.metrics.cpu_values_move_for_reduction


def test_spellings() -> None:
    request = Request.from_legacy(gpus="0,2", plugins="deepspeed", precision=16)
    assert (
        python_spelling(request)
        == "Request(accelerator='gpu', strategy='deepspeed', devices=[0, 2], precision='16-mixed')"
    )
    assert flag_spelling(request) == "--accelerator gpu --strategy deepspeed --devices 0,2 --precision 16-mixed"
    options = Request(strategy="deepspeed", strategy_options=DeepSpeedOptions(stage=3))
    assert flag_spelling(options) == "--strategy deepspeed --strategy-option stage=3"


def test_migrate_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--gpus", "2", "--accelerator", "ddp", "--precision", "16"]) == 0
    out = capsys.readouterr().out
    assert "Request(accelerator='gpu', strategy='ddp', devices=2, precision='16-mixed')" in out
    assert "trainplan plan --accelerator gpu --strategy ddp --devices 2 --precision 16-mixed" in out
    assert "legacy-gpus" in out


def test_migrate_conflict_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["migrate", "--gpus", "2", "--devices", "4"])
    assert exit_.value.code == 2 and "gpus='2'" in capsys.readouterr().err


# -- property: every legacy config with a modern equivalent resolves to the modern request's plan --------

ACCELERATOR_STRATEGY_ORACLE = {"ddp": "ddp", "ddp_spawn": "ddp_spawn", "dp": "dp", "ddp_fork": "ddp_fork"}
PRECISION_ORACLE: dict[object, str] = {16: "16-mixed", 32: "32-true", 64: "64-true", "bf16": "bf16-mixed"}


@st.composite
def legacy_configs(draw: st.DrawFn) -> tuple[dict[str, object], Request]:
    """An old config and, written independently of the bridge, the modern request it means."""
    old: dict[str, object] = {}
    modern: dict[str, Any] = {}
    gpus = draw(st.sampled_from([None, 1, 2, -1, "0,1", [1], [0, 1]]))
    if gpus is not None:
        old["gpus"] = gpus
        modern["accelerator"] = "gpu"
        modern["devices"] = tuple(gpus) if isinstance(gpus, list) else (0, 1) if gpus == "0,1" else gpus
    legacy_strategy = draw(st.sampled_from([None, *ACCELERATOR_STRATEGY_ORACLE]))
    if legacy_strategy is not None:
        old[draw(st.sampled_from(["accelerator", "distributed_backend", "training_type"]))] = legacy_strategy
        modern["strategy"] = ACCELERATOR_STRATEGY_ORACLE[legacy_strategy]
    precision = draw(st.sampled_from([None, *PRECISION_ORACLE]))
    if precision is not None:
        old["precision"] = precision
        modern["precision"] = PRECISION_ORACLE[precision]
    if draw(st.booleans()):
        old["move_metrics_to_cpu"] = True
        modern["metrics_store"] = "cpu"
    return old, Request(**modern)


def strip_notes(plan: Plan) -> Plan:
    return attrs.evolve(plan, notes=(), request=attrs.evolve(plan.request, notes=()))


@settings(max_examples=200, deadline=None)
@given(legacy_configs(), st.sampled_from([cuda(1), cuda(2), cuda(4, interactive=True), Environment(cpu_count=4)]))
def test_legacy_and_modern_resolve_to_the_same_plan(case: tuple[dict[str, object], Request], env: Environment) -> None:
    old, modern = case
    try:
        expected: Plan | type[TrainplanError] = strip_notes(resolve(modern, env))
    except TrainplanError as error:
        expected = type(error)
    try:
        actual: Plan | type[TrainplanError] = strip_notes(resolve(Request.from_legacy(**old), env))
    except TrainplanError as error:
        actual = type(error)
    assert actual == expected


@pytest.mark.parametrize(
    ("old", "says"),
    [
        ("tpu_spawn", "Write strategy='xla' with accelerator='xla', or pass the old spelling to Request.from_legacy("),
        ("DDP_Sharded", "Write strategy='fsdp', or pass the old spelling to Request.from_legacy("),
        ("ddp2", "Use strategy='ddp'"),
    ],
)
def test_an_old_strategy_name_in_a_modern_request_says_what_it_became(old: str, says: str) -> None:
    """`Request.from_config` and `resolve` meet an old Trainer name with what it became (or why nothing did), not
    with the nearest spelling (`tpu_spawn` is not `ddp_spawn`); the bridge itself still maps it."""
    with pytest.raises(InvalidRequest) as caught:
        Request.from_config({"strategy": old})
    assert "old Trainer strategy name" in str(caught.value) and says in str(caught.value)
    assert "ddp_spawn" not in str(caught.value)
    with pytest.raises(InvalidRequest, match="old Trainer strategy name"):
        resolve(Request(strategy=old), Environment())  # type: ignore[arg-type]
