"""Step 16: where logged metrics live and are reduced (the plan's placement), and `place_metric`: where one logged
metric lives under a plan."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import BUILTIN_RULES, HOST_DEVICE, HOST_METRICS_STORE, AcceleratorRule, Rules, lookup
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.names import BackendKey, MetricKind, MetricsStore
from trainplan.spec.plan import MetricPlacement, MetricSlot, Plan


def place_metrics(draft: Draft) -> None:
    store, accelerator = draft.fields.metrics_store, draft.accelerator
    draft.metrics = _metric_placement(store, accelerator, draft.backend, draft.world_size, draft.rules)
    draft.reasons["metrics"] = draft.metrics.explanation
    if store == HOST_METRICS_STORE and accelerator.host:
        draft.note("metrics-store-cpu", "info", "metrics_store='cpu' changes nothing on a CPU run")


def _metric_placement(
    store: MetricsStore, accelerator: AcceleratorRule, backend: BackendKey | None, world_size: int, rules: Rules
) -> MetricPlacement:
    device_type = accelerator.device_type
    where = "on the CPU" if store == HOST_METRICS_STORE or accelerator.host else f"on the {device_type} device"
    if world_size == 1 or backend is None:
        return MetricPlacement(
            default_store=store,
            device_type=device_type,
            reduces_on="nowhere",
            cpu_values_move_for_reduction=False,
            explanation=f"logged tensors are kept {where}; one process, so nothing is reduced",
        )
    rule = lookup(rules.backends, backend, name="BACKENDS")
    if rule.needs_device_tensors:
        moves = not accelerator.host
        return MetricPlacement(
            default_store=store,
            device_type=device_type,
            reduces_on="device",
            cpu_values_move_for_reduction=moves,
            explanation=(
                f"logged tensors are kept {where}; {backend} reduces {device_type} tensors only, so CPU-stored "
                f"values are moved to the {device_type} device for each reduction and back"
            ),
        )
    return MetricPlacement(
        default_store=store,
        device_type=device_type,
        reduces_on="where_stored",
        cpu_values_move_for_reduction=False,
        explanation=f"logged tensors are kept {where}; {backend} reduces them where they are stored",
    )


def place_metric(
    plan: Plan, kind: MetricKind = "tensor", store_on_cpu: bool | None = None, rules: Rules = BUILTIN_RULES
) -> MetricSlot:
    """Where one logged metric lives and is reduced under `plan`.

    `store_on_cpu=None` takes the plan's default store. A stateful metric object (torchmetrics
    `Metric`) kept on CPU cannot be reduced by a backend that takes device tensors only (NCCL):
    that is refused with `Incompatible`, since the metric reduces its own states where they live.
    """
    if kind not in ("tensor", "stateful"):
        raise InvalidRequest(
            field="kind", value=kind, reason="it is not a kind of metric", allowed=("tensor", "stateful")
        )
    if store_on_cpu is not None and not isinstance(store_on_cpu, bool):
        raise InvalidRequest(
            field="store_on_cpu",
            value=store_on_cpu,
            reason="it must be True, False or None",
            allowed=(True, False, None),
        )
    metrics = plan.metrics
    on_cpu = (metrics.default_store == HOST_METRICS_STORE) if store_on_cpu is None else store_on_cpu
    device = plan.device_for(0) if plan.processes_per_node > 0 else HOST_DEVICE
    row = rules.accelerators.get(plan.accelerator)
    host = row is not None and row.host  # a downstream accelerator (its rules elsewhere) is never the host's CPUs
    if host:
        on_cpu = True
    store_device = HOST_DEVICE if on_cpu else device
    if metrics.reduces_on == "nowhere":
        return MetricSlot(
            store_device=store_device, reduce_device=None, moves_for_reduction=False, explanation=metrics.explanation
        )
    if metrics.reduces_on == "device" and on_cpu and not host:
        if kind == "stateful":
            raise incompatible(
                "metric-stateful-cpu",
                {"kind": kind, "store_on_cpu": True, "process_group_backend": plan.process_group_backend},
                backend=plan.process_group_backend,
                device_type=metrics.device_type,
            )
        return MetricSlot(
            store_device=HOST_DEVICE,
            reduce_device=device,
            moves_for_reduction=True,
            explanation=f"kept on the CPU; moved to {device} for each reduction ({plan.process_group_backend} needs "
            f"{metrics.device_type} tensors) and back",
        )
    return MetricSlot(
        store_device=store_device,
        reduce_device=store_device,
        moves_for_reduction=False,
        explanation=f"kept and reduced on {store_device}",
    )
