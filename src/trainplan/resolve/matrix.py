"""The compatibility matrix, rendered from the rule tables (never written by hand).

`trainplan matrix` prints it and the README carries a copy that a test compares with it.
"""

from __future__ import annotations

from trainplan.spec.names import ACCELERATORS as ACCELERATOR_ORDER
from trainplan.spec.tables import FAMILIES, LAUNCHERS, PRECISIONS, STRATEGIES


def render_matrix() -> str:
    """Markdown tables: strategy × accelerator, then precision × accelerator, then the reasons."""
    columns = list(ACCELERATOR_ORDER)
    lines = [
        "| strategy | family | launcher | " + " | ".join(columns) + " | needs |",
        "|---|---|---|" + "---|" * len(columns) + "---|",
    ]
    for name, rule in STRATEGIES.items():
        family = FAMILIES[rule.family]
        cells = ["✓" if accelerator in family.accelerators else "✗" for accelerator in columns]
        needs = []
        if family.requires_package:
            needs.append(f"`{family.requires_package}` package")
        if family.max_nodes == 1:
            needs.append("one node")
        if family.max_devices_per_node == 1:
            needs.append("one device")
        if rule.launcher == "fork":
            needs.append("`fork`; CUDA not initialised before")
        elif not LAUNCHERS[rule.launcher].interactive_compatible:
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
    for precision_name, precision in PRECISIONS.items():
        cells = []
        for accelerator in columns:
            if accelerator in precision.fallback:
                cells.append(f"→ {precision.fallback[accelerator]}")
            else:
                cells.append("✓" if accelerator in precision.accelerators else "✗")
        package = f"`{precision.requires_package}` package" if precision.requires_package else ""
        lines.append(f"| `{precision_name}` | " + " | ".join(cells) + f" | {package} |")
    lines += ["", "Why not:", ""]
    for family in FAMILIES.values():
        for accelerator, why in family.why_not.items():
            lines.append(f"- {family.family} on {accelerator}: {why}.")
    for precision in PRECISIONS.values():
        for accelerator, why in precision.why_not.items():
            lines.append(f"- precision {precision.name} on {accelerator}: {why}.")
    return "\n".join(lines)
