"""The finite space enumerated, not sampled: strategy × accelerator × precision × the facts that decide
(an interactive session, fork offered, CUDA initialised), for the built-in and a downstream rule set; and every
cell of the generated matrix checked against what resolve does.

Each outcome is compared with what the rows say, read independently of the resolver's code path: a plan exactly
where every row involved allows it, with the precision the row's fallback names.
"""

from __future__ import annotations

import itertools

import pytest

from tests.downstream_rules import RULES as DOWNSTREAM_RULES
from trainplan import BUILTIN_RULES, Environment, Plan, Request, Rules, TrainplanError
from trainplan.render.matrix import render_matrix
from trainplan.resolve import resolve_uncached
from trainplan.spec.names import ACCELERATORS, AcceleratorKey, PrecisionKey, StrategyKey

RULE_SETS = pytest.mark.parametrize("rules", [BUILTIN_RULES, DOWNSTREAM_RULES], ids=["builtin", "downstream"])
FACTS = list(itertools.product([False, True], [False, True], [False, True]))  # interactive, fork offered, CUDA up


def machine(
    rules: Rules, *, interactive: bool = False, fork: bool = True, cuda_initialized: bool = False
) -> Environment:
    """Every accelerator of `rules` present (two devices each, one MPS), every package installed."""
    packages = {rule.requires_package for rule in rules.precisions.values() if rule.requires_package is not None}
    return Environment(
        cuda_device_count=2,
        cuda_initialized=cuda_initialized,
        mps_available=True,
        xla_device_count=2,
        cpu_count=4,
        interactive=interactive,
        start_methods=("fork", "spawn", "forkserver") if fork else ("spawn",),
        packages=frozenset({"deepspeed", "transformer_engine", "torch_xla", *packages}),
        device_counts={name: 2 for name in rules.accelerators if name not in ACCELERATORS},
    )


def request_for(strategy: StrategyKey, accelerator: AcceleratorKey, precision: PrecisionKey, rules: Rules) -> Request:
    family = rules.families[rules.strategies[strategy].family]
    one = family.max_devices_per_node == 1 or rules.accelerators[accelerator].device_counts == "one"
    return Request(accelerator=accelerator, strategy=strategy, precision=precision, devices=1 if one else 2)


def outcome(request: Request, env: Environment, rules: Rules) -> Plan | TrainplanError:
    try:
        return resolve_uncached(request, env, rules)
    except TrainplanError as error:
        return error


def expected_precision(
    strategy: StrategyKey,
    accelerator: AcceleratorKey,
    precision: PrecisionKey,
    rules: Rules,
    facts: tuple[bool, bool, bool],
) -> PrecisionKey | None:
    """What the rows say: the plan's precision, or None where some row refuses the cell."""
    interactive, fork, cuda_initialized = facts
    rule = rules.strategies[strategy]
    family = rules.families[rule.family]
    launcher = rules.launchers[rule.launcher]
    accelerator_rule = rules.accelerators[accelerator]
    effective = rules.precisions[precision].fallback.get(accelerator, precision)
    allowed = (
        accelerator in family.accelerators
        and accelerator in rules.precisions[effective].accelerators
        and effective in family.precisions
        and not (interactive and not launcher.interactive_compatible)
        and not (launcher.forks and not fork)
        and not (launcher.forks and accelerator_rule.fork_blocked_by is not None and cuda_initialized)
    )
    return effective if allowed else None


@RULE_SETS
@pytest.mark.parametrize("facts", FACTS, ids=lambda facts: "interactive={}-fork={}-cuda_up={}".format(*facts))
def test_every_cell_resolves_exactly_where_the_rows_allow_it(rules: Rules, facts: tuple[bool, bool, bool]) -> None:
    interactive, fork, cuda_initialized = facts
    env = machine(rules, interactive=interactive, fork=fork, cuda_initialized=cuda_initialized)
    wrong: list[str] = []
    for strategy, accelerator, precision in itertools.product(rules.strategies, rules.accelerators, rules.precisions):
        result = outcome(request_for(strategy, accelerator, precision, rules), env, rules)
        expected = expected_precision(strategy, accelerator, precision, rules, facts)
        got = result.precision if isinstance(result, Plan) else None
        if got != expected:
            wrong.append(f"{strategy} × {accelerator} × {precision}: rows say {expected}, resolve gave {result}")
    assert wrong == []


def _columns(rules: Rules) -> list[AcceleratorKey]:
    """The matrix's accelerator columns: trainplan's own, then the rule set's."""
    return [*ACCELERATORS, *(name for name in rules.accelerators if name not in ACCELERATORS)]


def _matrix_cells(rules: Rules) -> dict[tuple[str, str], str]:
    """(row name, accelerator) → the cell, for the strategy and precision tables of the rendered matrix."""
    columns = _columns(rules)
    cells: dict[tuple[str, str], str] = {}
    for line in render_matrix(rules).splitlines():
        parts = [part.strip() for part in line.strip("|").split("|")]
        if not parts or not parts[0].startswith("`"):
            continue
        name = parts[0].strip("`")
        marks = parts[3 : 3 + len(columns)] if name in rules.strategies else parts[1 : 1 + len(columns)]
        if name in rules.strategies or name in rules.precisions:
            for accelerator, mark in zip(columns, marks, strict=True):
                cells[(name, accelerator)] = mark
    return cells


@RULE_SETS
def test_every_matrix_cell_says_what_resolve_does(rules: Rules) -> None:
    cells = _matrix_cells(rules)
    env = machine(rules)
    columns = _columns(rules)
    assert len(cells) == (len(rules.strategies) + len(rules.precisions)) * len(columns)
    for strategy, accelerator in itertools.product(rules.strategies, columns):
        result = outcome(request_for(strategy, accelerator, "32-true", rules), env, rules)
        assert cells[(strategy, accelerator)] == ("✓" if isinstance(result, Plan) else "✗"), (strategy, accelerator)
    for precision, accelerator in itertools.product(rules.precisions, columns):
        result = outcome(Request(accelerator=accelerator, precision=precision, devices=1), env, rules)
        if not isinstance(result, Plan):
            mark = "✗"
        elif result.precision == precision:
            mark = "✓"
        else:
            mark = f"→ {result.precision}"
        assert cells[(precision, accelerator)] == mark, (precision, accelerator)


def test_the_downstream_matrix_shows_its_strategies_and_the_builtin_one_does_not() -> None:
    assert "`ddp_custom_checkpoint_io`" in render_matrix(DOWNSTREAM_RULES)
    assert "`ddp_custom_checkpoint_io`" not in render_matrix()
    assert "`int8-qat`" in render_matrix(DOWNSTREAM_RULES) and "`int8-qat`" not in render_matrix()


def test_the_matrix_says_every_mesh_rule_that_refuses() -> None:
    """The ep rule, the cp/sp exclusion, the pipeline schedules' rules and Accelerate's refusal of sp were rows the
    compatibility page never showed (its sp row named Accelerate's sp_size, which the adapter refuses)."""
    from trainplan.rules import EXPERT_REGION, MESH_EXCLUSIONS, PIPELINE_SCHEDULE_RULES

    text = render_matrix()
    assert "`ep` (expert-parallel) is borrowed from " + " × ".join(f"`{name}`" for name in EXPERT_REGION) in text
    for exclusion in MESH_EXCLUSIONS:
        assert f"`{exclusion.dimensions[0]}` and `{exclusion.dimensions[1]}` exclude each other" in text
    for name in PIPELINE_SCHEDULE_RULES:
        assert f"- pipeline schedule `{name}`: " in text
    assert "| `sp_size` (refused: see below) |" in text and "- sp above 1 under Accelerate: " in text
