"""Every option row's witness, derived from the rows alone: a request whose plan holds the option away from its
default, and the same request with it at its default (the baseline); and what each target makes of a plan.

The value comes from the row's check (a flag flipped, another allowed value, another number, another degree); the
other options it needs (`Needs`), and one other option's value where that is what makes it show (DeepSpeed's offload
device shows inside an offload block; `dp_shard` differs from its default 'auto' only beside another degree), are
found by trying each: the witness is the first request where every target that spells the option sees something
else than at the baseline. A target that drops an option leaves no witness, and the tests that read one fail.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import attrs

from trainplan import Environment, Plan, Request
from trainplan.mapping.frameworks import accelerate_arguments, deepspeed_config, lightning_arguments, option_keywords
from trainplan.mapping.workers import process_group_timeout
from trainplan.resolve import resolve
from trainplan.rules import (
    OPTION_TARGETS_OF,
    OPTION_TYPES,
    Carried,
    HandlerField,
    OneOf,
    OptionRow,
    OptionTarget,
    ParallelDegree,
    ProcessGroupTimeout,
    Refused,
    Rules,
    ThroughMesh,
    ThroughMeshGroups,
    ThroughPipeline,
    TrueOrFalse,
    WholeNumber,
    spellings,
)
from trainplan.spec.errors import Incompatible, TrainplanError
from trainplan.spec.options import StrategyOptions, with_options

CPU_WORLD = Environment(cpu_count=4)
"""Two CPU processes (as the 2-process test worlds are)."""

GPU_WORLD = Environment(cuda_device_count=2, cpu_count=4, packages=frozenset({"deepspeed"}))
"""Two GPUs, written by hand: the families that need CUDA (FSDP, DeepSpeed, context parallelism)."""

WORLDS: tuple[tuple[str, Environment], ...] = (("cpu", CPU_WORLD), ("cuda", GPU_WORLD))


def candidates(row: OptionRow) -> tuple[object, ...]:
    """Values the row's check takes other than its default, most telling first."""
    check = row.check
    if isinstance(check, TrueOrFalse):
        return (not row.default,)
    if isinstance(check, OneOf):
        return tuple(value for value in check.values if value != row.default)
    if isinstance(check, WholeNumber):
        return tuple(value for value in (77, check.minimum, check.maximum) if value != row.default)
    assert isinstance(check, ParallelDegree)
    return tuple(value for value in (2, 1, "auto") if value != row.default and (check.takes_auto or value != "auto"))


@attrs.frozen
class Witness:
    row: OptionRow
    value: object
    request: Request
    baseline: Request
    accelerator: str  # "cpu": the 2-process CPU world runs it; "cuda": a what-if of two GPUs
    env: Environment

    @property
    def name(self) -> str:
        return f"{self.row.family}.{self.row.name}"


def _record(rules: Rules, row: OptionRow, values: Mapping[str, object]) -> StrategyOptions:
    return with_options(OPTION_TYPES[row.family](), values, written=values)


def _base_strategy(rules: Rules, row: OptionRow) -> str:
    return next(name for name, rule in rules.strategies.items() if rule.family == row.family and not rule.preset)


def mapped(plan: Plan, target: OptionTarget, rules: Rules) -> object:
    """What `target` makes of the plan's options, as plain values (or the refusal, by rule and text)."""
    try:
        if target == "torch":
            keywords = option_keywords(plan, "torch", "torch", rules)
            return {**keywords, "mesh": plan.mesh, "timeout": process_group_timeout(plan, rules)}
        if target == "lightning":
            return {
                framework: lightning_arguments(plan, framework, rules).strategy.arguments
                for framework in ("trainer", "fabric")
            }
        if target == "accelerate":
            arguments = accelerate_arguments(plan, rules)
            return attrs.asdict(arguments, recurse=False)
        return deepspeed_config(plan, rules=rules)
    except Incompatible as refusal:
        return ("refused", refusal.rule, str(refusal))


def _reached(row: OptionRow) -> list[OptionTarget]:
    return [target for target in spellings(row) if target in OPTION_TARGETS_OF[row.family]]


def _companions(row: OptionRow, rows: tuple[OptionRow, ...]) -> Iterator[dict[str, object]]:
    """The other options' values to try beside the row's: none, what it needs, what carries it, then any one, then
    any two (an interleaved schedule's stages per rank need both pp above 1 and an interleaved schedule)."""
    needed = dict(row.needs.values) if row.needs is not None else {}
    yield needed
    carriers = {name for spelling in spellings(row).values() if isinstance(spelling, Carried) for name in spelling.by}
    others = [other for other in rows if other.name != row.name and other.name not in needed]
    others.sort(key=lambda other: other.name not in carriers)
    for other in others:
        for value in candidates(other):
            yield {**needed, other.name: value}
    for first, second in itertools.combinations(others, 2):
        for one, two in itertools.product(candidates(first), candidates(second)):
            yield {**needed, first.name: one, second.name: two}


def witness(row: OptionRow, rules: Rules) -> Witness | None:
    """The first request (CPU processes first) where every target that spells the option sees another plan than
    at its default; None when none does (a target drops it)."""
    rows = rules.options[row.family]
    family = rules.families[row.family]
    for (accelerator, env), value in itertools.product(WORLDS, candidates(row)):
        if accelerator not in family.accelerators:
            continue
        for companions in _companions(row, rows):
            strategy = _base_strategy(rules, row)
            request = Request(
                accelerator=accelerator,  # type: ignore[arg-type]
                devices=2,
                strategy=strategy,  # type: ignore[arg-type]
                strategy_options=_record(rules, row, {**companions, row.name: value}),
            )
            baseline = attrs.evolve(request, strategy_options=_record(rules, row, companions))
            try:
                plan, base = resolve(request, env, rules), resolve(baseline, env, rules)
            except TrainplanError:
                continue
            if all(_sees(row, mapped(plan, target, rules), mapped(base, target, rules)) for target in _reached(row)):
                return Witness(row, value, request, baseline, accelerator, env)
    return None


def _sees(row: OptionRow, seen: object, before: object) -> bool:
    """A target sees the option: it makes something else of the plan, or refuses it by name (an option that only
    means something beside another, a pipeline schedule's stages per rank, is refused there by its own name even
    where the baseline is refused for the other)."""
    named = isinstance(seen, tuple) and f"strategy_options.{row.name}=" in str(seen[2])
    return seen != before or named


def spelled_keys(row: OptionRow, target: OptionTarget, rows: tuple[OptionRow, ...]) -> tuple[str, ...]:
    """Where `target` holds the option: its keywords (Accelerate's as `Handler.field`), those of the options that
    carry it, the timeout for the process group's, `mesh` for a degree."""
    spelling = spellings(row)[target]
    if isinstance(spelling, tuple):
        return tuple(f"{part.handler}.{part.key}" if isinstance(part, HandlerField) else part.key for part in spelling)
    if isinstance(spelling, Carried):
        named = {other.name: other for other in rows}
        return tuple(key for name in spelling.by for key in spelled_keys(named[name], target, rows))
    if isinstance(spelling, ProcessGroupTimeout):  # Accelerate's InitProcessGroupKwargs; torch's joined group
        return ("InitProcessGroupKwargs.timeout",) if target == "accelerate" else ("timeout",)
    if isinstance(spelling, (ThroughMesh, ThroughMeshGroups, ThroughPipeline)):  # the pipeline record is the mesh's
        return ("mesh",)
    assert isinstance(spelling, Refused) or spelling is None
    return ()


__all__ = ["CPU_WORLD", "GPU_WORLD", "Witness", "candidates", "mapped", "spelled_keys", "witness"]
