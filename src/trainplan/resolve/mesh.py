"""The device mesh of a `model_parallel` plan: the degrees asked for, made whole and checked against the rules.

In order: Lightning's spelling (`data_parallel_size`, `tensor_parallel_size`) is read as `dp_shard` and `tp`, with a
note; at most one degree is `"auto"`, and it takes what the others leave; the degrees multiply to the world size;
then the layout rules (`rules.mesh.layout_violations`: the expert degree, accelerators, backend, precisions). Every
refusal names the numbers and a layout that fits (`fitting_degrees`), in the spelling the request used.

A layout that runs but is slow (`rules.mesh.host_spans`: tensor or context groups across hosts, pipeline stages off
the node boundaries) is planned as written, with a warning note that gives the numbers (which groups span which
nodes, the ring links that cross hosts) and a layout that keeps them inside; a degree written 'auto' never takes
such a value: that is refused, as before, with the degrees that fit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import attrs

from trainplan.resolve.refusal import incompatible
from trainplan.rules import (
    DEFAULT_PRECISION,
    EXPERT_REGION,
    LIGHTNING_SIZES,
    MESH_BACKENDS,
    MESH_EXCLUSIONS,
    PIPELINE_SCHEDULE_RULES,
    RefusalId,
)
from trainplan.rules import MESH_DIMENSIONS as MESH_RULES
from trainplan.rules.mesh import (
    UNUSED_CONTEXT_PARALLEL,
    UNUSED_PIPELINE,
    MeshViolation,
    context_parallel_violations,
    expert_region,
    group_backend_choices,
    group_backend_violations,
    host_span,
    host_spans,
    layout_violations,
    pipeline_option_violations,
    pipeline_violation,
    planned_pipeline,
    strides,
)
from trainplan.spec.errors import Incompatible
from trainplan.spec.mesh import ContextParallelLayout, MeshLayout, PipelineLayout
from trainplan.spec.names import MESH_DIMENSIONS, AcceleratorKey, BackendKey, MeshDimension, PrecisionKey
from trainplan.spec.notes import Note
from trainplan.spec.options import Degree, ModelParallelOptions, backend_option

ABSORBING: MeshDimension = next(
    name for name in MESH_DIMENSIONS if attrs.fields_dict(ModelParallelOptions)[name].default == "auto"
)
"""The degree that takes what the others leave unless another is written 'auto' (dp_shard: FSDP over the rest)."""


@attrs.frozen(kw_only=True)
class MeshChoice:
    """The mesh a request's degrees make on a world: the layout, the options in force (whole degrees), why, and
    the notes (Lightning's spelling read as trainplan's)."""

    layout: MeshLayout
    options: ModelParallelOptions
    reason: str
    notes: tuple[Note, ...]


@attrs.frozen(kw_only=True)
class _World:
    """What every refusal of one request needs to name a layout that fits: the world, the accelerator, the
    precision, and how the request spelled each degree (Lightning's names or trainplan's)."""

    num_nodes: int
    processes_per_node: int
    accelerator: AcceleratorKey
    precision: PrecisionKey
    names: Mapping[MeshDimension, str]
    strategy: str  # the strategy asked for, which a refusal names when no degree was written

    @property
    def size(self) -> int:
        return self.num_nodes * self.processes_per_node

    def runs(self, name: MeshDimension) -> bool:
        """Whether a degree above 1 of `name` runs on this accelerator with this precision."""
        return _runs(name, self.accelerator, self.precision)

    def fitting(self, asked: Mapping[MeshDimension, Degree]) -> str:
        fit = fitting_degrees(
            asked,
            num_nodes=self.num_nodes,
            processes_per_node=self.processes_per_node,
            accelerator=self.accelerator,
            precision=self.precision,
        )
        if any(self.names[name] != name for name in MESH_DIMENSIONS):  # Lightning's spelling: both of its sizes
            return ", ".join(f"{self.names[size.dimension]}={fit[size.dimension]}" for size in LIGHTNING_SIZES)
        return ", ".join(f"{name}={degree}" for name, degree in fit.items() if degree != 1) or "dp_shard=1"

    def spelled(self, degrees: Mapping[MeshDimension, Degree], joiner: str = ", ") -> str:
        return joiner.join(f"{self.names[name]}={degree}" for name, degree in degrees.items() if degree != 1)

    def refuse(self, rule: RefusalId, values: Mapping[str, object], fitting: str, **fields: object) -> Incompatible:
        """A refusal naming this world's layout, and `fitting`: one that keeps the rules."""
        layout = f"{self.num_nodes} node(s) × {self.processes_per_node} processes"
        values = dict(values) or {"strategy": self.strategy}
        return incompatible(rule, values, world_size=self.size, layout=layout, fitting=fitting, **fields)


def mesh_or_refusals(
    options: ModelParallelOptions,
    *,
    num_nodes: int,
    processes_per_node: int,
    accelerator: AcceleratorKey,
    backend: BackendKey | None,
    precision: PrecisionKey,
    strategy: str,
) -> MeshChoice | tuple[Incompatible, ...]:
    """The mesh for `options` (of the strategy named `strategy`), or every refusal of it: one while the degrees do not
    yet make a layout (a group too big for a node, two 'auto's, a product that is not the world size), then every
    layout rule the degrees break (each naming a layout that fits), for `check` to list them all."""
    try:
        return _choose_mesh(
            options,
            num_nodes=num_nodes,
            processes_per_node=processes_per_node,
            accelerator=accelerator,
            backend=backend,
            precision=precision,
            strategy=strategy,
        )
    except Incompatible as refusal:
        return (refusal,)


def _choose_mesh(
    options: ModelParallelOptions,
    *,
    num_nodes: int,
    processes_per_node: int,
    accelerator: AcceleratorKey,
    backend: BackendKey | None,
    precision: PrecisionKey,
    strategy: str,
) -> MeshChoice | tuple[Incompatible, ...]:
    lightning = _lightning_sizes(options)
    names: dict[MeshDimension, str] = {name: name for name in MESH_DIMENSIONS}
    if lightning is not None:
        names.update({size.dimension: size.argument for size in LIGHTNING_SIZES})
    world = _World(
        num_nodes=num_nodes,
        processes_per_node=processes_per_node,
        accelerator=accelerator,
        precision=precision,
        names=names,
        strategy=strategy,
    )
    options, notes = _torchtitan_autos(options)
    asked = _asked(options, lightning, world)
    autos = [name for name in MESH_DIMENSIONS if asked[name] == "auto"]
    degrees = _whole_degrees(asked, autos, world, backend)
    refusals = tuple(
        _refusal(violation, asked, degrees, world, backend)
        for violation in layout_violations(
            degrees,
            num_nodes=num_nodes,
            processes_per_node=processes_per_node,
            accelerator=accelerator,
            backend=backend,
            precision=precision,
            ep=options.ep,
        )
    )
    if refusals:
        return refusals
    refusals, warnings = _host_notes(asked, degrees, autos, world)
    if refusals:
        return refusals
    notes += warnings
    reason = _reason(asked, degrees, autos, world)
    if lightning is not None:
        reason, lightning_notes = _lightning_reading(lightning, degrees, world)
        notes += lightning_notes
    if options.ep > 1:
        region = expert_region(degrees)
        reason += (
            f"; ep={options.ep} splits the experts over {options.ep} of the {region} ranks of "
            f"{' × '.join(EXPERT_REGION)} (efsdp={region // options.ep})"
        )
    refusals = _group_backend_refusals(options, degrees, accelerator, backend)
    return refusals or _mesh_choice(options, degrees, reason, notes)


def _mesh_choice(
    options: ModelParallelOptions, degrees: dict[MeshDimension, int], reason: str, notes: tuple[Note, ...]
) -> MeshChoice:
    """The layout of whole degrees, with its pipeline and group backends, and the options in force (the degrees
    whole, Lightning's sizes read as them)."""
    pipeline = _pipeline(options, degrees["pp"])
    context = _context_parallel(options, degrees["cp"])
    changes: dict[str, Any] = {size.argument: None for size in LIGHTNING_SIZES}
    changes.update((name, degree) for name, degree in degrees.items())
    resolved = attrs.evolve(options, **changes)
    layout = MeshLayout(
        shape=tuple(degrees.values()),
        ep=options.ep,
        pipeline=pipeline,
        context_parallel=context,
        backends=options.backends,
    )
    return MeshChoice(layout=layout, options=resolved, reason=reason, notes=notes)


def _context_parallel(options: ModelParallelOptions, cp: int) -> ContextParallelLayout:
    """The context-parallel record; an option of it away from torch's default is refused where cp is 1."""
    layout = ContextParallelLayout(rotate_method=options.cp_rotate_method, load_balancer=options.cp_load_balancer)
    for _, option in context_parallel_violations(cp, layout):
        raise _unused(options, option, "cp", cp, UNUSED_CONTEXT_PARALLEL)
    return layout


def _unused(
    options: ModelParallelOptions, option: str, dimension: MeshDimension, degree: int, why: str
) -> Incompatible:
    """The refusal of an option about `dimension`'s groups where its degree leaves none (rule mesh-option-unused)."""
    value = getattr(options, option)
    return incompatible(
        "mesh-option-unused",
        {f"strategy_options.{option}": value, dimension: degree},
        option=option,
        value=value,
        title=MESH_RULES[dimension].title,
        dimension=dimension,
        degree=degree,
        why=why,
    )


def _pipeline(options: ModelParallelOptions, pp: int) -> PipelineLayout:
    """The pipeline record, its microbatches made whole (one per stage unless written), checked against the
    schedule's row (`rules.PIPELINE_SCHEDULE_RULES`); a pipeline option written where pp is 1 is refused."""
    for option in pipeline_option_violations(
        pp, options.pp_schedule, options.pp_virtual_stages, options.pp_microbatches
    ):
        raise _unused(options, option, "pp", pp, UNUSED_PIPELINE)
    row = PIPELINE_SCHEDULE_RULES[options.pp_schedule]
    planned = planned_pipeline(options.pp_schedule, pp, options.pp_virtual_stages, options.pp_microbatches)
    virtual, microbatches = planned.virtual_stages, planned.microbatches
    broken = pipeline_violation(options.pp_schedule, pp, virtual, microbatches)
    if broken is not None:
        rule, why = broken
        least, _ = row.virtual_stages
        # A schedule these numbers fit, else one that takes this many stages per rank (its microbatches then said
        # by its own refusal), else this one (pp_virtual_stages=77 with 77 microbatches fits no schedule).
        other = next(
            (
                name
                for name, candidate in PIPELINE_SCHEDULE_RULES.items()
                if pipeline_violation(name, pp, virtual, microbatches) is None or candidate.virtual_stages[0] == virtual
            ),
            next(
                (
                    name
                    for name, candidate in PIPELINE_SCHEDULE_RULES.items()
                    if candidate.virtual_stages[0] <= virtual
                    and (candidate.virtual_stages[1] is None or virtual <= candidate.virtual_stages[1])
                ),
                options.pp_schedule,
            ),
        )
        rounds = max(1, microbatches // pp)
        fit = pp * virtual if row.microbatches == "at_least_stages" else microbatches - microbatches % rounds or pp
        raise incompatible(
            rule,
            {
                "strategy_options.pp_schedule": options.pp_schedule,
                "strategy_options.pp_virtual_stages": virtual,
                "strategy_options.pp_microbatches": microbatches,
            },
            schedule=options.pp_schedule,
            virtual_stages=virtual,
            microbatches=microbatches,
            stages=pp * virtual,
            pp=pp,
            why=why,
            fit_virtual=least,
            other=other,
            fit_microbatches=fit,
        )
    return planned


def _group_backend_refusals(
    options: ModelParallelOptions,
    degrees: Mapping[MeshDimension, int],
    accelerator: AcceleratorKey,
    backend: BackendKey | None,
) -> tuple[Incompatible, ...]:
    """Each dimension's backend that cannot be (`rules.mesh.group_backend_violations`): a degree of 1 has no
    groups; a backend must run on the accelerator."""
    refusals: list[Incompatible] = []
    for rule, name, why in group_backend_violations(degrees, options.backends, accelerator=accelerator):
        option, asked = backend_option(name), options.backends[name]
        values: dict[str, object] = {f"strategy_options.{option}": asked, name: degrees[name]}
        if rule == "mesh-option-unused":
            fields: dict[str, object] = {"title": MESH_RULES[name].title, "degree": degrees[name], "value": asked}
            refusals.append(incompatible(rule, values, option=option, dimension=name, why=why, **fields))
        else:
            choices = " or ".join(repr(choice) for choice in group_backend_choices(accelerator))
            world = backend if backend is not None else MESH_BACKENDS.get(accelerator)
            values["accelerator"] = accelerator
            refusals.append(
                incompatible(rule, values, option=option, backend=asked, why=why, choices=choices, world=world)
            )
    return tuple(refusals)


def _torchtitan_autos(options: ModelParallelOptions) -> tuple[ModelParallelOptions, tuple[Note, ...]]:
    """A degree written -1 where its row reads -1 as 'auto' (torchtitan's `dp_shard=-1`), as 'auto', with a note."""
    minus_ones = [
        name for name in MESH_DIMENSIONS if MESH_RULES[name].minus_one_is_auto and options.degrees[name] == -1
    ]
    if not minus_ones:
        return options, ()
    notes = tuple(
        Note(
            code="torchtitan-auto",
            level="info",
            message=f"{name}=-1 is torchtitan's spelling of {name}='auto': it takes what the other degrees leave",
        )
        for name in minus_ones
    )
    changes: dict[str, Any] = {name: "auto" for name in minus_ones}
    return attrs.evolve(options, **changes), notes


def _whole_degrees(
    asked: Mapping[MeshDimension, Degree], autos: list[MeshDimension], world: _World, backend: BackendKey | None
) -> dict[MeshDimension, int]:
    """Every degree a number, the one 'auto' taking what the others leave; refused while the degrees make no layout
    (a group too big for a node, a product that does not divide or make the world size)."""
    fixed = {name: degree for name, degree in asked.items() if isinstance(degree, int)}
    shown = {world.names[name]: degree for name, degree in fixed.items() if degree != 1}
    product = math.prod(fixed.values())
    if autos and world.size % product:
        raise world.refuse(
            "mesh-remainder",
            shown,
            world.fitting(asked),
            auto=world.names[autos[0]],
            product=product,
            spelled=world.spelled(fixed, " × ") or "every degree 1",
        )
    if not autos and product != world.size:
        spelled = world.spelled(fixed, " × ") or "every degree 1"
        raise world.refuse("mesh-product", shown, world.fitting(asked), product=product, spelled=spelled)
    return {name: (world.size // product if name in autos else fixed[name]) for name in MESH_DIMENSIONS}


def fitting_degrees(
    asked: Mapping[MeshDimension, Degree],
    *,
    num_nodes: int,
    processes_per_node: int,
    accelerator: AcceleratorKey,
    precision: PrecisionKey,
) -> dict[MeshDimension, int]:
    """A layout that keeps every mesh rule on this world, as close to `asked` as the rules allow.

    Each degree is the largest that fits and is not above what was asked ('auto' asks for as little as possible):
    the dimensions that stay inside a node first, innermost first (`tp`, then `cp`), then the stage-aligned one
    (`pp`), then the others; `dp_shard` takes the rest. The backend is not a matter of layout and is not looked at.
    """
    world = num_nodes * processes_per_node
    wanted = {name: (degree if isinstance(degree, int) and degree > 1 else 1) for name, degree in asked.items()}
    chosen: dict[MeshDimension, int] = {name: 1 for name in MESH_DIMENSIONS}

    def runs(name: MeshDimension) -> bool:
        return _runs(name, accelerator, precision)

    def largest(name: MeshDimension, candidates: list[int]) -> int:
        return max(d for d in candidates if d <= wanted.get(name, 1))

    def excluded(name: MeshDimension) -> bool:  # a dimension another one already chosen above 1 excludes
        return any(
            name in rule.dimensions and any(chosen[other] > 1 for other in rule.dimensions if other != name)
            for rule in MESH_EXCLUSIONS
        )

    inner = 1
    for name in reversed(MESH_DIMENSIONS):
        if MESH_RULES[name].inside_node and runs(name) and not excluded(name):
            chosen[name] = largest(name, _divisors(processes_per_node // inner))
            inner *= chosen[name]
    left = world // inner
    for name in MESH_DIMENSIONS:
        if MESH_RULES[name].stage_aligned and runs(name):
            chosen[name] = largest(name, [d for d in _divisors(left) if _aligned(world // d, processes_per_node)])
            left //= chosen[name]
    for name in MESH_DIMENSIONS:
        rule = MESH_RULES[name]
        if not (rule.inside_node or rule.stage_aligned or name == ABSORBING) and runs(name):
            chosen[name] = largest(name, _divisors(left))
            left //= chosen[name]
    chosen[ABSORBING] = left
    return chosen


# --------------------------------------------------------------------------------------------------


def _lightning_sizes(options: ModelParallelOptions) -> dict[str, Degree] | None:
    """Lightning's sizes as the request gives them (one left out is 'auto', as in Lightning), or None."""
    given = {size.argument: getattr(options, size.argument) for size in LIGHTNING_SIZES}
    if all(value is None for value in given.values()):
        return None
    return {argument: ("auto" if value is None else value) for argument, value in given.items()}


def _asked(
    options: ModelParallelOptions, lightning: dict[str, Degree] | None, world: _World
) -> dict[MeshDimension, Degree]:
    """The degrees asked for, with at most one 'auto'."""
    if lightning is not None:
        written = [name for name in MESH_DIMENSIONS if name in options.given]
        if written:
            sizes = ", ".join(f"{argument}={value!r}" for argument, value in lightning.items())
            lightning_given = {
                f"strategy_options.{size.argument}": getattr(options, size.argument)
                for size in LIGHTNING_SIZES
                if getattr(options, size.argument) is not None
            }
            raise incompatible(
                "mesh-spellings",
                {**{f"strategy_options.{name}": options.degrees[name] for name in written}, **lightning_given},
                lightning=sizes,
                degrees=", ".join(f"{name}={options.degrees[name]!r}" for name in written),
                suggestion=f"ModelParallelOptions({sizes}), or trainplan's degrees alone "
                f"({', '.join(MESH_DIMENSIONS)})",
            )
        degrees: dict[MeshDimension, Degree] = {name: 1 for name in MESH_DIMENSIONS}
        everything_auto = all(value == "auto" for value in lightning.values())
        for size in LIGHTNING_SIZES:
            value = lightning[size.argument]
            if everything_auto:  # Lightning's own defaults: data parallel over the nodes, tensor within each
                value = world.num_nodes if size.auto == "num_nodes" else world.processes_per_node
            degrees[size.dimension] = value
        return degrees
    degrees = dict(options.degrees)
    written_autos = [name for name in MESH_DIMENSIONS if degrees[name] == "auto" and name in options.given]
    if len(written_autos) > 1:
        raise world.refuse(
            "mesh-autos",
            {f"strategy_options.{name}": "auto" for name in written_autos},
            world.fitting(degrees),
            names=" and ".join(written_autos) + (" both" if len(written_autos) == 2 else " all"),
        )
    if written_autos:  # a degree written 'auto' takes the rest; the one left at its default 'auto' takes nothing
        degrees = {
            name: (1 if degree == "auto" and name not in written_autos else degree) for name, degree in degrees.items()
        }
    return degrees


def _refusal(
    violation: MeshViolation,
    asked: Mapping[MeshDimension, Degree],
    degrees: Mapping[MeshDimension, int],
    world: _World,
    backend: BackendKey | None,
) -> Incompatible:
    name = violation.dimension
    if violation.rule == "mesh-expert":
        region = violation.needed
        offered = [d for d in _nearest(_divisors(region), violation.degree) if d > 1][:3] or [1]
        return incompatible(
            violation.rule,
            {"strategy_options.ep": violation.degree},
            ep=violation.degree,
            region=region,
            region_names=" · ".join(EXPERT_REGION),
            region_spelled=" × ".join(f"{other}={degrees[other]}" for other in EXPERT_REGION),
            choices=_choices("ep", offered).removeprefix("ep="),
        )
    if name is None:  # mesh-backend: the only rule about the whole mesh once the product is right
        allowed = MESH_BACKENDS[world.accelerator]
        return incompatible(
            violation.rule,
            {"process_group_backend": backend, "accelerator": world.accelerator},
            allowed=allowed,
            backend=backend,
        )
    rule = MESH_RULES[name]
    spelled = world.names[name]
    # What was asked for this dimension: a degree written 'auto' is named as written, with the number it took.
    auto = asked[name] == "auto"
    values: dict[str, object] = {spelled: "auto" if auto else violation.degree}
    took = (
        f"{spelled}='auto' takes what the other degrees leave, {violation.degree} of the world of {world.size}, and "
        if auto
        else ""
    )
    named = {"took": took, "dimension": spelled, "degree": violation.degree}
    if violation.rule == "mesh-exclusive":
        return _exclusive(violation, name, asked, degrees, world, values, named)
    if violation.rule == "mesh-inside-node":
        return _inside_node(violation, name, asked, degrees, world, values, took)
    if violation.rule == "mesh-pipeline-nodes":
        grouped = math.prod(degrees[other] for other in MESH_DIMENSIONS if MESH_RULES[other].inside_node)
        candidates = [
            d for d in _divisors(world.size // grouped) if _aligned(world.size // d, world.processes_per_node)
        ]
        choices, fitting = _offered(violation, name, asked, world, candidates)
        nodes = {"num_nodes": world.num_nodes, "processes_per_node": world.processes_per_node}
        return world.refuse(violation.rule, values, fitting, **named, stage=violation.needed, **nodes, choices=choices)
    if violation.rule == "mesh-accelerator":
        supported = " or ".join(repr(item) for item in sorted(rule.accelerators))
        values["accelerator"] = world.accelerator
        fitting = world.fitting(asked)
        return world.refuse(violation.rule, values, fitting, **named, why=violation.detail, supported=supported)
    instead = rule.instead.get(world.precision, DEFAULT_PRECISION)
    values["precision"] = world.precision
    return incompatible(violation.rule, values, **named, why=violation.detail, instead=instead)


def _host_notes(
    asked: Mapping[MeshDimension, Degree],
    degrees: Mapping[MeshDimension, int],
    autos: list[MeshDimension],
    world: _World,
) -> tuple[tuple[Incompatible, ...], tuple[Note, ...]]:
    """The refusals and the warnings of a layout that runs slowly (`rules.mesh.host_spans`): refused where a degree
    written 'auto' took the value that makes it slow ('auto' never chooses such a layout, it names the degrees that
    fit), a warning with the numbers where the degree was written as a number."""
    spans = tuple(host_spans(degrees, num_nodes=world.num_nodes, processes_per_node=world.processes_per_node))
    refusals = tuple(_refusal(span, asked, degrees, world, None) for span in spans if span.dimension in autos)
    return refusals, () if refusals else tuple(_host_note(span, asked, degrees, world) for span in spans)


def _host_note(
    violation: MeshViolation, asked: Mapping[MeshDimension, Degree], degrees: Mapping[MeshDimension, int], world: _World
) -> Note:
    """The warning for a layout that runs slowly (`rules.mesh.host_spans`): which groups (or stages) span which
    nodes, the ring links that cross hosts, what travels over them (the row's `across_hosts`), and the layout that
    keeps them inside, as the refusal of the same degree taken by 'auto' would offer it."""
    name = violation.dimension
    assert name is not None  # host_spans names the dimension of every span
    rule = MESH_RULES[name]
    span = host_span(MeshLayout(shape=tuple(degrees.values())), name, processes_per_node=world.processes_per_node)
    layout = f"{world.num_nodes} node(s) × {world.processes_per_node} processes"
    first, last = span.example[0], span.example[-1]
    contiguous = span.example == tuple(range(first, last + 1))
    ranks = f"ranks {first}-{last}" if contiguous else "ranks " + ", ".join(map(str, span.example[:4]))
    ranks += ", ..." if len(span.example) > 4 and not contiguous else ""
    nodes = " and ".join(map(str, span.example_nodes))
    refusal = _refusal(violation, asked, degrees, world, None)
    degree = violation.degree
    traffic = rule.across_hosts.format(
        degree=degree, crossing=span.crossing, passes=degree - 1, all_reduce=f"{2 * (degree - 1) / degree:g}"
    )
    if violation.rule == "mesh-pipeline-nodes":
        what = f"stages of {violation.needed} processes: {span.spanning} of {span.groups} stages straddle a node"
        where = f" boundary (stage {span.example[0] // violation.needed}: {ranks} on nodes {nodes})"
        keep = "stages on node boundaries"
    else:
        what = (
            f"{span.spanning} of {span.groups} {rule.title} groups span hosts (up to {span.most_nodes} nodes each; "
            f"{ranks} on nodes {nodes}, {span.crossing} of its {span.links} ring links crossing hosts)"
        )
        where = ""
        keep = f"{rule.title} groups inside a node"
    message = (
        f"{world.names[name]}={violation.degree} on {layout} makes {what}{where}: {traffic}. Planned as "
        f"written, as torchtitan, Accelerate and torch's init_device_mesh lay it out ('auto' never takes it); to keep "
        f"{keep}: {str(refusal.fix).removeprefix('Use ')}"
    )
    return Note(code=f"{violation.rule}-slow", level="warning", message=message)


def _exclusive(
    violation: MeshViolation,
    name: MeshDimension,
    asked: Mapping[MeshDimension, Degree],
    degrees: Mapping[MeshDimension, int],
    world: _World,
    values: dict[str, object],
    named: Mapping[str, object],
) -> Incompatible:
    """`mesh-exclusive`: the dimension the exclusion's row names first (`rules.MESH_EXCLUSIONS`) is named beside it."""
    other = next(exclusion.dimensions[0] for exclusion in MESH_EXCLUSIONS if exclusion.dimensions[1] == name)
    values[world.names[other]] = degrees[other]
    fields = {"other": world.names[other], "other_degree": degrees[other], "why": violation.detail}
    return world.refuse(violation.rule, values, world.fitting({**asked, name: 1}), **named, **fields)


def _inside_node(
    violation: MeshViolation,
    name: MeshDimension,
    asked: Mapping[MeshDimension, Degree],
    degrees: Mapping[MeshDimension, int],
    world: _World,
    values: Mapping[str, object],
    took: str,
) -> Incompatible:
    """`mesh-inside-node`: the group (with the groups inside it) and the degrees that fit in a node."""
    inner = [other for other in MESH_DIMENSIONS[MESH_DIMENSIONS.index(name) + 1 :] if degrees[other] > 1]
    around = " and ".join(MESH_RULES[other].title for other in inner)
    why = f"'auto' keeps {MESH_RULES[name].title} groups inside a node" + (
        f", around the {around} groups" if inner else ""
    )
    apart = strides(degrees)[name]
    room = world.processes_per_node // apart if world.processes_per_node % apart == 0 else 1
    choices, fitting = _offered(violation, name, asked, world, _divisors(room))
    return world.refuse(
        violation.rule,
        values,
        fitting,
        took=took,
        what=world.spelled({other: degrees[other] for other in (name, *inner)}, " × "),
        needed=violation.needed,
        why=why,
        shortfall=(
            f"this node has {world.processes_per_node}"
            if violation.needed > world.processes_per_node
            else f"this node's {world.processes_per_node} do not split into groups of {violation.needed}"
        ),
        choices=choices,
    )


def _offered(
    violation: MeshViolation,
    name: MeshDimension,
    asked: Mapping[MeshDimension, Degree],
    world: _World,
    candidates: list[int],
) -> tuple[str, str]:
    """The degrees to offer instead (only those the accelerator and precision rules let run above 1), and an example
    layout that keeps the first of them."""
    runnable = [d for d in _nearest(candidates, violation.degree) if d == 1 or world.runs(name)]
    # A degree written 'auto' elsewhere takes what the offered degree leaves: offer only degrees that, written
    # alone, still keep this rule once that 'auto' has grown (cp=2 beside tp='auto' makes tp=2 too).
    runnable = [d for d in runnable if d == 1 or _keeps(violation.rule, name, {**asked, name: d}, world)]
    choices = [d for d in runnable if d > 1][:3] or [1]
    return _choices(world.names[name], choices), world.fitting({**asked, name: choices[0]})


def _keeps(rule: RefusalId, name: MeshDimension, asked: Mapping[MeshDimension, Degree], world: _World) -> bool:
    """Whether `asked`, its one 'auto' (if any) taking what the others leave, keeps `rule` for `name`."""
    fixed = [degree for degree in asked.values() if isinstance(degree, int)]
    product = math.prod(fixed)
    autos = [other for other, degree in asked.items() if degree == "auto"]
    if world.size % product or (not autos and product != world.size):
        return True  # another rule (the product) speaks first; this offer is about `name`'s own rule
    degrees = {other: (world.size // product if other in autos else int(degree)) for other, degree in asked.items()}
    violations = itertools.chain(
        layout_violations(
            degrees,
            num_nodes=world.num_nodes,
            processes_per_node=world.processes_per_node,
            accelerator=world.accelerator,
            backend=None,
            precision=world.precision,
        ),
        host_spans(degrees, num_nodes=world.num_nodes, processes_per_node=world.processes_per_node),
    )
    return not any(violation.rule == rule and violation.dimension == name for violation in violations)


def _reason(
    asked: Mapping[MeshDimension, Degree],
    degrees: Mapping[MeshDimension, int],
    autos: list[MeshDimension],
    world: _World,
) -> str:
    written = world.spelled({name: degree for name, degree in asked.items() if degree != "auto"})
    if not autos:
        return f"asked for {written}"
    name = autos[0]
    if not written:
        return f"{name}='auto' took the whole world of {world.size} (no other degree asked for)"
    return f"asked for {written}; {name}='auto' took the {degrees[name]} left of the world of {world.size}"


def _lightning_reading(
    lightning: Mapping[str, Degree], degrees: Mapping[MeshDimension, int], world: _World
) -> tuple[str, tuple[Note, ...]]:
    sizes = ", ".join(f"{argument}={value!r}" for argument, value in lightning.items())
    mapped = ", ".join(f"{size.dimension}={degrees[size.dimension]}" for size in LIGHTNING_SIZES)
    how = ""
    if all(value == "auto" for value in lightning.values()):
        how = (
            f" ('auto' as Lightning decides it: data parallel over the {world.num_nodes} node(s), tensor parallel over "
            f"the {world.processes_per_node} process(es) of each)"
        )
    mesh_names = " and ".join(size.mesh_name for size in LIGHTNING_SIZES)
    note = Note(
        code="lightning-sizes",
        level="info",
        message=(
            f"{sizes} are Lightning's ModelParallelStrategy sizes: here {mapped}{how}; Lightning names these mesh "
            f"dimensions {mesh_names}"
        ),
    )
    return f"Lightning's {sizes}: {mapped}{how}", (note,)


def _nearest(candidates: list[int], asked: int) -> list[int]:
    """The other candidates, nearest to what was asked first (the larger of two as near)."""
    return sorted((d for d in candidates if d != asked), key=lambda d: (abs(d - asked), -d))


def _choices(name: str, offered: list[int]) -> str:
    """`tp=4 or 2`: the degrees offered, in the order given."""
    if len(offered) == 1:
        return f"{name}={offered[0]}"
    return f"{name}={', '.join(map(str, offered[:-1]))} or {offered[-1]}"


def _runs(name: MeshDimension, accelerator: AcceleratorKey, precision: PrecisionKey) -> bool:
    """Whether a degree above 1 of `name` runs on `accelerator` with `precision` (the mesh-accelerator and
    mesh-precision rules)."""
    rule = MESH_RULES[name]
    return accelerator in rule.accelerators and precision not in rule.precisions_refused


def _aligned(block: int, processes_per_node: int) -> bool:
    """A block of ranks holds whole nodes, or fits whole into one."""
    return block % processes_per_node == 0 or processes_per_node % block == 0


def _divisors(number: int) -> list[int]:
    """The divisors of `number`, ascending."""
    small: list[int] = []
    large: list[int] = []
    candidate = 1
    while candidate * candidate <= number:
        if number % candidate == 0:
            small.append(candidate)
            if candidate * candidate != number:
                large.append(number // candidate)
        candidate += 1
    return small + large[::-1]


__all__ = ["ABSORBING", "MeshChoice", "fitting_degrees", "mesh_or_refusals"]
