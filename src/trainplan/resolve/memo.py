"""The memo's key: a request, an environment and a rule set are values, but equal values of different types resolve
differently, so the key carries their types too."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.rules import Rules
from trainplan.spec.environment import Environment
from trainplan.spec.request import Request


def memo_key(request: Request, env: Environment, rules: Rules) -> tuple[object, ...] | None:
    """The key `resolve` memoises a plan under, or None for a request it cannot key (resolved without the memo)."""
    try:
        key = (request, request.notes, env, rules, _type_signature(request, env))
        hash(key)
    except (TypeError, ValueError, RecursionError):
        # Unhashable garbage in a field (a dict for `devices`, say), or a value whose repr cannot be made (an
        # integer past Python's digit limit, a structure nested too deep): resolve it without the cache, which
        # reports it as an InvalidRequest. Only the key is tried here: a refusal (a ValueError too) is raised once.
        return None
    return key


def _type_signature(request: Request, env: Environment) -> tuple[object, ...]:
    """The types of the values in a request and an environment.

    Part of the memo's key because equal values of different types resolve differently: `devices=True`
    is refused while `devices=1` is not, yet `True == 1` and both hash alike.
    """
    raw: object = request.devices
    options: object = request.strategy_options
    usable: object = env.usable_cuda_devices
    counts: object = env.device_counts
    return (
        type(request.accelerator),
        type(request.strategy),
        type(raw),
        tuple(map(type, raw)) if isinstance(raw, tuple) else None,
        type(request.num_nodes),
        type(request.precision),
        type(request.process_group_backend),
        type(request.cluster),
        type(request.metrics_store),
        type(request.sync_batchnorm),
        type(request.select_usable_gpus),
        None if options is None else repr(options),
        # Which options were written is not part of a record's value, but it decides: an explicit value a preset
        # contradicts is refused, a default is not; a degree written 'auto' takes the rest, the default one not.
        getattr(options, "given", None),
        type(env.cuda_device_count),
        type(env.cuda_initialized),
        type(env.mps_available),
        type(env.xla_device_count),
        type(env.cpu_count),
        type(env.interactive),
        tuple(map(type, usable)) if isinstance(usable, tuple) else None,
        tuple(map(type, counts.values())) if isinstance(counts, Mapping) else None,  # True == 1, yet refused
    )


__all__ = ["memo_key"]
