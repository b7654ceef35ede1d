"""The last step: the plan, from a draft every step decided without a problem (`resolve` only: `check` wants the
problems alone)."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.steps.devices import physical_devices
from trainplan.resolve.steps.normalise import normal_request
from trainplan.spec.plan import Plan, StrategyChoice


def build_plan(draft: Draft) -> Plan:
    fields = draft.fields
    if (fields.devices == "auto" or fields.num_nodes == "auto") and draft.in_started_job:
        draft.note(
            "job-layout",
            "info",
            f"inside a started job: {draft.num_nodes} node(s) × {draft.processes_per_node} process(es) as it started "
            f"them ({draft.facts.detail}); this process joins it (launcher {draft.launcher!r})",
        )
    accelerator = draft.accelerator
    return Plan(
        request=normal_request(fields),
        accelerator=accelerator.name,
        device_type=accelerator.device_type,
        strategy=StrategyChoice(name=draft.strategy_name, family=draft.strategy.family, options=draft.options),
        devices=draft.devices,
        physical_devices=physical_devices(accelerator, draft.devices, draft.env),
        num_nodes=draft.num_nodes,
        processes_per_node=draft.processes_per_node,
        world_size=draft.world_size,
        launcher=draft.launcher,
        cluster=draft.cluster,
        process_group_backend=draft.backend,
        precision=draft.precision,
        metrics=draft.metrics,
        notes=draft.notes,
        reasons=draft.reasons,
        mesh=draft.mesh,
        memory=draft.memory,
        rules=draft.rules.plan_reference,
    )
