"""The pure resolver: `resolve(request, env)` → `Plan`, `check(request, env)` → every problem.

Imports `trainplan.spec` only; never torch, the effects layer, the process environment or the clock.
"""

from trainplan.resolve.cluster import expand_hostlist
from trainplan.resolve.core import check, place_metric, resolve, resolve_uncached

__all__ = ["check", "expand_hostlist", "place_metric", "resolve", "resolve_uncached"]
