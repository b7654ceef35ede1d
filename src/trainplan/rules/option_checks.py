"""The check of a strategy options record's values: what `Request.strategy_options` and a rule's preset must hold.

A record's fields are typed, but values arrive from untyped places (config files, JSON, another framework); each
refusal names the option, the value, why and what to write. Used by the parsers and by `Rules.extend` (a preset is
checked as a request's options are), so it lives with the records.
"""

from __future__ import annotations

from typing import Final

from trainplan.rules.job import MAX_WORLD_SIZE
from trainplan.rules.mesh import LIGHTNING_SIZES
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.options import (
    DEEPSPEED_STAGES,
    OFFLOAD_DEVICES,
    SHARDING_STRATEGIES,
    DDPOptions,
    DeepSpeedOptions,
    FSDPOptions,
    ModelParallelOptions,
    StrategyOptions,
)


def strategy_options(value: object) -> StrategyOptions | None:
    """None or one of the options records, with each option's value checked."""
    if value is None:
        return None
    if isinstance(value, ModelParallelOptions):
        _timeout(value.timeout_seconds)
        for dimension, degree in value.degrees.items():
            _degree(f"strategy_options.{dimension}", degree)
        for size in LIGHTNING_SIZES:
            lightning: object = getattr(value, size.argument)
            if lightning is not None:
                _degree(f"strategy_options.{size.argument}", lightning)
        return value
    if isinstance(value, DDPOptions):
        _timeout(value.timeout_seconds)
        for name in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view"):
            _bool(f"strategy_options.{name}", getattr(value, name))
        return value
    if isinstance(value, FSDPOptions):
        _bool("strategy_options.cpu_offload", value.cpu_offload)
        allowed = SHARDING_STRATEGIES
        if value.sharding_strategy not in allowed:
            raise InvalidRequest(
                field="strategy_options.sharding_strategy",
                value=value.sharding_strategy,
                reason="it is not an FSDP sharding strategy",
                allowed=allowed,
            )
        return value
    if isinstance(value, DeepSpeedOptions):
        if isinstance(value.stage, bool) or value.stage not in DEEPSPEED_STAGES:
            raise InvalidRequest(
                field="strategy_options.stage",
                value=value.stage,
                reason="ZeRO has stages 0 to 3",
                allowed=DEEPSPEED_STAGES,
            )
        _bool("strategy_options.offload_optimizer", value.offload_optimizer)
        _bool("strategy_options.offload_parameters", value.offload_parameters)
        if value.offload_device not in OFFLOAD_DEVICES:
            raise InvalidRequest(
                field="strategy_options.offload_device",
                value=value.offload_device,
                reason="DeepSpeed offloads to 'cpu' or 'nvme'",
                allowed=OFFLOAD_DEVICES,
            )
        return value
    raise InvalidRequest(
        field="strategy_options",
        value=value,
        reason=f"a {type(value).__name__} is not a strategy options record",
        fix="Pass DDPOptions(...), FSDPOptions(...), DeepSpeedOptions(...) or ModelParallelOptions(...), or None",
    )


def _timeout(value: object) -> None:
    _positive("strategy_options.timeout_seconds", value)
    if isinstance(value, int) and value > MAX_PROCESS_GROUP_TIMEOUT:
        raise InvalidRequest(
            field="strategy_options.timeout_seconds",
            value=value,
            reason=f"torch.distributed counts it in int32 milliseconds: at most {MAX_PROCESS_GROUP_TIMEOUT}",
            fix="Write a timeout in seconds up to about 24 days, e.g. timeout_seconds=1800",
        )


def _degree(field: str, value: object) -> None:
    """A parallel degree: a whole number of ranks from 1 to torch's rank limit, or "auto"."""
    if value == "auto" and isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD_SIZE:
        name = field.rsplit(".", maxsplit=1)[-1]
        raise InvalidRequest(
            field=field,
            value=value,
            reason=f"a parallel degree is a whole number of ranks from 1 to {MAX_WORLD_SIZE}, or 'auto'",
            fix=f"Write e.g. {name}=2, or {name}='auto' to take what the other degrees leave",
        )


def _bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidRequest(field=field, value=value, reason="it must be True or False", allowed=(True, False))


MAX_PROCESS_GROUP_TIMEOUT: Final[int] = (2**31 - 1) // 1000
"""Seconds: a process-group timeout travels as int32 milliseconds."""


def _positive(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            field=field,
            value=value,
            reason="it must be a positive integer",
            fix=f"Write e.g. {field.rsplit('.', maxsplit=1)[-1]}=1800",
        )
