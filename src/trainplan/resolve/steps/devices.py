"""Step 6: the devices: as asked, or for `auto` by the accelerator's device policy; inside a started job the
processes per node it started; for `select_usable_gpus`, the first usable GPUs. `check` goes on with device 0."""

from __future__ import annotations

from trainplan.parse.normalise import DevicesSpec
from trainplan.resolve.cluster import ClusterFacts
from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.resolve.steps.accelerator import visible
from trainplan.resolve.steps.cluster import job_nodes
from trainplan.resolve.visible import visible_entries
from trainplan.rules import SELECTED_DEVICES_VARIABLE, AcceleratorRule
from trainplan.spec.environment import Environment
from trainplan.spec.errors import InvalidRequest, Unavailable
from trainplan.spec.notes import Note
from trainplan.spec.numbers import whole_number

Selection = tuple[tuple[int, ...], str, tuple[Note, ...]]
"""The devices chosen, why, and the notes the choice wrote."""


def select_devices(draft: Draft) -> None:
    fields, rule = draft.fields, draft.accelerator
    if fields.select_usable_gpus:
        selected = _select_usable_devices(rule, fields.devices, draft.env)
    else:
        # Read only inside a started job (outside one the devices are selected as asked).
        nodes_known = draft.in_started_job and (fields.num_nodes != "auto" or job_nodes(draft.facts) is not None)
        selected = _select_devices_in_job(rule, fields.devices, draft.env, draft.facts, draft.num_nodes, nodes_known)
    draft.devices, draft.reasons["devices"], notes = selected
    draft.notes.extend(notes)


def first_device(draft: Draft) -> None:
    """`check`'s way on after the devices were refused."""
    draft.devices = (0,)
    draft.reasons["devices"] = "fallback after an error"


def physical_devices(rule: AcceleratorRule, devices: tuple[int, ...], env: Environment) -> tuple[str, ...]:
    """Which physical GPU each visible index is, as the visibility variable names it (the index when unset)."""
    if rule.visibility_variable is None or rule.count_fact is None:
        return ()
    entries = visible_entries(env.variables.get(rule.visibility_variable), visible(env, rule))
    return tuple(entries[index] if index < len(entries) else str(index) for index in devices)


def _select_devices(rule: AcceleratorRule, spec: DevicesSpec, env: Environment) -> Selection:
    if not rule.takes_indices:
        return _counted_devices(spec, env)
    total = visible(env, rule)
    noun = f"{rule.name} device{'s' if total != 1 else ''}"
    if spec == "auto":
        return _auto_devices(rule, env, total, noun)
    if spec == -1:
        return tuple(range(total)), f"-1: all {total} visible {noun}", ()
    if isinstance(spec, int):
        return _first_devices(rule, spec, total, noun)
    return _indexed_devices(rule, spec, total, noun)


def _auto_devices(rule: AcceleratorRule, env: Environment, total: int, noun: str) -> Selection:
    interactive = rule.interactive_auto_devices
    if interactive is not None and env.interactive and total > interactive:
        note = Note(
            code="devices-interactive",
            level="info",
            message=(
                f"devices='auto' uses {interactive} of {total} GPUs in an interactive session; ask for "
                f"devices={total} (with strategy='ddp_notebook') to use them all"
            ),
        )
        return tuple(range(interactive)), "one GPU: 'auto' in an interactive session", (note,)
    if rule.device_counts == "one":
        return (0,), f"the one {rule.name.upper()} device", ()
    return (
        tuple(range(total)),
        f"'auto': all {total} visible {noun}",
        (Note(code="devices-auto", level="info", message=f"devices='auto' chose {total} {noun}"),),
    )


def _first_devices(rule: AcceleratorRule, spec: int, total: int, noun: str) -> Selection:
    accelerator = rule.name
    if rule.device_counts == "one" and spec != 1:
        raise Unavailable(
            requested=f"devices={spec} on accelerator={accelerator!r}",
            available=rule.counts_why,
            fix="Use devices=1, or accelerator='cpu' with several processes",
        )
    if rule.device_counts == "one_or_all" and spec not in (1, total):
        raise InvalidRequest(
            field="devices",
            value=spec,
            reason=rule.counts_why.format(total=total, count=spec),
            fix=f"Write devices=1, devices={total} (or -1), or a single index such as devices=[0]",
        )
    if spec > total:
        raise Unavailable(
            requested=f"devices={spec} on accelerator={accelerator!r}",
            available=f"{total} visible {noun}",
            fix=f"Ask for at most devices={total} (or devices=-1 for all)",
        )
    return tuple(range(spec)), f"the first {spec} of {total} visible {noun}", ()


def _indexed_devices(rule: AcceleratorRule, spec: tuple[int, ...], total: int, noun: str) -> Selection:
    accelerator = rule.name
    missing = [index for index in spec if index >= total]
    if missing:
        raise Unavailable(
            requested=f"device index {missing[0]} on accelerator={accelerator!r}",
            available=f"{total} visible {noun} (indices 0 to {total - 1}"
            + ("" if rule.visibility_variable is None else f"; indices count after {rule.visibility_variable}")
            + ")",
            fix=f"Name indices below {total}, e.g. devices={list(range(min(len(spec), total)))}",
        )
    if rule.device_counts == "one_or_all" and len(spec) != 1:
        raise InvalidRequest(
            field="devices",
            value=list(spec),
            reason=f"{accelerator.upper()} takes one device index, or a count (1 or all)",
            fix=f"Write devices=[{spec[0]}] for one device, or devices={total} for all",
        )
    return spec, f"the visible indices asked for, {list(spec)}", ()


def _job_processes_per_node(facts: ClusterFacts, num_nodes: int, nodes_known: bool) -> int:
    """The processes per node a started job has, or `job-layout-unknown` when it does not say."""
    if facts.processes_per_node is not None:
        return facts.processes_per_node
    if nodes_known and facts.world_size is not None and facts.world_size % num_nodes == 0:
        return facts.world_size // num_nodes
    world = facts.world_size if facts.world_size is not None else "?"
    raise incompatible("job-layout-unknown", {}, cluster=facts.started_by, world_size=world, detail=facts.detail)


def _select_devices_in_job(
    rule: AcceleratorRule,
    spec: DevicesSpec,
    env: Environment,
    facts: ClusterFacts,
    num_nodes: int,
    nodes_known: bool,
) -> Selection:
    """Devices inside a started job: 'auto' takes the job's processes per node (torchrun's convention on GPUs:
    local rank i drives visible device i); explicit indices that the job's launcher selected are those GPUs."""
    started = facts.creates_processes or facts.launched
    if not started or not rule.job_layout:
        return _select_devices(rule, spec, env)
    if spec == "auto":
        per_node = _job_processes_per_node(facts, num_nodes, nodes_known)
        if rule.count_fact is None:
            return tuple(range(per_node)), f"'auto' inside a started job: its {per_node} process(es) on this node", ()
        count = visible(env, rule)
        if per_node > count:
            raise incompatible("job-gpus", {}, cluster=facts.started_by, processes_per_node=per_node, visible=count)
        return (
            tuple(range(per_node)),
            f"'auto' inside a started job: its {per_node} process(es) on this node, local rank i on visible GPU i",
            (),
        )
    if rule.visibility_variable is None or not isinstance(spec, tuple):
        return _select_devices(rule, spec, env)
    return _selected_in_job(rule, spec, env, rule.visibility_variable)


def _selected_in_job(rule: AcceleratorRule, spec: tuple[int, ...], env: Environment, visibility: str) -> Selection:
    """Explicit indices inside a started job: the GPUs its launcher selected, renumbered as they are visible."""
    selection, variable = _job_selection(env, visibility)
    if selection is None or spec != selection:
        if variable == SELECTED_DEVICES_VARIABLE and selection is not None:
            raise incompatible(
                "job-device-selection",
                {"devices": list(spec)},
                selected=list(selection),
                variable=f"{variable}={','.join(map(str, selection))}",
            )
        return _select_devices(rule, spec, env)
    if rule.count_fact is None or len(spec) > visible(env, rule):
        return _select_devices(rule, spec, env)  # the facts disagree: report the indices as usual
    renumbered = tuple(range(len(spec)))
    note = Note(
        code="job-devices",
        level="info",
        message=(
            f"devices={list(spec)} are the GPUs this job was started on ({variable}); "
            f"inside it they are visible as {', '.join(f'{rule.device_type}:{index}' for index in renumbered)}"
        ),
    )
    return renumbered, f"the GPUs {list(spec)} the job's launcher selected, visible here as {list(renumbered)}", (note,)


def _job_selection(env: Environment, visibility: str) -> tuple[tuple[int, ...] | None, str]:
    """The device indices a job's launcher selected: trainplan's own variable, else an all-integer visibility
    variable (what `CUDA_VISIBLE_DEVICES=0,2 torchrun ...` selected)."""
    for variable in (SELECTED_DEVICES_VARIABLE, visibility):
        raw = env.variables.get(variable)
        if raw is None:
            continue
        numbers = [whole_number(part.strip()) for part in raw.split(",")]
        if all(number is not None for number in numbers):
            return tuple(number for number in numbers if number is not None), variable
        if variable == SELECTED_DEVICES_VARIABLE:
            raise InvalidRequest(
                field=f"environment variable {variable}",
                value=raw,
                reason="it is not a comma-separated list of device indices",
                fix=f"Unset {variable} (trainplan's launchers set it), or set it to indices such as 0,2",
            )
    return None, ""


def _select_usable_devices(rule: AcceleratorRule, spec: DevicesSpec, env: Environment) -> Selection:
    """Devices for `select_usable_gpus` (the `auto_select_gpus` bridge): the first usable visible GPUs."""
    if not rule.probes_usable:
        raise incompatible("usable-needs-cuda", {"select_usable_gpus": True, "accelerator": rule.name})
    if isinstance(spec, tuple):
        raise incompatible("usable-with-indices", {"select_usable_gpus": True, "devices": list(spec)})
    usable = env.usable_cuda_devices
    if usable is None:
        raise Unavailable(
            requested="usable GPUs (select_usable_gpus / auto_select_gpus)",
            available="no usability facts (the environment was not probed for usable GPUs)",
            fix=(
                "Resolve with trainplan.resolve(request), which probes them when asked, or pass "
                "Environment(usable_cuda_devices=...); better: devices=find_usable_cuda_devices(n)"
            ),
        )
    total = env.cuda_device_count
    usable_set = set(usable)
    busy = [index for index in range(total) if index not in usable_set]
    if isinstance(spec, int) and spec != -1:
        wanted = spec
    else:
        interactive = rule.interactive_auto_devices
        auto_few = spec == "auto" and env.interactive and interactive is not None and len(usable) > interactive
        wanted = interactive if auto_few and interactive is not None else len(usable)
    if wanted == 0 or len(usable) < wanted:
        raise Unavailable(
            requested=f"{wanted if wanted else 'any'} usable GPU(s)",
            available=f"{len(usable)} usable of {total} visible (busy: {busy or 'none'})",
            fix="Ask for fewer devices, wait for the busy GPUs, or run where more are free",
        )
    chosen = tuple(sorted(usable)[:wanted])
    return chosen, f"the first {wanted} usable of {total} visible GPUs (busy: {busy or 'none'})", ()


def _counted_devices(spec: DevicesSpec, env: Environment) -> Selection:
    """`devices` on an accelerator without indices (CPU processes): a count of processes."""
    if spec == "auto":
        return (0,), "'auto' on CPU: one process", ()
    if isinstance(spec, tuple):
        raise InvalidRequest(
            field="devices",
            value=list(spec),
            reason="CPU processes have no device indices",
            fix=f"Write the number of processes instead, e.g. devices={len(spec)}",
        )
    if spec == -1:
        raise InvalidRequest(
            field="devices",
            value=-1,
            reason="on CPU, 'all devices' has no meaning: devices counts the processes to start",
            fix=f"Write the number of processes, e.g. devices=2 (this machine has {env.cpu_count} CPUs)",
        )
    notes: tuple[Note, ...] = ()
    if spec > env.cpu_count:
        notes = (
            Note(
                code="cpu-oversubscribed",
                level="warning",
                message=f"{spec} CPU processes on {env.cpu_count} CPU(s): they will compete for cores",
            ),
        )
    return tuple(range(spec)), f"{spec} CPU process(es)", notes
