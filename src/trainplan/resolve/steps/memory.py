"""The memory steps (`Request.model` given, and the devices' memory known): before the strategy, `strategy='auto'`
takes the most preferred layout that fits (`resolve.memory.choose`), or is refused with the arithmetic; after the
mesh, an explicit strategy is checked to fit, or refused naming the layouts that do."""

from __future__ import annotations

import attrs

from trainplan.resolve.draft import Draft
from trainplan.resolve.memory import (
    HOST_NOT_KNOWN,
    Hardware,
    biggest_model,
    candidates,
    choose,
    closest,
    device_memory_needed,
    devices_per_node_needed,
    estimate,
    host_memory_needed,
    judge,
    nodes_needed,
    why_not_allowed,
)
from trainplan.resolve.refusal import incompatible
from trainplan.rules.memory import MEMORY_ACCELERATORS, SAME_ARITHMETIC, MemoryLayout
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.memory import GIB, MemoryEstimate, MemoryPlan, MemoryPolicy, ModelFacts
from trainplan.spec.options import FSDPOptions, ModelParallelOptions
from trainplan.spec.sizes import compared, size


def take_model_precision(draft: Draft) -> None:
    """The model's facts say which precision they were built or measured for: a request that writes no precision
    takes theirs (with a note); one that writes another is refused (the facts cannot be rescaled to it honestly)."""
    facts = draft.fields.model
    if facts is None or facts.precision is None or facts.precision == draft.fields.precision:
        return
    if facts.precision not in draft.rules.precisions:
        draft.refuse(
            InvalidRequest(
                field="model.precision",
                value=facts.precision,
                reason="the rule set has no such precision",
                allowed=tuple(draft.rules.precisions),
                fix="Write the precision the facts were built for, e.g. precision='bf16-mixed', or None",
            )
        )
        return
    if "precision" not in draft.request.given:
        draft.note(
            "precision-from-model",
            "info",
            f"precision={facts.precision!r}: the model's facts were built for it and the request wrote no precision "
            f"(the default is {draft.fields.precision!r}); write precision= to state it",
        )
        draft.fields.precision = facts.precision
        return
    draft.refuse(
        incompatible(
            "memory-precision",
            {"precision": draft.fields.precision, "model": facts.parameter_count},
            facts=facts.precision,
        )
    )


def _hardware(draft: Draft) -> Hardware | None:
    """The hardware the model is fitted to; None (with a note) when the devices' memory is not known."""
    memory, devices = draft.env.cuda_memory_bytes, draft.devices
    known = draft.accelerator.name in MEMORY_ACCELERATORS and memory and all(index < len(memory) for index in devices)
    if not known:
        draft.note(
            "memory-unknown",
            "info",
            f"the model's memory was not checked: the memory of {draft.accelerator.name!r} devices is not known "
            "(probe() reads CUDA devices through NVML; a what-if writes Environment(cuda_memory_bytes=...) or "
            "--assume gpu-memory=40GiB)",
        )
        return None
    return Hardware(
        num_nodes=draft.num_nodes,
        processes_per_node=len(devices),
        device_bytes=min(memory[index] for index in devices),
        host_bytes=draft.env.host_memory_bytes,
        accelerator=draft.accelerator.name,
        precision=draft.fields.precision,
        packages=draft.env.packages,
    )


def _policy(draft: Draft) -> MemoryPolicy:
    return draft.fields.memory_policy or draft.rules.memory_policy


def no_choice(draft: Draft) -> None:
    """`check`'s way on after nothing fitted: the strategy is chosen as without the model's facts."""
    draft.memory_choice = None


def fit_memory(draft: Draft) -> None:
    """`strategy='auto'` with the model's facts: the most preferred layout that fits, or the refusal."""
    draft.memory = None
    facts = draft.fields.model
    if facts is None or draft.fields.strategy != "auto" or draft.fields.strategy_options is not None:
        return
    hardware = _hardware(draft)
    if hardware is None:
        return
    policy = _policy(draft)
    plan = choose(facts, hardware, policy, draft.rules)
    draft.memory = plan
    if plan.chosen is None:
        raise _nothing_fits(facts, hardware, policy, draft, plan)
    chosen = next(item for item in plan.candidates if item.verdict == "chosen")
    layout = next(layout for layout in draft.rules.memory_layouts if layout.name == plan.chosen)
    draft.memory_choice = layout
    draft.reasons["memory"] = (
        f"{chosen.layout} ({layout.description}){' with activation checkpointing' if chosen.checkpointing else ''} "
        "is the most preferred "
        f"layout that fits: {size(chosen.total)} of {size(plan.budget_bytes)} per device (the memory table below)"
    )


def _breakdown(item: MemoryEstimate) -> str:
    parts = (
        ("parameters", item.parameters),
        ("gradients", item.gradients),
        ("optimizer", item.optimizer),
        ("activations", item.activations),
        ("gathered layers", item.gathered),
        ("temporaries", item.temporaries),
        ("optimizer step", item.step),
    )
    return ", ".join(f"{name} {size(count)}" for name, count in parts if count)


def _ways_out(
    facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, draft: Draft, nearest: MemoryEstimate | None
) -> list[str]:
    """What to change so that the model fits, each with the numbers that were tried and fit: more nodes like this
    one, more devices a node, more host memory a node where offload's host memory binds, bigger devices, a smaller
    batch, the policy's options."""
    rules, per_node, nodes = draft.rules, hardware.processes_per_node, hardware.num_nodes
    changes = []
    more_nodes = nodes_needed(facts, hardware, policy, rules)
    if more_nodes is not None:
        host = "" if hardware.host_bytes is None else f" and {size(hardware.host_bytes)} of host memory"
        changes.append(
            f"use {more_nodes} nodes like this one (num_nodes={more_nodes}, {per_node} such device(s){host} each: "
            f"{more_nodes * per_node} devices)"
        )
    denser = devices_per_node_needed(facts, hardware, policy, rules)
    if denser is not None and (more_nodes is None or denser * nodes != more_nodes * per_node):
        changes.append(f"use {denser} such devices {'on one node' if nodes == 1 else f'a node on the {nodes} nodes'}")
    if hardware.host_bytes is None and any(
        item.verdict.startswith(HOST_NOT_KNOWN) for item in candidates(facts, hardware, policy, rules)
    ):
        changes.append(
            "state each node's host memory (Environment(host_memory_bytes=...), --host-memory 1TiB): offloading "
            "layouts were not checked against it, so none was chosen"
        )
    host_needed = host_memory_needed(facts, hardware, policy, rules)
    if host_needed is not None and hardware.host_bytes is not None:
        changes.append(f"give each node {host_needed // GIB} GiB of host memory ({size(hardware.host_bytes)} here)")
    device = device_memory_needed(facts, hardware, policy, rules)
    if device is not None:
        changes.append(f"use devices of {device // GIB} GiB or more")
    if nearest is not None and nearest.activations and facts.batch_size > 1:
        changes.append(f"lower batch_size={facts.batch_size} (activations take {size(nearest.activations)})")
    if not policy.activation_checkpointing:
        changes.append("allow MemoryPolicy(activation_checkpointing=True)")
    if not policy.offload:
        changes.append("allow MemoryPolicy(offload=True)")
    biggest = biggest_model(facts, hardware, policy, rules)
    if biggest is None:
        changes.append("no model fits these devices at this batch (the activations alone are too many)")
    else:
        changes.append(
            f"a model of at most {biggest:,} parameters (the same bytes a parameter, the same activations) fits "
            "these devices"
        )
    return changes or ["use devices with more memory"]


def _nothing_fits(
    facts: ModelFacts, hardware: Hardware, policy: MemoryPolicy, draft: Draft, plan: MemoryPlan
) -> Exception:
    nearest = closest(plan)
    return incompatible(
        "memory-nothing-fits",
        {"model": facts.parameter_count, "devices": list(draft.devices)},
        parameters=f"{facts.parameter_count:,}",
        world=hardware.world_size,
        device=size(hardware.device_bytes),
        closest="none (no layout is allowed here)" if nearest is None else _named(nearest),
        needed="-" if nearest is None else compared(nearest.total, plan.budget_bytes)[0],
        breakdown="-" if nearest is None else _breakdown(nearest),
        budget=size(plan.budget_bytes) if nearest is None else compared(nearest.total, plan.budget_bytes)[1],
        headroom=f"{policy.headroom:.0%}",
        verdict="-" if nearest is None else nearest.verdict,
        fix="To fit it: " + "; or ".join(_ways_out(facts, hardware, policy, draft, nearest)),
    )


def _named(item: MemoryEstimate) -> str:
    return f"{item.layout}{' + activation checkpointing' if item.checkpointing else ''}"


_FSDP_DEFAULTS = FSDPOptions()
"""The FSDP options of a layout row that writes none (full shard)."""


def layout_of(draft: Draft) -> MemoryLayout | None:
    """The layout row of the plan's explicit strategy and options (model_parallel: its mesh's tp), if one says it."""
    options, name = draft.options, draft.strategy_name
    for layout in draft.rules.memory_layouts:
        if layout.strategy != name:
            continue
        written = layout.options if isinstance(layout.options, FSDPOptions) else _FSDP_DEFAULTS
        if isinstance(options, FSDPOptions) and options.sharding_strategy != written.sharding_strategy:
            continue
        if isinstance(options, ModelParallelOptions) and draft.mesh is not None:
            return attrs.evolve(layout, name=f"tp{draft.mesh.sizes['tp']}_fsdp", tensor_parallel=draft.mesh.sizes["tp"])
        return layout
    same = SAME_ARITHMETIC.get(name) or SAME_ARITHMETIC.get(draft.strategy.family)
    row = None if same is None else next((item for item in draft.rules.memory_layouts if item.name == same[0]), None)
    return None if row is None or same is None else attrs.evolve(row, name=same[1], strategy=name)


def _own_fit(draft: Draft, own: list[MemoryEstimate], processes_per_node: int) -> MemoryEstimate | None:
    """The explicit strategy's estimate that fits, without then with checkpointing; else an offloading one whose
    host memory nobody stated: the user's call, taken with a warning."""
    fitting = next((item for item in own if item.fits), None)
    if fitting is None:
        fitting = next((item for item in own if item.verdict.startswith(HOST_NOT_KNOWN)), None)
        if fitting is not None:
            draft.note(
                "memory-host-not-checked",
                "warning",
                f"strategy {draft.strategy_name!r} offloads {size(fitting.host * processes_per_node)} a node "
                "to host memory, which was not checked: the host's memory is not known (state it with "
                "Environment(host_memory_bytes=...) or --host-memory 1TiB)",
            )
    return fitting


def check_memory(draft: Draft) -> None:
    """An explicit strategy with the model's facts: checked to fit (with checkpointing where the policy allows)."""
    facts = draft.fields.model
    if facts is None or (draft.fields.strategy == "auto" and draft.fields.strategy_options is None):
        return  # 'auto' was fitted before the strategy was chosen
    layout = layout_of(draft)
    if layout is None:
        draft.note(
            "memory-not-checked",
            "warning",
            f"memory not checked for strategy {draft.strategy_name!r} (no arithmetic for it: no layout row of "
            "rules.memory describes it); strategy='auto' chooses among those that have one",
        )
        return
    hardware = _hardware(draft)
    if hardware is None:
        return
    policy = _policy(draft)
    everything = choose(facts, hardware, policy, draft.rules)
    own = [
        judge(
            estimate(layout, checkpointing, facts, hardware.num_nodes, hardware.processes_per_node),
            everything.budget_bytes,
            hardware,
            policy,
        )
        for checkpointing in (False, True)
        if why_not_allowed(layout, checkpointing, hardware, policy, draft.rules) is None or not checkpointing
    ]
    fitting = _own_fit(draft, own, hardware.processes_per_node)
    draft.memory = attrs.evolve(
        everything,
        chosen=layout.name if fitting is not None else None,
        candidates=tuple(attrs.evolve(item, verdict="chosen" if item is fitting else item.verdict) for item in own),
    )
    if fitting is None:
        others = [_named(item) for item in everything.candidates if item.fits]
        draft.refuse(
            incompatible(
                "memory-strategy-too-big",
                {"strategy": draft.strategy_name, "model": facts.parameter_count},
                needed=compared(own[-1].total, everything.budget_bytes)[0],
                how=" even with activation checkpointing" if own[-1].checkpointing else "",
                breakdown=_breakdown(own[-1]),
                budget=compared(own[-1].total, everything.budget_bytes)[1],
                headroom=f"{policy.headroom:.0%}",
                fix=f"These fit: {', '.join(others)} (strategy='auto' picks the first)"
                if others
                else "No layout fits these devices: use more of them, or devices with more memory",
            )
        )
