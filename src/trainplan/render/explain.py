"""A plan told to a person: each choice with its reason, a device mesh drawn, then the notes (`Plan.explain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainplan.rules.memory import MEMORY_ORDER
from trainplan.rules.mesh import EXPERT_MESH
from trainplan.spec.options import options_text
from trainplan.spec.sizes import size, unit_of

if TYPE_CHECKING:
    from trainplan.spec.memory import MemoryPlan
    from trainplan.spec.mesh import MeshLayout
    from trainplan.spec.plan import Plan, ReducesOn

_REDUCES_ON: dict[ReducesOn, str] = {
    "device": "reduced on the device",
    "where_stored": "reduced where stored",
    "nowhere": "never reduced (one process)",
}

_DRAWN_NODES = 8
_DRAWN_RANKS = 32
_DRAWN_GROUPS = 8
_DRAWN_MEMBERS = 16


def explain(plan: Plan) -> str:
    """A human-readable account of the plan: each choice with its reason, then the notes."""
    options = "" if plan.strategy.options is None else f" {options_text(plan.strategy.options)}"
    pipeline, why = (None, None) if plan.mesh is None or plan.mesh.size("pp") == 1 else _pipeline(plan, plan.mesh)
    cluster = plan.cluster
    port = "chosen at launch" if cluster.main_port is None else str(cluster.main_port)
    rank = (
        "" if cluster.global_rank is None else f", global rank {cluster.global_rank}, local rank {cluster.local_rank}"
    )
    rows: list[tuple[str, str, str]] = [
        ("accelerator", plan.accelerator, "accelerator"),
        ("devices", _describe_devices(plan), "devices"),
        ("strategy", f"{plan.strategy.name} (family {plan.strategy.family}){options}", "strategy"),
        (
            "layout",
            f"{plan.num_nodes} node(s) × {plan.processes_per_node} process(es) = world size {plan.world_size}",
            "layout",
        ),
        *(() if plan.mesh is None else (("mesh", f"{plan.mesh.describe()} = {plan.mesh.world_size} rank(s)", "mesh"),)),
        *(() if pipeline is None else (("pipeline", pipeline, "pipeline"),)),
        ("launcher", plan.launcher, "launcher"),
        (
            "cluster",
            f"{cluster.kind}, main {cluster.main_address}:{port}, node rank {_node_rank(cluster.node_rank)}{rank}",
            "cluster",
        ),
        ("backend", plan.process_group_backend or "none (single process)", "backend"),
        ("precision", plan.precision, "precision"),
        (
            "metrics",
            f"stored on {plan.metrics.default_store}, {_REDUCES_ON[plan.metrics.reduces_on]}",
            "metrics",
        ),
    ]
    width = max(len(label) for label, _, _ in rows)
    lines = ["trainplan: the plan"]
    for label, value, key in rows:
        lines.append(f"  {label.ljust(width)}  {value}")
        reason = why if label == "pipeline" else plan.reasons.get(key)  # the pipeline's why is its own
        if reason:
            lines.append(f"  {' ' * width}    why: {reason}")
    if plan.mesh is not None:
        lines.extend(_draw_mesh(plan, plan.mesh))
    if plan.memory is not None:
        lines.extend(memory_table(plan.memory))
        if plan.memory.chosen is not None and plan.request.strategy == "auto":
            lines.append(f"  order: {MEMORY_ORDER.reason}")
    if plan.notes:
        lines.append("notes:")
        lines.extend(f"  - {note}" for note in plan.notes)
    return "\n".join(lines)


def _pipeline(plan: Plan, mesh: MeshLayout) -> tuple[str, str]:
    """The pipeline as it runs (schedule, stages per rank, microbatches), and which of those were defaults taken."""
    pipeline, pp = mesh.pipeline, mesh.size("pp")
    value = (
        f"{pipeline.schedule}, {pipeline.virtual_stages} stage(s) per rank ({pp * pipeline.virtual_stages} in all), "
        f"{pipeline.microbatches} microbatch(es) per step"
    )
    options = plan.strategy.options
    written = set() if options is None else set(options.given)
    taken = [
        f"{name}={getattr(pipeline, field)!r} ({why})"
        for name, field, why in (
            ("pp_schedule", "schedule", "the default schedule"),
            ("pp_virtual_stages", "virtual_stages", f"the fewest {pipeline.schedule} takes"),
            ("pp_microbatches", "microbatches", "one per stage"),
        )
        if name not in written
    ]
    return value, ("defaults taken: " + ", ".join(taken) if taken else "as asked")


def _draw_mesh(plan: Plan, mesh: MeshLayout) -> list[str]:
    """Nodes × processes with each rank's number, the tensor-parallel groups in brackets and pipeline stages
    apart; then the groups along each dimension above 1, and this rank's coordinates."""
    tp, pp = mesh.size("tp"), mesh.size("pp")
    stage = mesh.world_size // pp
    legend = ["ranks"]
    if tp > 1:
        legend.append("[ ] a tensor-parallel group")
    if pp > 1:
        legend.append("| between pipeline stages")
    lines = [f"layout (node × process: {'; '.join(legend)}):"]
    per_node = plan.processes_per_node
    for node in range(min(plan.num_nodes, _DRAWN_NODES)):
        first = node * per_node
        shown = range(first, first + min(per_node, _DRAWN_RANKS))
        cells: list[str] = []
        for rank in shown:
            if rank > first and pp > 1 and rank % stage == 0:
                cells.append("|")
            text = str(rank)
            if tp > 1 and rank % tp == 0:
                text = "[" + text
            if tp > 1 and (rank % tp == tp - 1 or rank == shown[-1]):
                text += "]"
            cells.append(text)
        if per_node > _DRAWN_RANKS:
            cells.append(f"… ({per_node - _DRAWN_RANKS} more)")
        stages = sorted({rank // stage for rank in (first, first + per_node - 1)})
        where = ""
        if pp > 1:
            where = f"   stage {stages[0]}" if len(stages) == 1 else f"   stages {stages[0]}-{stages[-1]}"
        lines.append(f"  node {node}  {' '.join(cells)}{where}")
    if plan.num_nodes > _DRAWN_NODES:
        lines.append(f"  … {plan.num_nodes - _DRAWN_NODES} more node(s)")
    dimensions = [name for name in mesh.dimensions if mesh.size(name) > 1]
    if dimensions:
        lines.append("groups (the ranks that share every other coordinate):")
        width = max(len(name) for name in dimensions)
        for name in dimensions:
            size = mesh.size(name)
            groups = mesh.groups(name, limit=_DRAWN_GROUPS, members=_DRAWN_MEMBERS)
            cut = f",… ({size} ranks)" if size > _DRAWN_MEMBERS else ""
            shown_groups = " ".join("{" + ",".join(map(str, group)) + cut + "}" for group in groups)
            total = mesh.world_size // mesh.size(name)
            more = f" … ({total} groups)" if total > _DRAWN_GROUPS else ""
            backend = mesh.backends.get(name)
            over = f"   over {backend} (the world: {plan.process_group_backend})" if backend is not None else ""
            lines.append(f"  {name.ljust(width)}  {shown_groups}{more}{over}")
    if mesh.size("cp") > 1:
        context = mesh.context_parallel
        lines.append(
            f"context parallelism: key/value shards rotated by {context.rotate_method}, sequences split "
            + ("head-tail (load-balanced)" if context.load_balancer == "head_tail" else "in contiguous blocks")
        )
    coordinates = plan.mesh_coordinates
    if coordinates is not None:
        place = ", ".join(f"{name} {index}" for name, index in coordinates.items())
        lines.append(f"this rank: {plan.cluster.global_rank} at {place}")
    if mesh.ep > 1:
        lines.extend(_draw_expert_mesh(mesh))
    return lines


def _draw_expert_mesh(mesh: MeshLayout) -> list[str]:
    """The expert mesh's own groups (the first few of each), as torchtitan's sparse mesh lays them out."""
    expert = mesh.expert
    lines = [f"expert mesh: {' × '.join(f'{name} {size}' for name, size in expert.sizes.items())}"]
    for name, rule in EXPERT_MESH.items():
        groups: list[tuple[int, ...]] = []
        for rank in range(mesh.world_size):
            group = expert.group(rank, name)
            if group not in groups:
                groups.append(group)
            if len(groups) == _DRAWN_GROUPS:
                break
        drawn = " ".join("{" + ",".join(map(str, group[:_DRAWN_MEMBERS])) + "}" for group in groups)
        lines.append(f"  {name.ljust(5)}  {drawn}   ({rule.title} groups)")
    return lines


_COLUMNS = ("params", "grads", "optim", "activ", "gather", "temp", "step", "total", "host")


def memory_table(memory: MemoryPlan) -> list[str]:
    """The memory arithmetic: per device, by category, for each candidate in preference order, and its verdict; in
    the unit a device's memory prints in (GiB, or MiB for a small one, so that no figure reads 0.0)."""
    policy = memory.policy
    unit, scale = unit_of(memory.device_bytes)
    host = "" if memory.host_bytes is None else f", host {size(memory.host_bytes)} a node"
    lines = [
        f"memory per device ({unit}): {memory.device_bytes / scale:.1f} a device, budget "
        f"{memory.budget_bytes / scale:.1f} "
        f"after {policy.headroom:.0%} headroom{host}; total = params + grads + optim + the larger of "
        "(activ + gather + temp) and step",
        "  " + "layout".ljust(24) + "".join(column.rjust(8) for column in _COLUMNS) + "  verdict",
    ]
    for item in memory.candidates:
        name = item.layout + (" +ckpt" if item.checkpointing else "")
        figures = (
            item.parameters,
            item.gradients,
            item.optimizer,
            item.activations,
            item.gathered,
            item.temporaries,
            item.step,
            item.total,
            item.host,
        )
        marker = "→ " if item.verdict == "chosen" else "  "
        lines.append(
            marker + name.ljust(24) + "".join(f"{count / scale:8.1f}" for count in figures) + f"  {item.verdict}"
        )
    return lines


def _describe_devices(plan: Plan) -> str:
    strings = plan.device_strings
    if not plan.physical_devices or all(
        physical == str(index) for physical, index in zip(plan.physical_devices, plan.devices, strict=False)
    ):
        return ", ".join(strings)
    return ", ".join(
        f"{device} (GPU {physical})" for device, physical in zip(strings, plan.physical_devices, strict=False)
    )


def _node_rank(node_rank: int | None) -> str:
    return "not stated" if node_rank is None else str(node_rank)
