"""The memory arithmetic: each candidate layout's bytes per device by category, from a model's facts and the rows of
`rules.memory`, and the choice of the most preferred one that fits. Pure: facts in, a `MemoryPlan` (or a refusal
that shows the arithmetic) out."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Final, overload

import attrs

from trainplan.rules import Rules
from trainplan.rules.memory import (
    ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN,
    BYTES_PER_PARAMETER,
    WHAT_IF_PRECISION,
    WHAT_IF_VOCABULARY,
    MemoryLayout,
    Placement,
)
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.memory import GIB, MemoryEstimate, MemoryPlan, MemoryPolicy, ModelFacts
from trainplan.spec.names import AcceleratorKey, PrecisionKey
from trainplan.spec.numbers import foreign_integer
from trainplan.spec.sizes import compared, size

MAX_WORLD_SEARCHED = 1 << 16
"""How far a refusal looks for the number of devices that would fit (a model past it names no count)."""


@attrs.frozen(kw_only=True)
class Hardware:
    """What a layout is fitted to: the world's shape, the memory of a device and of a node, what is installed."""

    num_nodes: int
    processes_per_node: int
    device_bytes: int
    host_bytes: int | None
    accelerator: AcceleratorKey
    precision: PrecisionKey
    packages: frozenset[str]

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.processes_per_node


def _share(total: int, placement: Placement, data_parallel: int, node_shards: int) -> tuple[int, int]:
    """(bytes on the device, bytes on the host) of one category for one rank."""
    if placement == "whole":
        return total, 0
    if placement == "node":
        return -(-total // node_shards), 0
    shard = -(-total // data_parallel)
    return (shard, 0) if placement == "sharded" else (0, shard)


def estimate(
    layout: MemoryLayout, checkpointing: bool, facts: ModelFacts, num_nodes: int, processes_per_node: int
) -> MemoryEstimate:
    """The bytes per device of one training step of `facts` under `layout`, by category (verdict left empty)."""
    degree = layout.tensor_parallel
    data_parallel = max(num_nodes * processes_per_node // degree, 1)
    node_shards = max(processes_per_node // degree, 1)
    split = [
        _share(-(-total // degree), placement, data_parallel, node_shards)
        for total, placement in (
            (facts.parameter_bytes, layout.parameters),
            (facts.gradient_bytes, layout.gradients),
            (facts.optimizer_bytes, layout.optimizer),
        )
    ]
    sharded = layout.parameters != "whole"
    gathered = layout.gathered_layers * facts.largest_layer_bytes + facts.root_bytes if sharded else 0
    if checkpointing:
        saved = facts.layer_count * facts.layer_input_bytes_per_sample + facts.activation_bytes_per_layer
    else:
        saved = facts.activation_bytes_per_sample
    return MemoryEstimate(
        layout=layout.name,
        strategy=layout.strategy,
        checkpointing=checkpointing,
        tensor_parallel=degree,
        data_parallel=data_parallel,
        parameters=split[0][0],
        gradients=split[1][0],
        optimizer=split[2][0],
        activations=-(-facts.batch_size * saved // degree),
        gathered=-(-gathered // degree),
        temporaries=-(-facts.temporary_bytes // degree) + layout.gradient_buckets * split[1][0],
        step=_share(-(-facts.optimizer_step_bytes // degree), layout.optimizer, data_parallel, node_shards)[0],
        host=sum(host for _, host in split),
        fits=False,
        verdict="",
    )


def why_not_allowed(
    layout: MemoryLayout,
    checkpointing: bool,
    hardware: Hardware,
    policy: MemoryPolicy,
    rules: Rules,
    hidden_size: int = 0,
) -> str | None:
    """Why the rules do not allow `layout` on this hardware under `policy` for a model whose blocks are
    `hidden_size` wide (0: not known) (None: allowed)."""
    family = rules.families[rules.strategies[layout.strategy].family]
    world, per_node = hardware.world_size, hardware.processes_per_node
    offloads = "host" in (layout.parameters, layout.gradients, layout.optimizer)
    reasons = (
        (checkpointing and not policy.activation_checkpointing, "the policy allows no activation checkpointing"),
        (offloads and not policy.offload, "the policy allows no offload"),
        (
            hardware.accelerator not in family.accelerators,
            f"{layout.strategy!r} does not run on {hardware.accelerator!r}",
        ),
        (
            family.requires_package is not None and family.requires_package not in hardware.packages,
            f"needs the {family.requires_package!r} package",
        ),
        (hardware.precision not in family.precisions, f"{layout.strategy!r} does not run at {hardware.precision!r}"),
        (world < layout.min_processes, f"needs at least {layout.min_processes} devices"),
        (layout.max_processes is not None and world > layout.max_processes, f"runs on {layout.max_processes} device"),
        (hardware.num_nodes < layout.min_nodes, f"needs at least {layout.min_nodes} nodes"),
        (per_node % layout.tensor_parallel != 0, f"tp={layout.tensor_parallel} does not divide a node's {per_node}"),
        (
            hidden_size % layout.tensor_parallel != 0,
            f"tp={layout.tensor_parallel} does not divide the hidden size {hidden_size}",
        ),
    )
    return next((reason for broken, reason in reasons if broken), None)


def judge(estimated: MemoryEstimate, budget: int, hardware: Hardware, policy: MemoryPolicy) -> MemoryEstimate:
    """The estimate with whether it fits the device budget (and, offloading, the node's host memory)."""
    if estimated.total > budget:
        needed, available = compared(estimated.total, budget)
        return attrs.evolve(estimated, verdict=f"needs {needed} > {available}")
    host_needed = estimated.host * hardware.processes_per_node
    if host_needed and hardware.host_bytes is None:
        # offload moves the states to host memory: a layout that may not fit there is not chosen on trust
        return attrs.evolve(estimated, verdict=f"{HOST_NOT_KNOWN} ({size(host_needed)} a node to offload)")
    host_room = _room(hardware.host_bytes, policy)
    if host_room is not None and host_needed > host_room:
        needed, available = compared(host_needed, host_room)  # the room the check used: the host less the headroom
        return attrs.evolve(
            estimated,
            verdict=f"host memory: {needed} a node > {available} ({size(hardware.host_bytes or 0)} less "
            f"{policy.headroom:.0%} headroom)",
        )
    return attrs.evolve(estimated, fits=True, verdict="fits")


@overload
def _room(total: int, policy: MemoryPolicy) -> int: ...
@overload
def _room(total: int | None, policy: MemoryPolicy) -> int | None: ...
def _room(total: int | None, policy: MemoryPolicy) -> int | None:
    """What a layout may use of `total` bytes (a device's, a node's host memory): less the policy's headroom."""
    return None if total is None else int(total * (1 - policy.headroom))


HOST_NOT_KNOWN: Final = "host memory not known: not checked"
"""The verdict's start for an offloading layout when the nodes' host memory is not stated: it is not chosen."""


def candidates(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> Iterator[MemoryEstimate]:
    """Every candidate of the rule set's order, estimated and judged (a disallowed one says why)."""
    budget = _room(hardware.device_bytes, policy)
    layouts = {layout.name: layout for layout in rules.memory_layouts}
    for name, checkpointing in rules.memory_order.candidates():
        layout = layouts[name]
        estimated = estimate(layout, checkpointing, facts, hardware.num_nodes, hardware.processes_per_node)
        refused = why_not_allowed(layout, checkpointing, hardware, policy, rules, facts.hidden_size)
        if refused is not None:
            yield attrs.evolve(estimated, verdict=f"not allowed: {refused}")
        else:
            yield judge(estimated, budget, hardware, policy)


def choose(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> MemoryPlan:
    """The memory plan: every candidate judged, the first that fits chosen (None chosen: nothing fits)."""
    judged = list(candidates(facts, hardware, policy, rules))
    chosen = next(((item.layout, item.checkpointing) for item in judged if item.fits), None)
    return MemoryPlan(
        device_bytes=hardware.device_bytes,
        budget_bytes=_room(hardware.device_bytes, policy),
        host_bytes=hardware.host_bytes,
        policy=policy,
        chosen=None if chosen is None else chosen[0],
        candidates=tuple(_mark(item, chosen) for item in judged),
    )


def _mark(item: MemoryEstimate, chosen: tuple[str, bool] | None) -> MemoryEstimate:
    if chosen is not None and (item.layout, item.checkpointing) == chosen:
        return attrs.evolve(item, verdict="chosen")
    if item.fits:
        return attrs.evolve(item, verdict="fits; a preferred layout fits too")
    return item


def closest(plan: MemoryPlan) -> MemoryEstimate | None:
    """The allowed candidate that came closest to fitting (the smallest peak)."""
    allowed = [item for item in plan.candidates if not item.verdict.startswith("not allowed")]
    return min(allowed, key=lambda item: item.total, default=None)


def fits_somehow(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> bool:
    """Whether some allowed candidate fits `hardware` (the test each way out of a refusal is held to)."""
    return any(item.fits for item in candidates(facts, hardware, policy, rules))


def _fewest(fits: Callable[[int], bool], start: int, limit: int) -> int | None:
    """The least count past `start` (which does not fit) that `fits` found, doubling then bisecting; None when none
    up to `limit`. Every count returned was tried and fits."""
    low, high = start, min(start * 2, limit)
    if high <= low:
        return None
    while not fits(high):
        if high >= limit:
            return None
        low, high = high, min(high * 2, limit)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


def nodes_needed(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> int | None:
    """The fewest nodes like this one (as many devices each, the same host memory each) on which some allowed
    layout fits; None: none up to `MAX_WORLD_SEARCHED` devices."""
    per_node = hardware.processes_per_node
    return _fewest(
        lambda nodes: fits_somehow(facts, attrs.evolve(hardware, num_nodes=nodes), policy, rules),
        hardware.num_nodes,
        MAX_WORLD_SEARCHED // per_node,
    )


def devices_per_node_needed(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> int | None:
    """The fewest devices a node, on as many nodes with the same host memory each, on which some allowed layout
    fits (offload's host memory is a node's, so more devices a node need more of it); None: none searched fits."""
    return _fewest(
        lambda per_node: fits_somehow(facts, attrs.evolve(hardware, processes_per_node=per_node), policy, rules),
        hardware.processes_per_node,
        MAX_WORLD_SEARCHED // hardware.num_nodes,
    )


def _whole_gib_that_fits(needed: int, fits: Callable[[int], bool]) -> int | None:
    """`needed` bytes rounded up to whole GiB, the first such size from it that `fits` (a few tried), else None."""
    size = -(-needed // GIB) * GIB
    return next((size + more * GIB for more in range(4) if fits(size + more * GIB)), None)


def host_memory_needed(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> int | None:
    """The host memory a node needs (whole GiB) for an allowed layout that fits the devices but not the host's
    memory; None when the host's memory is not what binds (not known, or no such layout)."""
    if hardware.host_bytes is None:
        return None
    bound = [item for item in candidates(facts, hardware, policy, rules) if item.verdict.startswith("host memory")]
    if not bound:
        return None
    least = min(item.host for item in bound) * hardware.processes_per_node
    return _whole_gib_that_fits(
        math.ceil(least / (1 - policy.headroom)),
        lambda host: fits_somehow(facts, attrs.evolve(hardware, host_bytes=host), policy, rules),
    )


def device_memory_needed(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> int | None:
    """The memory a device needs (whole GiB) for the allowed layout with the smallest peak whose host memory, if
    any, this node has; None when no layout is allowed here."""
    room = _room(hardware.host_bytes, policy)
    allowed = [
        item for item in candidates(facts, hardware, policy, rules) if not item.verdict.startswith("not allowed")
    ]
    totals = [item.total for item in allowed if room is None or item.host * hardware.processes_per_node <= room]
    if not totals:
        return None
    return _whole_gib_that_fits(
        math.ceil(min(totals) / (1 - policy.headroom)),
        lambda device: fits_somehow(facts, attrs.evolve(hardware, device_bytes=device), policy, rules),
    )


_MODEL_STATES: Final = (
    "parameter_bytes",
    "gradient_bytes",
    "optimizer_bytes",
    "largest_layer_bytes",
    "root_bytes",
    "optimizer_step_bytes",
)
"""The facts that grow with the parameters (a smaller model of the same kind holds fewer of each)."""


def smaller_model(facts: ModelFacts, parameter_count: int) -> ModelFacts:
    """`facts` for `parameter_count` parameters: the model states scaled to it (the same bytes per parameter), the
    activations and temporaries kept (the same batch and sequence; a smaller model's are no larger)."""
    return attrs.evolve(
        facts,
        parameter_count=parameter_count,
        **{name: getattr(facts, name) * parameter_count // facts.parameter_count for name in _MODEL_STATES},
    )


def biggest_model(facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, rules: Rules) -> int | None:
    """The most parameters (two significant digits, rounded down) of a `smaller_model` that fits this hardware;
    None when not even one parameter does (the activations alone are too many)."""

    def fits(count: int) -> bool:
        return fits_somehow(smaller_model(facts, count), hardware, policy, rules)

    if facts.parameter_count <= 1 or not fits(1):
        return None
    low, high = 1, facts.parameter_count  # low fits, high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    digits = 10 ** max(len(str(low)) - 2, 0)
    rounded = low // digits * digits
    return rounded if fits(rounded) else low


MAX_SHAPE = 10**15
"""The largest count a what-if model's shape takes (parameters, layers, hidden, sequence, batch): beyond any model."""


def _check_shape(**shape: object) -> None:
    """A what-if model's shape: each count a number from 1 to `MAX_SHAPE` (read as objects: a caller without a type
    checker may pass anything), else `InvalidRequest` naming the field."""
    for name, value in shape.items():
        if value is not None and not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= MAX_SHAPE
        ):
            raise InvalidRequest(
                field=name,
                value=value,
                reason=f"a model's {name} is a whole number from 1 to {MAX_SHAPE:.0e}{foreign_integer(value)}",
                fix=f"Write e.g. transformer_facts(parameters=7e9, {name}=...) with a positive {name}"
                if name != "parameters"
                else "Write e.g. transformer_facts(parameters=7e9)",
            )


def transformer_facts(
    *,
    parameters: float,
    layers: int | None = None,
    hidden: int | None = None,
    sequence: int = 4096,
    batch_size: int = 1,
    precision: PrecisionKey = WHAT_IF_PRECISION,
    vocabulary: int = WHAT_IF_VOCABULARY,
) -> ModelFacts:
    """The facts of a Llama-like decoder's training step with Adam, from its shape (a what-if, no module needed).

    Weights, gradients and optimizer states per parameter come from `rules.memory.BYTES_PER_PARAMETER` (16-bit mixed
    precision: the ZeRO paper's 2 + 2 + 12 bytes); a layer's activations are 34·s·h bytes per sample (Korthikanti et
    al. 2022, with flash attention) and its input 2·s·h. Without `hidden` and `layers`, Llama's proportions are
    assumed: 12·L·h² parameters with L = h / 128, h rounded to a multiple of 128 (7B: h 4224, L 33; Llama-2 7B's
    published 4096 and 32 count 6.4B in blocks by this formula: write `layers` and `hidden` for a model's exact
    shape). The embedding and the head (2 · vocabulary · h parameters, within the count) are the root unit a sharded
    layout keeps gathered; the optimizer's step takes one more copy of the parameters in fp32 (a foreach AdamW's
    intermediates)."""
    _check_shape(parameters=parameters, layers=layers, hidden=hidden, sequence=sequence, batch_size=batch_size)
    count = int(parameters)
    if count < 1 or precision not in BYTES_PER_PARAMETER:
        raise InvalidRequest(
            field="parameters" if count < 1 else "precision",
            value=parameters if count < 1 else precision,
            reason="a model has at least one parameter" if count < 1 else "no bytes-per-parameter row for it",
            allowed=() if count < 1 else tuple(BYTES_PER_PARAMETER),
            fix="Write e.g. transformer_facts(parameters=7e9)" if count < 1 else None,
        )
    if hidden is None:
        hidden = max(128, round((count * 128 / 12) ** (1 / 3) / 128) * 128)
    if layers is None:
        layers = max(1, hidden // 128)
    weights, gradients, states = BYTES_PER_PARAMETER[precision]
    root = min(2 * vocabulary * hidden, count // 2)
    activation_scale = 1 if weights <= 2 else 2  # 32-bit activations take twice the 16-bit bytes
    per_layer = ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN * sequence * hidden * activation_scale
    return ModelFacts(
        parameter_count=count,
        parameter_bytes=weights * count,
        gradient_bytes=gradients * count,
        optimizer_bytes=states * count,
        activation_bytes_per_sample=per_layer * layers,
        layer_count=layers,
        layer_input_bytes_per_sample=2 * activation_scale * sequence * hidden,
        largest_layer_bytes=weights * ((count - root) // layers),
        root_bytes=weights * root,
        temporary_bytes=0,
        optimizer_step_bytes=4 * count,
        batch_size=batch_size,
        hidden_size=hidden,
        dtype="bfloat16" if weights == 2 else "float32" if weights == 4 else "float64",
        precision=precision,
    )


__all__ = [
    "HOST_NOT_KNOWN",
    "Hardware",
    "biggest_model",
    "candidates",
    "choose",
    "closest",
    "device_memory_needed",
    "devices_per_node_needed",
    "estimate",
    "fits_somehow",
    "host_memory_needed",
    "judge",
    "nodes_needed",
    "smaller_model",
    "transformer_facts",
    "why_not_allowed",
]
