"""A downstream framework's rule set, as a framework would ship it: trainplan's own rules plus its strategies.

Lightning users register strategies such as `ddp_custom_checkpoint_io` in Lightning's global `StrategyRegistry`;
with trainplan the framework builds a value instead and passes it to `resolve`, `check`, `render_matrix` and the
CLI (`trainplan plan --rules tests.downstream_rules:RULES --strategy ddp_custom_checkpoint_io`).
"""

from __future__ import annotations

from typing import Final

import attrs

from trainplan import BUILTIN_RULES, CustomName, Rules, StrategyRule

CHECKPOINT_IO: Final = CustomName("ddp_custom_checkpoint_io")
"""DDP with the framework's own checkpoint IO: one process per device, started by re-running the script."""

CHECKPOINT_IO_NOTEBOOK: Final = CustomName("ddp_custom_checkpoint_io_notebook")
"""The same, forked (for notebooks); a started job runs it as CHECKPOINT_IO."""

STATIC_DEEPSPEED: Final = CustomName("deepspeed_static_stage_1")
"""ZeRO stage 1 under the framework's name (a preset of the deepspeed family)."""

CUSTOM_NAMES: Final = (CHECKPOINT_IO, CHECKPOINT_IO_NOTEBOOK, STATIC_DEEPSPEED)

RULES: Final[Rules] = BUILTIN_RULES.extend(
    strategies=[
        StrategyRule(name=CHECKPOINT_IO, family="ddp", launcher="subprocess", preset={"static_graph": True}),
        StrategyRule(name=CHECKPOINT_IO_NOTEBOOK, family="ddp", launcher="fork", preset={"static_graph": True}),
        StrategyRule(name=STATIC_DEEPSPEED, family="deepspeed", launcher="subprocess", preset={"stage": 1}),
    ],
    # The framework's DeepSpeed build also runs on CPU processes (DeepSpeed has a CPU accelerator).
    families=[
        attrs.evolve(
            BUILTIN_RULES.families["deepspeed"],
            accelerators=BUILTIN_RULES.families["deepspeed"].accelerators | {"cpu"},
            why_not={
                accelerator: why
                for accelerator, why in BUILTIN_RULES.families["deepspeed"].why_not.items()
                if accelerator != "cpu"
            },
        )
    ],
    script_counterparts={CHECKPOINT_IO_NOTEBOOK: CHECKPOINT_IO},
    fork_counterparts={CHECKPOINT_IO: CHECKPOINT_IO_NOTEBOOK},
    name="tests.downstream_rules:RULES",  # plans record it; a launched worker imports it from here
)
