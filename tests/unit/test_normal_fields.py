"""The cold path's shortcuts give what the long way gives.

`resolve` takes a request written in normal names at a glance (`_normal_fields`) and sends anything else through
each field's normaliser (`_normalise_each`); its records are built by `trusted_constructor`, which skips the class
call. Each shortcut is checked here against the long way, over every normal name and a spread of spellings that
must take the long way.
"""

from __future__ import annotations

import itertools

import attrs
import pytest

from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from trainplan import BUILTIN_RULES, Environment, Request, Rules, TrainplanError
from trainplan.resolve import core
from trainplan.spec.frozen import FrozenMap, trusted_constructor
from trainplan.spec.names import ACCELERATOR_FLAGS, BACKENDS, CLUSTER_FLAGS, METRICS_STORES, PRECISIONS
from trainplan.spec.notes import Note
from trainplan.spec.options import DDPOptions, DeepSpeedOptions, FSDPOptions
from trainplan.spec.plan import ClusterInfo, MetricPlacement, Plan, StrategyChoice

RULE_SETS = pytest.mark.parametrize("rules", [BUILTIN_RULES, DOWNSTREAM_RULES], ids=["builtin", "downstream"])

# One field at a time, values the long way refuses or rewrites (aliases, case, types), beside normal ones.
SPELLINGS: dict[str, list[object]] = {
    "accelerator": ["tpu", "GPU", " cpu", "gpus", "nvidia", "cpux", 3, None, ["cpu"]],
    "strategy": ["single_tpu", "xla_debug", "DDP", "ddp-spawn", "single", "tpu", "nope", 1, ["ddp"]],
    "devices": ["auto", "AUTO", 1, 2, -1, 0, -2, 10**6, True, 1.0, "2", "0,1", "1,", [0, 1], (1, 0), [0, 0], [], "x"],
    "num_nodes": ["auto", " Auto", 1, 3, 0, -1, True, 2.0, "2", 10**7],
    "precision": [16, 32, 64, 8, True, "bf16", "16", " 32-TRUE", "double", "fp8", None, 16.0],
    "process_group_backend": [None, "NCCL", "gloo ", "tcp", 0],
    "cluster": ["torchrun", "lightning", "SLURM", "k8s", 1],
    "metrics_store": ["CPU", "gpu", None],
    "sync_batchnorm": [True, False, 1, "true", None],
    "select_usable_gpus": [True, False, 0, "yes"],
    "strategy_options": [
        None,
        DDPOptions(),
        DDPOptions(find_unused_parameters=True),
        DDPOptions(timeout_seconds=0),
        FSDPOptions(cpu_offload=True),
        DeepSpeedOptions(stage=3),
        DeepSpeedOptions(stage=7),  # type: ignore[arg-type]  # refused by the normaliser
        {"stage": 2},
        "ddp",
    ],
    "notes": [(), (Note(code="x", level="deprecation", message="m"),), ("not a note",), ["list"], None],
}


def fields_of(fields: core._Fields) -> dict[str, tuple[object, type]]:
    """Every value with its type (a value equal across types, True and 1, must not pass for the other); `as_given`
    says how the value was found, not what it is."""
    return {
        field.name: (getattr(fields, field.name), type(getattr(fields, field.name)))
        for field in attrs.fields(core._Fields)
        if field.name != "as_given"
    }


def long_way(request: Request, rules: Rules) -> tuple[core._Fields, list[TrainplanError]]:
    problems: list[TrainplanError] = []
    return core._normalise_each(request, problems.append, rules), problems


def assert_agrees(request: Request, rules: Rules) -> bool:
    """The shortcut's fields are the long way's (when it takes the request); whether it took it."""
    short = core._normal_fields(request, rules)
    long, problems = long_way(request, rules)
    if short is None:
        return False
    assert problems == [], f"the shortcut took {request!r}, which the long way refuses"
    assert fields_of(short) == fields_of(long), request
    assert not long.as_given  # the long way leaves it to `_already_normal`
    if short.as_given:  # as given: the request holds the very values (a request with notes is left to compare)
        assert core._already_normal(request, short), request
    return True


@RULE_SETS
def test_every_request_in_normal_names_takes_the_shortcut_to_the_same_fields(rules: Rules) -> None:
    accelerators = [name for name in ACCELERATOR_FLAGS if name not in ("tpu",)]
    strategies = ["auto", *rules.strategies]
    for accelerator, strategy, precision in itertools.product(accelerators, strategies, PRECISIONS):
        request = Request(accelerator=accelerator, strategy=strategy, precision=precision)  # type: ignore[arg-type]
        assert assert_agrees(request, rules), request
        assert core._normal_fields(request, rules).as_given  # type: ignore[union-attr]  # taken: just asserted
    for backend, cluster, store in itertools.product([None, *BACKENDS], CLUSTER_FLAGS, METRICS_STORES):
        request = Request(process_group_backend=backend, cluster=cluster, metrics_store=store)
        assert assert_agrees(request, rules), request


@RULE_SETS
@pytest.mark.parametrize("field", sorted(SPELLINGS))
def test_other_spellings_give_the_long_ways_fields_or_take_it(field: str, rules: Rules) -> None:
    taken = 0
    for value in SPELLINGS[field]:
        changes: dict[str, object] = {field: value}
        request = attrs.evolve(Request(), **changes)  # type: ignore[arg-type]  # values of every type, on purpose
        taken += assert_agrees(request, rules)
    assert taken < len(SPELLINGS[field])  # some of each field's spellings take the long way


def test_a_refused_or_aliased_field_takes_the_long_way_with_its_notes_and_problems() -> None:
    assert core._normal_fields(Request(strategy="single_tpu"), BUILTIN_RULES) is None  # type: ignore[arg-type]
    assert core._normal_fields(Request(precision=16), BUILTIN_RULES) is None
    assert core._normal_fields(Request(devices=0), BUILTIN_RULES) is None
    assert core._normal_fields(Request(devices=[1, 0]), BUILTIN_RULES) is not None  # indices: normalised, not given
    fields, problems = long_way(Request(precision="bf16", devices=0), BUILTIN_RULES)
    assert [note.code for note in fields.notes] == ["precision-alias"]
    assert [problem.field for problem in problems] == ["devices"]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------
# trusted_constructor


def test_records_built_by_the_trusted_constructor_equal_the_class_calls() -> None:
    env = Environment(cuda_device_count=2, variables={"CUDA_VISIBLE_DEVICES": "3,1"})
    for request in (Request(), Request(accelerator="cuda", strategy="ddp", devices=2, precision="bf16-mixed")):
        plan = core.resolve_uncached(request, env)
        records: tuple[attrs.AttrsInstance, ...] = (plan, plan.strategy, plan.cluster, plan.metrics, *plan.notes)
        for record in records:
            values = {field.name: getattr(record, field.name) for field in attrs.fields(type(record))}
            built = trusted_constructor(type(record))(**values)
            assert type(built) is type(record)
            assert built == record
            assert hash(built) == hash(record)
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                built.__setattr__("notes", ())  # still frozen


def test_the_trusted_constructor_takes_the_defaults_of_the_class() -> None:
    build = trusted_constructor(Note)
    assert build(code="c", level="info", message="m") == Note(code="c", level="info", message="m")
    with pytest.raises(TypeError):
        build(code="c", level="info")  # type: ignore[call-arg]  # a field without a default is required
    plan_fields = {field.name: field.default for field in attrs.fields(Plan)}
    assert plan_fields["physical_devices"] == () and plan_fields["mesh"] is None and plan_fields["rules"] is None
    for record in (StrategyChoice, ClusterInfo, MetricPlacement, Plan):
        trusted_constructor(record)  # every record the resolver builds with it is accepted


def test_the_trusted_constructor_refuses_records_whose_checks_it_would_skip() -> None:
    @attrs.frozen(kw_only=True)
    class Validated:
        count: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen(kw_only=True)
    class Checked:
        count: int

        def __attrs_post_init__(self) -> None:
            pass

    @attrs.frozen(kw_only=True)
    class Collected:
        items: list[int] = attrs.Factory(list)

    @attrs.define(kw_only=True, slots=False)
    class Unslotted:
        count: int

    records: tuple[type[object], ...] = (Validated, Checked, Collected, Unslotted)
    for record in records:
        with pytest.raises(TypeError, match="build it by calling the class"):
            trusted_constructor(record)


def test_a_plan_built_on_the_cold_path_keeps_its_converted_types() -> None:
    plan = core.resolve_uncached(Request(), Environment())
    assert type(plan.notes) is tuple
    assert isinstance(plan.reasons, FrozenMap)
    assert type(plan.physical_devices) is tuple
    assert plan == Plan.from_dict(plan.to_dict())
