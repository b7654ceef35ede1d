"""A rule set holds together as a whole: `Rules.extend` (and `Rules(...)`, `attrs.evolve`) refuse what could not be
resolved, each downstream row's fields are checked by type and meaning, and a rule set pickles and copies."""

from __future__ import annotations

import copy
import pickle
from typing import Any, TypeVar

import attrs
import pytest

from tests import downstream_rules
from tests.downstream_rules import HCCL, INT8_QAT, NPU, RULES
from trainplan import (
    BUILTIN_RULES,
    CustomName,
    Environment,
    FrameworkAccelerator,
    InvalidRequest,
    Request,
    Rules,
    StrategyRule,
)
from trainplan.resolve import resolve, resolve_uncached
from trainplan.rules import (
    LEGACY_STRATEGIES,
    ClusterRule,
    JobVariables,
    every_problem,
)
from trainplan.rules.coherence import problems

T = TypeVar("T")

NPU_ROW = RULES.accelerators[NPU]
HCCL_ROW = RULES.backends[HCCL]
QAT_ROW = RULES.precisions[INT8_QAT]
QAT_RECIPE = RULES.precision_recipes[INT8_QAT]
BUILTIN = BUILTIN_RULES
FP32 = BUILTIN.precisions["32-true"]
DDP, SINGLE = BUILTIN.families["ddp"], BUILTIN.families["single_device"]


def _with(row: T, **changes: Any) -> T:
    """`attrs.evolve`, with values of any type: the refusals are what is tested."""
    given: Any = row
    changed: T = attrs.evolve(given, **changes)
    return changed


def _plugin(**rows: Any) -> dict[str, Any]:
    """An NPU plugin's rows that hold together (as `tests.downstream_rules`'s), with some replaced."""
    given: dict[str, Any] = {
        "accelerators": [NPU_ROW],
        "backends": [HCCL_ROW],
        "families": [_with(row, accelerators=row.accelerators | {NPU}) for row in (DDP, SINGLE)],
        "precisions": [RULES.precisions["32-true"]],
    }
    return {**given, **rows}


def test_the_builtin_and_the_downstream_rule_sets_hold_together() -> None:
    """Every rule set the tests and the README use passes the whole-set checks (they run at construction)."""
    sets = [value for value in vars(downstream_rules).values() if isinstance(value, Rules)]
    assert BUILTIN_RULES in sets and RULES in sets and len(sets) >= 3
    assert BUILTIN_RULES.extend(**_plugin()).accelerators[NPU] == NPU_ROW
    for rules in sets:
        assert resolve_uncached(Request(), Environment(), rules).accelerator == "cpu"


@pytest.mark.parametrize(
    ("rows", "field", "words"),
    [
        # Finding 1's repros: each replaced row broke a bare Request() or a strategy somewhere.
        (
            {"precisions": [_with(FP32, accelerators=frozenset())]},
            "rules.precisions['32-true'].accelerators",
            "runs the default precision '32-true' on 'cpu'",
        ),
        (
            {"families": [_with(DDP, accelerators=frozenset())]},
            "rules.families['ddp'].accelerators",
            "family 'ddp' would run on nothing",
        ),
        (
            {"families": [_with(DDP, precisions=frozenset())]},
            "rules.families['ddp'].precisions",
            "family 'ddp' would run at nothing",
        ),
        (
            {"families": [_with(SINGLE, accelerators=frozenset({"cuda"}), why_not={})]},
            "rules.families['single_device'].accelerators",
            "accelerator 'mps' would be listed by no family",
        ),
        (
            {"families": [_with(SINGLE, accelerators=frozenset({"cuda", "mps"}))]},
            "rules.families['single_device'].accelerators",
            "'auto' picks 'single_device' for 1 'cpu' device",
        ),
        (
            {"families": [_with(SINGLE, precisions=SINGLE.precisions - {"32-true"})]},
            "rules.families['single_device'].precisions",
            "Request() on a bare machine",
        ),
    ],
)
def test_a_replaced_row_that_breaks_the_builtin_rule_set_is_refused_naming_it(
    rows: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        BUILTIN_RULES.extend(**rows)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_an_extension_that_drops_its_accelerator_from_the_families_auto_picks_is_refused() -> None:
    """`device_counts={'npu': 2}` makes 'auto' pick the NPU: the families it then runs must list it."""
    with pytest.raises(
        InvalidRequest, match=r"rules\.families\['single_device'\]\.accelerators.*would be listed by no family"
    ):
        RULES.extend(families=[DDP, SINGLE])
    with pytest.raises(InvalidRequest, match=r"'auto' picks 'ddp' for 2 'npu' device\(s\)") as caught:
        RULES.extend(families=[DDP])
    assert caught.value.field == "rules.families['ddp'].accelerators"
    with pytest.raises(InvalidRequest, match=r"'auto' picks 'single_device' for 1 'npu'"):
        BUILTIN_RULES.extend(**_plugin(families=[_with(DDP, accelerators=DDP.accelerators | {NPU})]))


def test_rules_built_directly_or_evolved_run_the_same_checks() -> None:
    """Not MissingRule at the first resolve: `InvalidRequest` naming the row, when the rule set is built."""
    with pytest.raises(InvalidRequest, match=r"rules\.default_precision='32-true'.*no such precision"):
        _with(BUILTIN_RULES, precisions={})
    with pytest.raises(InvalidRequest, match=r"rules\.families\['ddp'\]\.accelerators.*would run on nothing"):
        _with(BUILTIN_RULES, families={**BUILTIN.families, "ddp": _with(DDP, accelerators=frozenset())})
    with pytest.raises(InvalidRequest, match=r"rules\.auto_strategies.*no row picks a strategy"):
        _with(BUILTIN_RULES, auto_strategies=())
    bad_priority = _with(BUILTIN.accelerators["cpu"], auto_priority=None)
    with pytest.raises(InvalidRequest, match=r"rules\.accelerators\['cpu'\]\.auto_priority"):
        _with(BUILTIN_RULES, accelerators={**BUILTIN.accelerators, "cpu": bad_priority})


def _npu(**changes: Any) -> dict[str, Any]:
    return _plugin(accelerators=[_with(NPU_ROW, **changes)])


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        (_npu(auto_priority=None), "rules.accelerators['npu'].auto_priority"),
        (_npu(auto_priority=True), "rules.accelerators['npu'].auto_priority"),
        (_npu(auto_priority=2.5), "rules.accelerators['npu'].auto_priority"),
        (_npu(fork_blocked_by="junk"), "rules.accelerators['npu'].fork_blocked_by"),
        (_npu(device_type="cuda"), "rules.accelerators['npu'].device_type"),
        (_npu(device_type="cpu"), "rules.accelerators['npu'].device_type"),
        (_npu(device_type="npu:0"), "rules.accelerators['npu'].device_type"),
        (_npu(strategy_fix=5), "rules.accelerators['npu'].strategy_fix"),
        (_npu(description=None), "rules.accelerators['npu'].description"),
        (_npu(counts_why=0), "rules.accelerators['npu'].counts_why"),
        (_npu(takes_indices="yes"), "rules.accelerators['npu'].takes_indices"),
        (_npu(host=0), "rules.accelerators['npu'].host"),
        (_npu(slurm_gpus=None), "rules.accelerators['npu'].slurm_gpus"),
        (_npu(job_layout="true"), "rules.accelerators['npu'].job_layout"),
        (_npu(probes_usable=None), "rules.accelerators['npu'].probes_usable"),
        (_plugin(backends=[_with(HCCL_ROW, description=3)]), "rules.backends['hccl'].description"),
        (
            _plugin(backends=[_with(HCCL_ROW, needs_device_tensors=1)]),
            "rules.backends['hccl'].needs_device_tensors",
        ),
        (_plugin(backends=[_with(HCCL_ROW, accelerators=NPU)]), "rules.backends['hccl'].accelerators"),
        (_plugin(backends=[_with(HCCL_ROW, why_not={"cpu": 1})]), "rules.backends['hccl'].why_not"),
        (_plugin(families=[_with(DDP, description=None)]), "rules.families['ddp'].description"),
        (_plugin(families=[_with(DDP, multi_process=False)]), "rules.families['ddp'].multi_process"),
        (_plugin(families=[_with(DDP, has_process_group=False)]), "rules.families['ddp'].has_process_group"),
        (_plugin(families=[_with(DDP, max_nodes=0)]), "rules.families['ddp'].max_nodes"),
        (_plugin(families=[_with(DDP, max_devices_per_node="8")]), "rules.families['ddp'].max_devices_per_node"),
        (_plugin(families=[_with(DDP, requires_package=7)]), "rules.families['ddp'].requires_package"),
        (_plugin(families=[_with(DDP, accelerator_fix=7)]), "rules.families['ddp'].accelerator_fix"),
        (_plugin(families=[_with(DDP, base_strategy="ddpp")]), "rules.families['ddp'].base_strategy"),
        (_plugin(families=[_with(DDP, why_not={"mps": None})]), "rules.families['ddp'].why_not"),
        (_plugin(families=[_with(DDP, accelerators=["cpu"])]), "rules.families['ddp'].accelerators"),
        ({"precisions": [_with(FP32, description=1)]}, "rules.precisions['32-true'].description"),
        (
            {"precisions": [_with(FP32, requires_package="not a package")]},
            "rules.precisions['32-true'].requires_package",
        ),
        ({"precisions": [_with(FP32, why_not={"mps": 1})]}, "rules.precisions['32-true'].why_not"),
        ({"precisions": [_with(FP32, fallback=None)]}, "rules.precisions['32-true'].fallback"),
        ({"precisions": [_with(FP32, accelerators="cpu")]}, "rules.precisions['32-true'].accelerators"),
    ],
)
def test_each_field_of_a_downstream_row_is_checked(rows: dict[str, Any], field: str) -> None:
    """A wrong type or meaning is refused at `extend`, naming the field (no TypeError, no AttributeError later)."""
    with pytest.raises(InvalidRequest) as caught:
        BUILTIN_RULES.extend(**rows)
    assert caught.value.field == field


def _qat(**changes: Any) -> dict[str, Any]:
    families = [_with(SINGLE, precisions=SINGLE.precisions | {INT8_QAT})]
    precision = _with(QAT_ROW, accelerators=frozenset({"cpu", "cuda"}))
    return {"precisions": [precision], "precision_recipes": [_with(QAT_RECIPE, **changes)], "families": families}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"autocast_dtype": "int8"}, "autocast_dtype"),
        ({"parameter_dtype": None}, "parameter_dtype"),
        ({"accelerate": "fp4"}, "accelerate"),
        ({"engine": "tensorrt"}, "engine"),
        ({"grad_scaler_on": "cuda"}, "grad_scaler_on"),
        ({"grad_scaler_on": frozenset({"npu"})}, "grad_scaler_on"),
    ],
)
def test_each_field_of_a_precision_recipe_is_checked(changes: dict[str, Any], field: str) -> None:
    assert INT8_QAT in BUILTIN_RULES.extend(**_qat()).precision_recipes  # the rows unchanged hold
    with pytest.raises(InvalidRequest) as caught:
        BUILTIN_RULES.extend(**_qat(**changes))
    assert caught.value.field == f"rules.precision_recipes['int8-qat'].{field}"


def test_a_fork_blocker_is_a_fact_the_environment_has() -> None:
    """What `fork_blocked_by` may name is read from its type's vocabulary; each name is an Environment fact."""
    from typing import get_args

    from trainplan.rules.hardware import ForkBlocker

    assert all(isinstance(getattr(Environment(), fact), bool) for fact in get_args(ForkBlocker))
    with pytest.raises(InvalidRequest, match=r"fork_blocked_by='junk'.*the Environment fact") as caught:
        BUILTIN_RULES.extend(**_npu(fork_blocked_by="junk"))
    assert caught.value.allowed == get_args(ForkBlocker)


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name, row in LEGACY_STRATEGIES.items()
        if row.strategy != name and name not in BUILTIN_RULES.strategy_spellings  # an alias is refused as one
    ),
)
def test_a_legacy_name_that_means_another_strategy_is_not_a_new_strategy(name: str) -> None:
    with pytest.raises(InvalidRequest, match="it is an old Lightning name"):
        BUILTIN_RULES.extend(strategies=[StrategyRule(name=CustomName(name), family="ddp", launcher="subprocess")])


@pytest.mark.parametrize("clone", [lambda rules: pickle.loads(pickle.dumps(rules)), copy.deepcopy, copy.copy])
def test_a_rule_set_pickles_and_copies_and_resolves_the_same_plans(clone: Any) -> None:
    """The builtin rule set round-trips as itself (its plans record no rule set); another is a new value, distinct
    by identity (so a memo never confuses the two), with the same rows and reference: it resolves equal plans."""
    assert clone(BUILTIN_RULES) is BUILTIN_RULES
    copied = clone(RULES)
    assert copied is not RULES and copied.reference == RULES.reference
    assert dict(copied.accelerators) == dict(RULES.accelerators) and copied.accelerator_order == RULES.accelerator_order
    env = Environment(packages=frozenset({"torchao"})).with_device_counts({NPU: 2})
    for request in (Request(), Request(precision=INT8_QAT), Request(accelerator="cpu", devices=3)):
        assert resolve(request, env, copied) == resolve_uncached(request, env, RULES)
    unnamed = BUILTIN_RULES.extend(**_plugin())
    assert resolve_uncached(Request(), env, clone(unnamed)) == resolve_uncached(Request(), env, unnamed)
    with pytest.raises(TypeError):
        copied.accelerators[NPU] = NPU_ROW  # read-only, as the original's


B = BUILTIN_RULES
GLOO = B.backends["gloo"]


REFERENCE_CASES: list[tuple[dict[str, Any], str, str]] = [
    # The second review's repros: each built a rule set that failed with MissingRule later, or planned wrongly.
    (
        {"families": {**B.families, "ddp": _with(DDP, multi_process=False)}},
        "rules.families['ddp'].multi_process",
        "runs family 'ddp' as its built-in row says",
    ),
    (
        {"families": {**dict[str, Any](B.families.items()), "nofam": _with(DDP, family="nofam")}},
        "rules.families['nofam']",
        "custom families need a runtime of their own",
    ),
    (
        {"families": {**B.families, "fsdp": DDP}},
        "rules.families['fsdp']",
        "under its own name",
    ),
    (
        {"strategies": {**B.strategies, "ddp": _with(B.strategies["ddp"], family="nofam")}},
        "rules.strategies['ddp'].family",
        "no such family",
    ),
    (
        {"strategies": {**B.strategies, "ddp": _with(B.strategies["ddp"], launcher="nolaunch")}},
        "rules.strategies['ddp'].launcher",
        "no such launcher",
    ),
    (
        {"launchers": {name: row for name, row in B.launchers.items() if name != "spawn"}},
        "rules.launchers",
        "starts workers with launcher 'spawn'",
    ),
    (
        {"launchers": {**B.launchers, "subprocess": _with(B.launchers["subprocess"], in_started_job="nope")}},
        "rules.launchers['subprocess'].in_started_job",
        "no such launcher",
    ),
    ({"clusters": {}}, "rules.clusters", "a process outside any cluster manager"),
    (
        {"clusters": {name: row for name, row in B.clusters.items() if name != "local"}},
        "rules.clusters",
        "no row is detected without cluster variables",
    ),
    ({"auto_for_options": {"deepspeed": "nope"}}, "rules.auto_for_options['deepspeed']", "no such strategy"),
    ({"auto_for_options": {"nofam": "ddp"}}, "rules.auto_for_options", "no such family"),
    (
        {"auto_strategies": (_with(B.auto_strategies[0], strategy="nope"), *B.auto_strategies)},
        "rules.auto_strategies[0].strategy",
        "no such strategy",
    ),
    (
        {"precisions": {**B.precisions, "16-mixed": _with(B.precisions["16-mixed"], fallback={"cpu": "nope"})}},
        "rules.precisions['16-mixed'].fallback['cpu']",
        "no such precision",
    ),
    (
        {"precisions": {**B.precisions, "16-mixed": _with(B.precisions["16-mixed"], instead={"cpu": "nope"})}},
        "rules.precisions['16-mixed'].instead['cpu']",
        "no such precision",
    ),
    ({"fork_strategy_for": {"ddp": "nope"}}, "rules.fork_strategy_for['ddp']", "no such strategy"),
    ({"spawn_strategy_for": {"nope": "ddp_spawn"}}, "rules.spawn_strategy_for", "no such strategy"),
    ({"script_strategy_for": {"ddp_spawn": "nope"}}, "rules.script_strategy_for['ddp_spawn']", "no such"),
    # A counterpart names a strategy of its family started where the original cannot be.
    (
        {"fork_strategy_for": {**B.fork_strategy_for, "ddp": "ddp_spawn"}},
        "rules.fork_strategy_for['ddp']",
        "which a notebook cannot run either",
    ),
    (
        {"spawn_strategy_for": {**B.spawn_strategy_for, "ddp_fork": "ddp_notebook"}},
        "rules.spawn_strategy_for['ddp_fork']",
        "forks too",
    ),
    (
        {"script_strategy_for": {**B.script_strategy_for, "ddp_spawn": "fsdp"}},
        "rules.script_strategy_for['ddp_spawn']",
        "a counterpart runs the same family",
    ),
    (
        {"backends": {**B.backends, "gloo": _with(GLOO, accelerators=frozenset({"cuda"}))}},
        "rules.accelerators['cpu'].default_backend",
        "backend 'gloo' does not reduce 'cpu' tensors",
    ),
    (
        {"accelerators": {**B.accelerators, "cpu": _with(B.accelerators["cpu"], default_backend="nope")}},
        "rules.accelerators['cpu'].default_backend",
        "no such backend",
    ),
    (
        {"clusters": {**B.clusters, "slurm": _with(B.clusters["slurm"], same_job_as=("nope",))}},
        "rules.clusters['slurm'].same_job_as",
        "no such cluster",
    ),
    (
        {"default_precision": "bf16-mixed"},
        "rules.default_precision",
        "a request's default precision is fixed ('32-true'",
    ),
]
"""Tables in place of the built-in ones, each naming what the set lacks or breaking a rule of the whole set: the
field the refusal names, and words of its reason."""


@pytest.mark.parametrize(("changes", "field", "words"), REFERENCE_CASES)
def test_every_reference_between_rows_is_checked_when_the_rule_set_is_built(
    changes: dict[str, Any], field: str, words: str
) -> None:
    """`Rules(...)` / `attrs.evolve(BUILTIN_RULES, ...)`: each row that names another names one the set has."""
    with pytest.raises(InvalidRequest) as caught:
        _with(BUILTIN_RULES, **changes)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_a_gloo_row_without_cpu_no_longer_plans_a_refusal_of_gloo_on_cpu() -> None:
    """The repro: the set used to be built, and then `process_group_backend='gloo'` on CPU was refused with the fix
    "Use process_group_backend='gloo'"; now the set is refused, and the built-in one plans gloo on CPU."""
    plan = resolve_uncached(Request(devices=2, strategy="ddp", process_group_backend="gloo"), Environment(), BUILTIN)
    assert plan.process_group_backend == "gloo"
    with pytest.raises(InvalidRequest, match="List 'cpu' in the backend's accelerators"):
        _with(BUILTIN_RULES, backends={**B.backends, "gloo": _with(GLOO, accelerators=frozenset({"cuda"}))})


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ({"families": [_with(DDP, why_not={**DDP.why_not, "cpu": "no"})]}, "rules.families['ddp'].why_not"),
        ({"precisions": [_with(FP32, why_not={"cpu": "no"})]}, "rules.precisions['32-true'].why_not"),
        ({"backends": [_with(GLOO, why_not={**GLOO.why_not, "cuda": "no"})]}, "rules.backends['gloo'].why_not"),
        (_plugin(backends=[_with(HCCL_ROW, why_not={NPU: "no"})]), "rules.backends['hccl'].why_not"),
    ],
)
def test_a_row_that_both_lists_an_accelerator_and_refuses_it_is_contradictory(rows: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest, match="which one holds") as caught:
        BUILTIN_RULES.extend(**rows)
    assert caught.value.field == field
    # The same rows giving reasons for accelerators they do not list are accepted (replacing gloo's is allowed).
    assert BUILTIN_RULES.extend(families=[_with(DDP, why_not={**DDP.why_not, "mps": "no"})]).families["ddp"] != DDP
    assert BUILTIN_RULES.extend(backends=[_with(GLOO, why_not={**GLOO.why_not, "mps": "no"})]).backends["gloo"] != GLOO


NPU2 = CustomName("npu2")


def test_a_downstream_accelerator_runs_over_a_replaced_builtin_backend_row() -> None:
    """The refusal says to list the accelerator in gloo's row; the built-in row can be replaced, and then two devices
    of the new accelerator resolve to a DDP world over gloo."""
    npu2 = _with(NPU_ROW, name=NPU2, device_type="npu2", default_backend="gloo", auto_priority=6)
    families = [_with(row, accelerators=row.accelerators | {NPU2}) for row in (DDP, SINGLE)]
    fp32 = _with(FP32, accelerators=FP32.accelerators | {NPU2})
    plugin: dict[str, Any] = {"accelerators": [npu2], "families": families, "precisions": [fp32]}
    with pytest.raises(InvalidRequest, match=r"List 'npu2' in the backend's accelerators.*BUILTIN_RULES\.backends"):
        BUILTIN_RULES.extend(**plugin)
    gloo = _with(GLOO, accelerators=GLOO.accelerators | {NPU2})
    rules = BUILTIN_RULES.extend(**plugin, backends=[gloo])
    assert rules.backends["gloo"] == gloo and BUILTIN_RULES.backends["gloo"] == GLOO  # the built-in set unchanged
    env = Environment().with_device_counts({NPU2: 2})
    plan = resolve_uncached(Request(accelerator=NPU2, devices=2, strategy="ddp"), env, rules)
    assert (plan.accelerator, plan.devices, plan.world_size) == (NPU2, (0, 1), 2)
    assert plan.process_group_backend == "gloo"
    assert resolve_uncached(Request(), env, rules).process_group_backend == "gloo"  # 'auto' picks it, as ddp
    with pytest.raises(InvalidRequest) as caught:
        BUILTIN_RULES.extend(**plugin, backends=[_with(gloo, needs_device_tensors=True)])
    assert caught.value.field == "rules.backends['gloo'].needs_device_tensors"


def _spelled(**changes: Any) -> FrameworkAccelerator:
    row = FrameworkAccelerator(
        accelerator=NPU,
        lightning="npu",
        lightning_devices="indices",
        accelerate_cpu=False,
        accelerate_gpu_ids=True,
        accelerate_processes=True,
    )
    return _with(row, **changes)


@pytest.mark.parametrize(
    ("rows", "field", "owner"),
    [
        (
            {"framework_accelerators": [_spelled(lightning="cuda")]},
            "rules.framework_accelerators['npu'].lightning",
            "'cuda'",
        ),
        (
            {"framework_accelerators": [_spelled(lightning="gpu")]},
            "rules.framework_accelerators['npu'].lightning",
            "'cuda' or 'mps'",
        ),
        (
            {"framework_accelerators": [_spelled(lightning="tpu")]},
            "rules.framework_accelerators['npu'].lightning",
            "'xla'",
        ),
        ({"kubernetes_resources": {NPU: "nvidia.com/gpu"}}, "rules.kubernetes_resources['npu']", "'cuda'"),
    ],
)
def test_a_downstream_accelerator_does_not_take_another_accelerators_spelling(
    rows: dict[str, Any], field: str, owner: str
) -> None:
    plugged = RULES.extend(framework_accelerators=[_spelled()], kubernetes_resources={NPU: "huawei.com/Ascend910"})
    assert plugged.framework_accelerators[NPU] == _spelled()  # the plugin's own spelling and resource are accepted
    with pytest.raises(InvalidRequest) as caught:
        RULES.extend(**rows)
    assert caught.value.field == field
    assert f"the resource of {owner}:" in str(caught.value) or f"Lightning spells {owner}:" in str(caught.value)


def test_a_resource_another_accelerator_holds_is_refused_with_where_to_read_the_right_one() -> None:
    with pytest.raises(InvalidRequest) as caught:
        RULES.extend(kubernetes_resources={NPU: "nvidia.com/gpu"})
    assert caught.value.fix == (
        "Write the resource 'npu''s device plugin advertises (what `kubectl describe node` lists under Allocatable)"
    )


def test_a_precision_no_family_lists_any_more_is_refused() -> None:
    """Replacing the families can orphan a downstream precision (the built-in set lists every precision)."""
    dropped = [
        _with(row, precisions=row.precisions - {INT8_QAT})
        for row in RULES.families.values()
        if INT8_QAT in row.precisions
    ]
    assert len(dropped) == 4
    with pytest.raises(InvalidRequest, match="no family lists the precision") as caught:
        RULES.extend(families=dropped)
    assert caught.value.field == "rules.precisions['int8-qat']"
    assert caught.value.fix == (
        "Keep 'int8-qat' in the precisions of the family rows it runs with (a replaced family row drops what it does "
        "not list)"
    )
    assert RULES.extend(families=dropped[:3]).families[dropped[2].family] == dropped[2]


def test_a_rule_set_repr_is_short_and_says_which() -> None:
    """help() and signatures show a default's repr: the reference and the sizes, not the ~40 KB of tables."""
    assert repr(BUILTIN_RULES) == (
        f"<Rules BUILTIN_RULES: {len(B.strategies)} strategies, {len(B.accelerators)} accelerators, "
        f"{len(B.precisions)} precisions>"
    )
    assert repr(RULES).startswith("<Rules tests.downstream_rules:RULES: 31 strategies, 5 accelerators, 9 precisions")
    assert repr(BUILTIN_RULES.extend(**_plugin())).startswith("<Rules unnamed: ")
    assert len(repr(RULES)) < 120


@pytest.mark.parametrize(("changes", "field", "words"), REFERENCE_CASES)
def test_every_problem_lists_the_refused_one_first_and_the_rest_without_failing(
    changes: dict[str, Any], field: str, words: str
) -> None:
    """What building raises is the first of `every_problem` (the same refusal), and listing the others reads no row
    the set lacks: every problem listed is an `InvalidRequest`."""
    with pytest.raises(InvalidRequest) as caught:
        _with(BUILTIN_RULES, **changes)
    listed = every_problem(BUILTIN_RULES, **changes)
    assert listed and (listed[0].field, str(listed[0])) == (caught.value.field, str(caught.value))
    assert all(isinstance(problem, InvalidRequest) for problem in listed)


def test_every_problem_lists_them_all_at_once() -> None:
    """A tool sees every problem of a rule set, where building it raises the first: two broken rows, two problems."""
    assert list(problems(BUILTIN_RULES)) == [] and list(problems(RULES)) == []
    assert every_problem(BUILTIN_RULES) == ()
    broken = {
        "strategies": {**B.strategies, "ddp": _with(B.strategies["ddp"], launcher="nolaunch")},
        "auto_for_options": {"deepspeed": "nope"},
    }
    listed = every_problem(BUILTIN_RULES, **broken)
    assert [problem.field for problem in listed] == [
        "rules.strategies['ddp'].launcher",
        "rules.auto_for_options['deepspeed']",
    ]
    # Rows that name what the set has, but break the whole: each said (the auto picks too), none read past.
    families = {
        **B.families,
        "ddp": _with(DDP, accelerators=frozenset({"cuda"})),
        "dp": _with(B.families["dp"], precisions=frozenset()),
    }
    fields = [problem.field for problem in every_problem(BUILTIN_RULES, families=families)]
    assert "rules.families['dp'].precisions" in fields and "rules.families['ddp'].accelerators" in fields
    with pytest.raises(InvalidRequest, match="no such table"):
        every_problem(BUILTIN_RULES, tables={})
    for name, value in (("clusters", 5), ("auto_strategies", list(B.auto_strategies)), ("families", [DDP])):
        with pytest.raises(InvalidRequest) as refused:
            every_problem(BUILTIN_RULES, **{name: value})
        with pytest.raises(InvalidRequest) as built:
            _with(BUILTIN_RULES, **{name: value})
        assert refused.value.field == built.value.field == f"rules.{name}"


class _Counted(str):
    """A row's name that counts how often it is hashed or compared: a check that compares every row with every
    other (a quadratic extension) counts the square of the rows, an indexed one a multiple of them."""

    operations = 0

    def __hash__(self) -> int:
        _Counted.operations += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _Counted.operations += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _Counted.operations += 1
        return str.__ne__(self, other)


def _extension_operations(rows: int) -> int:
    """How many times `extend` hashes or compares the names of `rows` new rows of each kind (accelerators, with the
    backend, family and precision rows that list them; precisions with their recipes; strategies; clusters)."""
    accelerators = [
        _with(
            NPU_ROW,
            name=CustomName(_Counted(f"npu{index}")),
            device_type=f"npu{index}",
            auto_priority=10 + index,
            default_backend="gloo",
        )
        for index in range(rows)
    ]
    names = frozenset(row.name for row in accelerators)
    precisions = [
        _with(
            QAT_ROW, name=CustomName(_Counted(f"qat{index}")), accelerators=frozenset({"cpu"}), why_not={}, instead={}
        )
        for index in range(rows)
    ]
    added = frozenset(row.name for row in precisions)
    recipes = [_with(QAT_RECIPE, name=row.name) for row in precisions]
    strategies = [
        StrategyRule(name=CustomName(_Counted(f"ddp_custom{index}")), family="ddp", launcher="subprocess")
        for index in range(rows)
    ]
    schema = JobVariables(label="Job", reason="a job was {how}")
    clusters = [
        ClusterRule(
            name=CustomName(_Counted(f"manager{index}")),
            description="a cluster manager",
            detect_variables=(frozenset({f"MANAGER{index}_JOB"}),),
            detect_priority=100 + index,
            creates_processes=True,
            node_rank_variable="node rank",
            schemas=(schema,),
        )
        for index in range(rows)
    ]
    families = [
        _with(row, accelerators=row.accelerators | names, precisions=row.precisions | added) for row in (DDP, SINGLE)
    ]
    _Counted.operations = 0
    extended = BUILTIN_RULES.extend(
        accelerators=accelerators,
        backends=[_with(GLOO, accelerators=GLOO.accelerators | names)],
        families=families,
        precisions=[_with(FP32, accelerators=FP32.accelerators | names), *precisions],
        precision_recipes=recipes,
        strategies=strategies,
        clusters=clusters,
    )
    assert len(extended.strategies) == len(B.strategies) + rows and len(extended.clusters) == len(B.clusters) + rows
    assert (
        len(extended.accelerators) == len(B.accelerators) + rows
        and len(extended.precisions) == len(B.precisions) + rows
    )
    return _Counted.operations


def test_extending_by_many_rows_takes_time_in_proportion() -> None:
    """`extend` indexes what it compares against once: twice the rows, about twice the work (a check of each new row
    against every other, as before, did four times the work; 100,000 rows took over 30 s)."""
    small, large = _extension_operations(300), _extension_operations(600)
    assert small > 300 * 4  # the names are read (the count counts)
    assert large < 2.5 * small, (small, large)
