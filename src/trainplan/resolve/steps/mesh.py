"""Step 14: the device mesh of a `model_parallel` plan (`trainplan.resolve.mesh`): its degrees made whole on the
world, or every layout rule they break."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.spec.options import ModelParallelOptions


def lay_out_mesh(draft: Draft) -> None:
    draft.mesh = None
    options = draft.options
    if not isinstance(options, ModelParallelOptions):
        return
    # The mesh's rules (two attrs classes and 600 lines) load with the first model_parallel plan, not with every plan.
    from trainplan.resolve.mesh import MeshChoice, mesh_or_refusals

    outcome = mesh_or_refusals(
        options,
        num_nodes=draft.num_nodes,
        processes_per_node=draft.processes_per_node,
        accelerator=draft.accelerator.name,
        backend=draft.backend,
        precision=draft.precision,
        strategy=draft.strategy_name,
    )
    if not isinstance(outcome, MeshChoice):
        for refusal in outcome:  # every rule the layout breaks, for check(); resolve raises the first
            draft.refuse(refusal)
        return
    draft.mesh = outcome.layout
    draft.options = outcome.options
    draft.reasons["mesh"] = outcome.reason
    draft.notes.extend(outcome.notes)
