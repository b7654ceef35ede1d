"""The compatibility matrix, rendered from the rule tables (never written by hand).

`trainplan matrix` prints it and the README carries a copy that a test compares with it.
"""

from __future__ import annotations

from trainplan.rules import BUILTIN_RULES, MESH_BACKENDS, MESH_DIMENSIONS, Rules
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
        lines.append(
            f"| `{dimension.name}` ({dimension.title}) | {groups} | "
            + " | ".join(cells)
            + f" | {refused} | {lightning} | {accelerate} |"
        )
    lines += [""]
    lines += [f"- `{dimension.name}`: {dimension.description}." for dimension in MESH_DIMENSIONS.values()]
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
    return "\n".join(lines)
