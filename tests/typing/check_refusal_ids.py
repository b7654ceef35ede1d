"""A refusal's id is a `RefusalId`, a row of `rules.RULES`: mypy rejects a misspelt one where a refusal is built.
Checked by mypy (`make typecheck`, `warn_unused_ignores`: each `type: ignore[...]` below must be needed), never
executed."""

from __future__ import annotations

from trainplan.resolve.refusal import incompatible
from trainplan.rules import RULES, RefusalId

incompatible("strategy-accelerator", {"strategy": "ddp", "accelerator": "mps"}, supported="'cpu'", why="", fix="")
incompatible("strategy-acelerator", {})  # type: ignore[arg-type]
misspelt: RefusalId = "fork-after-cude"  # type: ignore[assignment]
RULES["strategy_accelerator"]  # type: ignore[index]
