"""Options are rows (`rules.options`): every option of every rule set reaches every framework its family runs on (the
torch wrapper, Lightning and Fabric, Accelerate, DeepSpeed's config), or that framework refuses it by name.

The options come from the rows and the records' fields, never from a list here; the witnesses (`tests.option_witnesses`)
are derived from each row's check. The same witnesses are built into the frameworks' own objects in a 2-process world
(`tests/processes/test_runtime_world.py`)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import trainplan as tp
from tests.downstream_rules import INIT_SYNC
from tests.downstream_rules import RULES as DOWNSTREAM
from tests.option_witnesses import mapped, spelled_keys, witness
from trainplan.mapping.workers import process_group_timeout
from trainplan.resolve import resolve
from trainplan.rules import (
    BUILTIN_OPTIONS,
    OPTION_TARGETS_OF,
    OPTION_TYPES,
    OptionRow,
    ProcessGroupTimeout,
    Refused,
    Rules,
    ThroughMesh,
    ThroughMeshGroups,
    option_checks,
    spellings,
)
from trainplan.spec.options import RECORD_FIELDS, option_fields

RULE_SETS: dict[str, Rules] = {"builtin": tp.BUILTIN_RULES, "downstream": DOWNSTREAM}
ROWS = [(name, row) for name, rules in RULE_SETS.items() for rows in rules.options.values() for row in rows]

HANDLERS = {
    "DistributedDataParallelKwargs": "ddp",
    "InitProcessGroupKwargs": "process_group",
    "FullyShardedDataParallelPlugin": "fsdp",
    "TorchContextParallelConfig": "context_parallel",
    "DeepSpeedPlugin": "deepspeed",
}
"""Which field of `AccelerateArguments` holds each Accelerate object's keywords."""


def _at(seen: Any, target: str, key: str) -> object:
    """The value `key` has in what a target made of a plan (a refusal holds none)."""
    if isinstance(seen, tuple):
        return seen
    if target == "lightning":
        return tuple(arguments.get(key) for arguments in seen.values())
    if target == "accelerate":
        handler, _, field = key.partition(".")
        return (seen[HANDLERS[handler]] or {}).get(field)
    for part in key.split("."):
        seen = seen.get(part) if isinstance(seen, dict) else None
    return seen


@pytest.mark.parametrize(("rules_name", "row"), ROWS, ids=[f"{name}-{row.family}.{row.name}" for name, row in ROWS])
def test_every_option_reaches_each_framework_of_its_family_or_is_refused_by_name(
    rules_name: str, row: OptionRow
) -> None:
    rules = RULE_SETS[rules_name]
    found = witness(row, rules)
    assert found is not None, f"no request shows {row.name} at every framework its family runs on: one drops it"
    plan, base = resolve(found.request, found.env, rules), resolve(found.baseline, found.env, rules)
    assert plan.strategy.options != base.strategy.options
    for target, spelling in spellings(row).items():
        if spelling is None:
            assert target not in OPTION_TARGETS_OF[row.family]
            continue
        seen, before = mapped(plan, target, rules), mapped(base, target, rules)
        if isinstance(spelling, Refused):
            assert isinstance(seen, tuple) and seen[1] == "option-framework", f"{target} takes {row.name}"
            assert f"{row.name}={found.value!r}" in seen[2] and spelling.reason in seen[2]
            at_default = not isinstance(before, tuple) or f"strategy_options.{row.name}=" not in before[2]
            assert at_default, "at its default, nothing is lost: not refused for it"
            continue
        if isinstance(spelling, ThroughMesh):
            assert plan.mesh is not None and base.mesh is not None
            if spelling.dimension == "ep":  # the expert mesh's degree: the dense mesh stays, the expert mesh moves
                assert plan.mesh.expert != base.mesh.expert and plan.mesh.sizes == base.mesh.sizes
            else:
                assert plan.mesh.sizes != base.mesh.sizes
            if isinstance(seen, tuple):  # the framework cannot hold that mesh: refused, naming the dimension
                assert seen[1] in ("lightning-mesh", "accelerate-mesh"), seen
            continue
        if isinstance(spelling, ThroughMeshGroups):  # how one dimension's groups run: the degrees stay
            assert plan.mesh is not None and base.mesh is not None
            assert plan.mesh != base.mesh and plan.mesh.sizes == base.mesh.sizes
            assert plan.mesh.size(spelling.dimension) > 1, "an option of a dimension's groups needs groups"
            continue
        if isinstance(spelling, ProcessGroupTimeout):
            assert process_group_timeout(plan, rules) == found.value != process_group_timeout(base, rules)
        keys = spelled_keys(row, target, rules.options[row.family])
        assert any(_at(seen, target, key) != _at(before, target, key) for key in keys), (target, keys, seen)


def test_the_witnesses_cover_every_field_of_every_record_and_every_added_row() -> None:
    """The rows are the options: one row per field of each record (its default the field's), no row for `extra`
    or `given`, and a downstream rule set's rows on top."""
    for family, record in OPTION_TYPES.items():
        rows = tp.BUILTIN_RULES.options[family]
        assert [row.name for row in rows if row.name in option_fields(record)] == [row.name for row in rows]
        assert sorted(row.name for row in rows) == sorted(option_fields(record))
        defaults = {field.name: field.default for field in attrs.fields(record)}
        assert all(row.default == defaults[row.name] for row in rows)
    assert not {row.name for row in BUILTIN_OPTIONS} & set(RECORD_FIELDS)
    assert len(ROWS) == 2 * len(BUILTIN_OPTIONS) + 2, "the downstream rule set adds bucket_cap_mb and init_sync"


@pytest.mark.parametrize("row", BUILTIN_OPTIONS, ids=lambda row: f"{row.family}.{row.name}")
def test_every_builtin_row_holds_together(row: OptionRow) -> None:
    option_checks.check_row(row, tp.BUILTIN_RULES.options, f"rules.options[{row.family!r}, {row.name!r}]")


@pytest.mark.parametrize("row", BUILTIN_OPTIONS, ids=lambda row: f"{row.family}.{row.name}")
def test_every_option_value_is_checked_by_its_row(row: OptionRow) -> None:
    """A value no row allows is refused naming the option (a string where a flag or a number goes)."""
    record: Any = OPTION_TYPES[row.family]
    with pytest.raises(tp.InvalidRequest) as caught:
        option_checks.strategy_options(record(**{row.name: "yes"}))
    assert caught.value.field == f"strategy_options.{row.name}"


def test_an_added_option_refused_by_one_framework_is_taken_by_the_others() -> None:
    """`init_sync` (the downstream rule set's) reaches torch's DDP and Lightning, and Accelerate refuses it by name
    where it is not at its default."""
    options = tp.DDPOptions(extra={INIT_SYNC.name: False})
    plan = resolve(tp.Request(accelerator="cpu", devices=2, strategy_options=options), tp.Environment(), DOWNSTREAM)
    assert mapped(plan, "torch", DOWNSTREAM)["init_sync"] is False  # type: ignore[index]
    assert isinstance(INIT_SYNC.accelerate, Refused)
    with pytest.raises(tp.Incompatible, match="Accelerate cannot express init_sync=False") as caught:
        tp.accelerator_arguments(plan)
    assert caught.value.rule == "option-framework"
