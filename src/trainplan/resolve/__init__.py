"""The pure resolver: `resolve(request, env)` → `Plan`, `check(request, env)` → every problem.

Imports `trainplan.spec`, `trainplan.rules` and `trainplan.parse` only; never torch, the effects layer, the process
environment or the clock. The recipe is `pipeline.STEPS`; each step is a module of `resolve.steps`.
"""

from trainplan.resolve.cluster import expand_hostlist
from trainplan.resolve.pipeline import check, resolve, resolve_uncached
from trainplan.resolve.steps.metrics import place_metric

__all__ = ["check", "expand_hostlist", "place_metric", "resolve", "resolve_uncached"]
