"""The resolver: (Request, Environment, Rules) → Plan, or a typed error. Pure and deterministic.

A recipe of named steps over one `Draft` (the plan so far, its notes, its reasons and the problems found), each in
its own module under `trainplan.resolve.steps`. A step decides its part of the draft from what the steps before it
decided. `resolve` stops at the first problem. `check` runs the same steps and lists every problem: where a step
refuses, it goes on from the step's `instead`, a neutral choice, so that the later steps still look at the request.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Final

import attrs

from trainplan.resolve.draft import Draft
from trainplan.resolve.steps import (
    accelerator,
    backend,
    cluster,
    devices,
    environment,
    launcher,
    layout,
    memory,
    mesh,
    metrics,
    normalise,
    precision,
    strategy,
)
from trainplan.resolve.steps.plan import build_plan
from trainplan.rules import BUILTIN_RULES, Rules
from trainplan.spec.environment import Environment
from trainplan.spec.errors import TrainplanError
from trainplan.spec.plan import Plan
from trainplan.spec.request import Request


@attrs.frozen
class Step:
    """One step of the recipe. `run` decides its part of the draft: a problem it can go on from goes through
    `Draft.refuse`, one it cannot is raised. `instead` is what `check` goes on with after a raised problem (None:
    the step never refuses, and a raised error is a broken rule set's, never the request's)."""

    name: str
    run: Callable[[Draft], None]
    instead: Callable[[Draft], None] | None = None


STEPS: Final[tuple[Step, ...]] = (
    # 1. The arguments: a Request, an Environment and a Rules.
    Step("arguments", environment.check_arguments, instead=Draft.end),
    # 2. The environment's facts, each of its type and in range.
    Step("environment", environment.check_facts),
    # 3. The request's fields in normal form (a refused one takes its default).
    Step("normalise", normalise.normalise),
    # 3a. The precision the model's facts were built for: an unwritten precision takes it, another is refused.
    Step("model_precision", memory.take_model_precision),
    # 4. The cluster, from the environment's variables, and the nodes.
    Step("cluster", cluster.read_cluster, instead=cluster.this_machine),
    # 5. The accelerator, and that it is there.
    Step("accelerator", accelerator.choose_accelerator, instead=accelerator.assume_present),
    # 6. The devices.
    Step("devices", devices.select_devices, instead=devices.first_device),
    # 7a. With the model's facts, strategy='auto' takes the most preferred layout that fits the devices' memory.
    Step("memory", memory.fit_memory, instead=memory.no_choice),
    # 7. The strategy, and whether it runs here.
    Step("strategy", strategy.choose_strategy),
    # 8. The strategy's options, its preset applied.
    Step("options", strategy.merge_options, instead=strategy.no_options),
    # 9. Processes per node and the world size.
    Step("layout", layout.lay_out),
    # 10. The launcher.
    Step("launcher", launcher.choose_launcher, instead=launcher.host_launcher),
    # 11. This process's place in the cluster, checked against the layout.
    Step("placement", layout.place_in_cluster, instead=layout.rank_zero),
    # 12. The process group's backend.
    Step("backend", backend.choose_backend, instead=backend.no_backend),
    # 13. The precision.
    Step("precision", precision.choose_precision, instead=precision.as_asked),
    # 14. The device mesh (model_parallel).
    Step("mesh", mesh.lay_out_mesh),
    # 14a. With the model's facts, an explicit strategy is checked to fit.
    Step("memory_check", memory.check_memory),
    # 15. sync_batchnorm.
    Step("sync_batchnorm", layout.check_sync_batchnorm),
    # 16. Where logged metrics live and are reduced.
    Step("metrics", metrics.place_metrics),
)
"""The recipe, in order (then `build_plan`, for `resolve`)."""


def resolve(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Plan:
    """The plan for `request` on `env`, or the first problem as a `TrainplanError`.

    Pure: the environment is always passed in (use `trainplan.resolve` to probe this machine). `rules` is the
    rule set decided from (a downstream framework passes its extension of `BUILTIN_RULES`). Being pure, it is
    memoised: resolving an equal request on an equal environment (and rule set) again returns the same plan from a
    bounded cache (`resolve_uncached` skips it). Errors are never cached.
    """
    given: tuple[object, object] = (request, env)
    if not isinstance(given[0], Request) or not isinstance(given[1], Environment):
        return resolve_uncached(request, env, rules)  # reports the wrong type as an InvalidRequest
    try:
        # `given` is no part of a request's equality, but which fields were written decides (an unwritten precision
        # takes the model's facts'), so it is part of the key
        return _resolve_cached(request, request.notes, request.given, env, rules, _types(request, env))
    except (TypeError, ValueError, RecursionError) as error:
        if isinstance(error, TrainplanError):
            raise  # a refusal (InvalidRequest is a ValueError too): raised once, never cached
        # Unhashable garbage in a field (a dict for `devices`, say), or a value whose repr cannot be made (an
        # integer past Python's digit limit, a structure nested too deep): resolve it without the cache, which
        # reports it as an InvalidRequest.
        return resolve_uncached(request, env, rules)


@functools.lru_cache(maxsize=1024)
def _resolve_cached(
    request: Request, notes: object, given: frozenset[str], env: Environment, rules: Rules, types: object
) -> Plan:
    return resolve_uncached(request, env, rules)


_REQUEST_VALUES = operator.attrgetter(*(field.name for field in attrs.fields(Request)))
_ENVIRONMENT_VALUES = operator.attrgetter(*(field.name for field in attrs.fields(Environment)))


def _types(request: Request, env: Environment) -> tuple[object, ...]:
    """The types of a request's and an environment's values, and of the items of those that hold several: part of
    the memo's key, because equal values of different types resolve differently (`devices=True` is refused while
    `devices=1` is not, yet `True == 1` and both hash alike).

    Kept for the last (request, environment) pair, by identity: both are immutable, so the same two objects have the
    same types (a framework resolving again passes the same two, and `probe()` returns the same environment while
    the facts are unchanged); this is most of a memoised call's cost."""
    last = _last_types[0] if _last_types else None
    if last is not None and last[0] is request and last[1] is env:
        return last[2]
    types = _types_of(request, env)
    _last_types[:] = [(request, env, types)]
    return types


_last_types: list[tuple[Request, Environment, tuple[object, ...]]] = []


def _types_of(request: Request, env: Environment) -> tuple[object, ...]:
    devices: object = request.devices
    options: object = request.strategy_options
    usable: object = env.usable_cuda_devices
    counts: object = env.device_counts
    return (
        tuple(map(type, _REQUEST_VALUES(request))),
        tuple(map(type, _ENVIRONMENT_VALUES(env))),
        tuple(map(type, devices)) if type(devices) is tuple else None,
        tuple(map(type, usable)) if type(usable) is tuple else None,
        tuple(map(type, counts.values())) if isinstance(counts, Mapping) and counts else None,  # True == 1: refused
        # Which options were written is not part of a record's value, but it decides: an explicit value a preset
        # contradicts is refused, a default is not; a degree written 'auto' takes the rest, the default one not.
        None if options is None else (repr(options), getattr(options, "given", None)),
        _record_types(request.model),  # ModelFacts(batch_size=True) is refused, batch_size=1 not: equal, alike hashed
        _record_types(request.memory_policy),  # MemoryPolicy(offload=1) is refused, offload=True not
    )


def _record_types(record: object) -> tuple[type, ...] | None:
    """The types of an attrs record's values (None for anything else: its own type is in the key already)."""
    kind = type(record)
    if not attrs.has(kind):
        return None
    return tuple(type(getattr(record, field.name)) for field in attrs.fields(kind))


def resolve_uncached(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Plan:
    """`resolve` without the memo: every call runs every step (for benchmarks of the cold path)."""
    draft = Draft(request=request, env=env, rules=rules, collecting=False)
    _run(draft)
    return build_plan(draft)


def check(request: Request, env: Environment, rules: Rules = BUILTIN_RULES) -> Iterator[TrainplanError]:
    """Every problem with `request` on `env` (empty when it resolves). `resolve` raises the first of them."""
    draft = Draft(request=request, env=env, rules=rules, collecting=True)
    _run(draft)
    yield from draft.problems


def _run(draft: Draft) -> None:
    """The steps in order, until one ends the run (`check`) or raises (`resolve`: its first problem)."""
    for step in STEPS:
        try:
            step.run(draft)
        except TrainplanError as problem:
            if not draft.collecting or step.instead is None:
                raise
            draft.problems.append(problem)
            step.instead(draft)
        if draft.ended:
            return


__all__ = ["STEPS", "Step", "check", "resolve", "resolve_uncached"]
