"""The compatibility matrix and the resolver's policies in words, rendered from the rule tables (never written by
hand).

`trainplan matrix` prints the matrix; the documentation carries a copy of each (docs/compatibility.md,
docs/concepts.md) that a test compares with it.
"""

from __future__ import annotations

import textwrap

from trainplan.rules import (
    BUILTIN_RULES,
    EXPERT_REGION,
    MESH_BACKENDS,
    MESH_DIMENSIONS,
    MESH_EXCLUSIONS,
    OPTION_TYPES,
    PIPELINE_SCHEDULE_RULES,
    AutoStrategyRule,
    ClusterRule,
    Rules,
)
from trainplan.spec.names import ACCELERATORS as ACCELERATOR_ORDER
from trainplan.spec.names import AcceleratorKey


def render_matrix(rules: Rules = BUILTIN_RULES) -> str:
    """Markdown tables: strategy × accelerator, then precision × accelerator, then the reasons (of `rules`)."""
    # trainplan's accelerators in their order, then those a downstream rule set adds.
    columns: list[AcceleratorKey] = [*ACCELERATOR_ORDER]
    columns += [name for name in rules.accelerators if name not in columns]
    lines = [
        "| strategy | family | launcher | " + " | ".join(columns) + " | needs |",
        "|---|---|---|" + "---|" * len(columns) + "---|",
    ]
    for name, rule in rules.strategies.items():
        family = rules.families[rule.family]
        launcher = rules.launchers[rule.launcher]
        cells = ["✓" if accelerator in family.accelerators else "✗" for accelerator in columns]
        needs = []
        if family.requires_package:
            needs.append(f"`{family.requires_package}` package")
        if family.max_nodes == 1:
            needs.append("one node")
        if family.max_devices_per_node == 1:
            needs.append("one device")
        if launcher.forks:
            needs.append("`fork`; CUDA not initialised before")
        elif not launcher.interactive_compatible:
            needs.append("a script (not a notebook)")
        if rule.preset:
            needs.append(", ".join(f"{key}={value!r}" for key, value in rule.preset.items()))
        lines.append(
            f"| `{name}` | {rule.family} | {rule.launcher} | " + " | ".join(cells) + f" | {'; '.join(needs)} |"
        )
    lines += [
        "",
        "| precision | " + " | ".join(columns) + " | needs |",
        "|---|" + "---|" * len(columns) + "---|",
    ]
    for precision_name, precision in rules.precisions.items():
        cells = []
        for accelerator in columns:
            if accelerator in precision.fallback:
                cells.append(f"→ {precision.fallback[accelerator]}")
            else:
                cells.append("✓" if accelerator in precision.accelerators else "✗")
        package = f"`{precision.requires_package}` package" if precision.requires_package else ""
        lines.append(f"| `{precision_name}` | " + " | ".join(cells) + f" | {package} |")
    lines += [
        "",
        "| mesh dimension (`model_parallel`, outermost first) | groups | "
        + " | ".join(columns)
        + " | refuses precision | Lightning | Accelerate |",
        "|---|---|" + "---|" * len(columns) + "---|---|---|",
    ]
    for dimension in MESH_DIMENSIONS.values():
        cells = ["✓" if accelerator in dimension.accelerators else "✗" for accelerator in columns]
        if dimension.inside_node:
            groups = "inside a node"
        elif dimension.stage_aligned:
            groups = "whole nodes per stage, or whole stages per node"
        else:
            groups = "anywhere"
        refused = ", ".join(f"`{name}`" for name in dimension.precisions_refused)
        lightning = f"`{dimension.lightning_size}`" if dimension.lightning_size else "—"
        accelerate = f"`{dimension.accelerate_size}`" if dimension.accelerate_size else "—"
        if dimension.accelerate_size and dimension.accelerate_why_not:
            accelerate += " (refused: see below)"
        lines.append(
            f"| `{dimension.name}` ({dimension.title}) | {groups} | "
            + " | ".join(cells)
            + f" | {refused} | {lightning} | {accelerate} |"
        )
    lines += [""]
    lines += [f"- `{dimension.name}`: {dimension.description}." for dimension in MESH_DIMENSIONS.values()]
    lines.append(
        "- Groups are placed as the groups column says where a degree is 'auto'; a degree written as a number is "
        "planned as written, and where its groups span hosts (or its stages straddle a node) the plan warns with "
        "the numbers."
    )
    lines.append(
        "- `ep` (expert-parallel) is borrowed from "
        + " × ".join(f"`{name}`" for name in EXPERT_REGION)
        + ", as torchtitan's is: it divides their product and adds nothing to the world size; the expert mesh is "
        "`efsdp` × `ep`."
    )
    for exclusion in MESH_EXCLUSIONS:
        first, second = exclusion.dimensions
        lines.append(f"- `{first}` and `{second}` exclude each other: {exclusion.why}.")
    schedules = {
        "any": "any number of microbatches",
        "at_least_stages": "at least as many microbatches as stages",
        "multiple_of_rounds": "a multiple of its rounds of microbatches",
    }
    for schedule in PIPELINE_SCHEDULE_RULES.values():
        least, most = schedule.virtual_stages
        stages = f"{least} stage(s) per rank" if least == most else f"{least} or more stages per rank"
        if most is not None and least != most:
            stages = f"{least} to {most} stages per rank"
        lines.append(f"- pipeline schedule `{schedule.name}`: {stages}, {schedules[schedule.microbatches]}.")
    lines.append(
        "- A mesh's collectives run over "
        + ", ".join(f"{backend} on {accelerator}" for accelerator, backend in MESH_BACKENDS.items())
        + "."
    )
    lines += ["", "Why not:", ""]
    for family in rules.families.values():
        for accelerator, why in family.why_not.items():
            lines.append(f"- {family.family} on {accelerator}: {why}.")
    for precision in rules.precisions.values():
        for accelerator, why in precision.why_not.items():
            lines.append(f"- precision {precision.name} on {accelerator}: {why}.")
    for dimension in MESH_DIMENSIONS.values():
        for accelerator, why in dimension.why_not.items():
            lines.append(f"- {dimension.name} above 1 on {accelerator}: {why}.")
        for precision_name, why in dimension.precisions_refused.items():
            lines.append(f"- {dimension.name} above 1 with {precision_name}: {why}.")
        if dimension.accelerate_size and dimension.accelerate_why_not:
            lines.append(f"- {dimension.name} above 1 under Accelerate: {dimension.accelerate_why_not}.")
    return "\n".join(lines)


def render_policies(rules: Rules = BUILTIN_RULES) -> str:
    """The concepts page's "How a request is resolved" (docs/concepts.md): the steps in order, each policy in words
    from its rows (the accelerators' order and groups, `auto`'s device policy, the `auto` strategy rows, the default
    backends, the precision fallbacks, the clusters' detection order and variables)."""
    by_priority = rules.accelerators_by_priority
    groups = "; ".join(f"`{name}`: {_either(members)}" for name, members in rules.accelerator_groups.items())
    few = "".join(
        f", but {rule.interactive_auto_devices} in a notebook" for rule in by_priority if rule.interactive_auto_devices
    )
    hidden = " or ".join(f"`{rule.visibility_variable}`" for rule in by_priority if rule.visibility_variable)
    backends: dict[str, list[str]] = {}
    for rule in by_priority:
        backends.setdefault(rule.default_backend, []).append(rule.name.upper())
    fallbacks = ", ".join(
        f"`{precision.name}` on {accelerator.upper()} falls back to `{instead}`"
        for precision in rules.precisions.values()
        for accelerator, instead in precision.fallback.items()
    )
    options = "".join(
        f"; with `{OPTION_TYPES[family].__name__}`, `{name}`" for family, name in rules.auto_for_options.items()
    )
    clusters = sorted(rules.clusters.values(), key=lambda rule: -(rule.detect_priority or 0))
    detected = " > ".join(map(_detected_by, clusters))
    steps = (
        f"In order: normalise the request → read the cluster environment → choose the accelerator (`auto`: "
        f"{' > '.join(rule.name.upper() for rule in by_priority)}; {groups}) → check availability and select devices "
        f"(`auto`: all visible GPUs{few}, and inside a started job the processes per node it started; `-1`: all; "
        f'indices are *visible* indices, after {hidden}; `num_nodes="auto"`: the job\'s nodes, else 1) → choose the '
        f"strategy (`auto`: the first that holds of {', '.join(map(_auto_row, rules.auto_strategies))}{options}) → "
        "launcher and world layout, checked against the cluster → backend ("
        + ", ".join(f"{'/'.join(names)} → {backend}" for backend, names in backends.items())
        + f") → precision ({fallbacks}, with a note) → the device mesh (`model_parallel`: see "
        "[Parallel layouts](mesh.md#parallel-layouts-an-n-d-device-mesh)) → metric placement → notes."
    )
    clusters_text = f"Clusters are detected from environment variables, the innermost launcher first: {detected}."
    return "\n\n".join(_wrapped(text) for text in (steps, clusters_text))


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=116, break_long_words=False, break_on_hyphens=False)


def _either(names: tuple[str, ...]) -> str:
    return " or ".join(name.upper() for name in names)


def _detected_by(rule: ClusterRule) -> str:
    """A cluster by its label, and the variables that detect it."""
    groups = [_listed(group) for group in rule.detect_variables if group]
    return rule.schemas[0].label + (f" ({'; or '.join(groups)})" if groups else "")


def _listed(names: frozenset[str]) -> str:
    ordered = sorted(names)
    return ordered[0] if len(ordered) == 1 else ", ".join(ordered[:-1]) + " and " + ordered[-1]


def _auto_row(row: AutoStrategyRule) -> str:
    """One `auto` row in words: its strategy and the conditions it holds under."""
    conditions = [
        *([f"on {_either(tuple(sorted(row.accelerators)))}"] if row.accelerators is not None else []),
        *(["for several devices"] if row.min_devices > 1 else []),
        *(["for one device"] if row.max_devices == 1 else []),
        *(["across nodes"] if row.min_nodes > 1 else []),
        *([f"{'in' if row.interactive else 'outside'} a notebook"] if row.interactive is not None else []),
    ]
    return f"`{row.strategy}` {' '.join(conditions)}" if conditions else f"else `{row.strategy}`"


def matrix_record(rules: Rules = BUILTIN_RULES) -> dict[str, object]:
    """The compatibility tables as JSON data (`trainplan matrix --json`): each strategy's family, launcher and
    accelerators, each precision's accelerators and fallbacks, each mesh dimension's accelerators."""
    return {
        "strategies": [
            {
                "name": name,
                "family": rule.family,
                "launcher": rule.launcher,
                "accelerators": sorted(rules.families[rule.family].accelerators),
                "requires_package": rules.families[rule.family].requires_package,
                "preset": {key: repr(value) for key, value in rule.preset.items()},
            }
            for name, rule in rules.strategies.items()
        ],
        "precisions": [
            {
                "name": name,
                "accelerators": sorted(precision.accelerators),
                "fallback": dict(precision.fallback),
                "requires_package": precision.requires_package,
            }
            for name, precision in rules.precisions.items()
        ],
        "mesh_dimensions": [
            {"name": dimension.name, "accelerators": sorted(dimension.accelerators)}
            for dimension in MESH_DIMENSIONS.values()
        ],
    }
