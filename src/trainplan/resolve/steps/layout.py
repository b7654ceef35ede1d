"""Step 9: the world's layout: processes per node (one per device for a multi-process family, else one) and the
world size, within torch's limit."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.rules import MAX_WORLD_SIZE
from trainplan.spec.errors import InvalidRequest


def lay_out(draft: Draft) -> None:
    num_nodes = draft.num_nodes
    draft.processes_per_node = per_node = len(draft.devices) if draft.family.multi_process else 1
    draft.world_size = num_nodes * per_node
    if draft.world_size > MAX_WORLD_SIZE:
        draft.refuse(
            InvalidRequest(
                field="num_nodes",
                value=num_nodes,
                reason=f"{num_nodes} × {per_node} processes is beyond torch's {MAX_WORLD_SIZE} ranks",
                fix="Ask for fewer nodes or processes per node",
            )
        )
    draft.reasons["layout"] = f"{draft.family.description}; nodes: {draft.nodes_reason}"
