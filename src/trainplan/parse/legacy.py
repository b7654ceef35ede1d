"""The deprecation bridge: old Trainer flags in, the modern `Request` out, with notes that teach it.

`Trainer(gpus=2, accelerator="ddp")`, `tpu_cores=8`, `num_processes=4, accelerator="ddp_cpu"`,
`plugins="ddp_sharded"`, `distributed_backend=`, `auto_select_gpus=`, `move_metrics_to_cpu=`, the RFC's
interim `training_type=` and the old precision spellings keep working during the deprecation period.
Each flag contributes *claims* (on the accelerator, the devices, the strategy, the precision, ...);
the mapping of old names is data (`rules.LEGACY_*`); claims that disagree are an `Incompatible`
error naming both flags, never a silent pick. Pure: nothing here probes the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from trainplan.parse import fields, normalise
from trainplan.rules import (
    ACCELERATOR_GROUPS,
    FAMILIES,
    HOST_METRICS_STORE,
    LEGACY_ACCELERATORS,
    LEGACY_CONFLICT_FIXES,
    LEGACY_DEVICE_FLAGS,
    LEGACY_PRECISION_PLUGINS,
    LEGACY_STRATEGIES,
    LEGACY_STRATEGY_FLAGS,
    OPTION_TYPES,
    RULES,
    STRATEGIES,
    UNSUPPORTED_ACCELERATORS,
    LegacyStrategy,
    RefusalId,
    lookup,
)
from trainplan.spec.errors import Incompatible, InvalidRequest, did_you_mean
from trainplan.spec.notes import Note
from trainplan.spec.options import StrategyOptions

MODERN_FLAGS: Final[tuple[str, ...]] = tuple(
    name
    for name in fields.REQUEST_FIELDS
    if name != "select_usable_gpus"  # the bridge's own output
)
LEGACY_FLAGS: Final[tuple[str, ...]] = (
    "gpus",
    "tpu_cores",
    "num_processes",
    "ipus",
    "hpus",
    "distributed_backend",
    "training_type",
    "plugins",
    "auto_select_gpus",
    "move_metrics_to_cpu",
    "amp_backend",
    "amp_level",
)


@attrs.define
class _Claims:
    """What each flag says, by topic: topic → [(flag spelling, value)]."""

    by_topic: dict[str, list[tuple[str, object, object]]] = attrs.field(factory=dict)
    notes: list[Note] = attrs.field(factory=list)
    select_usable_gpus: bool = False

    def claim(self, topic: str, flag: str, raw: object, value: object) -> None:
        """Record that `flag=raw` says `value` about `topic`."""
        self.by_topic.setdefault(topic, []).append((flag, raw, value))

    def note(self, flag: str, old: str, new: str, why: str) -> None:
        self.notes.append(Note(code=f"legacy-{flag}", level="deprecation", message=f"{old} → {new}: {why}"))


def _removed(values: Mapping[str, object], reason: str, fix: str) -> Incompatible:
    rule: RefusalId = "legacy-removed"  # its reason and fix are written here, for each old flag
    return Incompatible(values=values, rule=rule, reason=reason, fix=fix)


def _strategy_claim(claims: _Claims, flag: str, raw: object) -> None:
    if not isinstance(raw, str):
        raise InvalidRequest(
            field=flag, value=raw, reason="a strategy name is a string", allowed=tuple(LEGACY_STRATEGIES)
        )
    name = raw.strip().lower()
    legacy = LEGACY_STRATEGIES.get(name)
    if legacy is None:
        raise InvalidRequest(
            field=flag, value=raw, reason="it is not a strategy name", allowed=tuple(LEGACY_STRATEGIES)
        )
    if legacy.strategy is None:
        raise _removed({flag: raw}, legacy.reason, legacy.fix)
    claims.claim("strategy", flag, raw, legacy)
    if legacy.accelerator is not None:
        claims.claim("accelerator", flag, raw, legacy.accelerator)
    new = f"strategy={legacy.strategy!r}"
    if legacy.accelerator is not None:
        new = f"accelerator={legacy.accelerator!r}, {new}"
    if legacy.options:
        new += ", strategy_options=" + ", ".join(f"{key}={value!r}" for key, value in legacy.options.items())
    if flag == "strategy" and name == legacy.strategy:
        return  # a modern name in the modern flag: nothing to teach
    why = LEGACY_STRATEGY_FLAGS[flag]
    if legacy.differs:
        why += f"; what differs: {legacy.differs}"
    claims.note(flag, f"{flag}={raw!r}", new, why)


def _accelerator(claims: _Claims, raw: object) -> None:
    if isinstance(raw, str):
        name = raw.strip().lower()
        if name in LEGACY_ACCELERATORS:
            claims.claim("accelerator", "accelerator", raw, LEGACY_ACCELERATORS[name])
            return
        if name in UNSUPPORTED_ACCELERATORS:
            raise _removed(
                {"accelerator": raw},
                f"{UNSUPPORTED_ACCELERATORS[name]} are not hardware trainplan plans for",
                "Use accelerator='cuda', 'cpu', 'mps' or 'xla'",
            )
        if name in LEGACY_STRATEGIES:
            _strategy_claim(claims, "accelerator", raw)
            return
    claims.claim("accelerator", "accelerator", raw, normalise.accelerator(raw))


def _means_none(raw: object) -> bool:
    """gpus=0, "0", [] or (): none of the flag's devices. Compared by type first, so array-likes never compare
    element-wise."""
    if type(raw) is int:
        return raw == 0
    if isinstance(raw, str):
        return raw.strip() == "0"
    return isinstance(raw, (list, tuple)) and len(raw) == 0


def _device_flag(flag: str) -> Callable[[_Claims, object], None]:
    row = LEGACY_DEVICE_FLAGS[flag]
    accelerator, why, instead = row.accelerator, row.why, row.none_accelerator

    def handle(claims: _Claims, raw: object) -> None:
        if instead is not None and _means_none(raw):
            claims.claim("accelerator", flag, raw, instead)
            claims.note(flag, f"{flag}={raw!r}", f"accelerator={instead!r}", row.none_why)
            return
        devices = normalise.devices(raw)
        claims.claim("accelerator", flag, raw, accelerator)
        claims.claim("devices", flag, raw, devices)
        claims.note(flag, f"{flag}={raw!r}", f"accelerator={accelerator!r}, devices={devices_text(devices)}", why)

    return handle


def _unsupported(flag: str) -> Callable[[_Claims, object], None]:
    def handle(claims: _Claims, raw: object) -> None:
        hardware = UNSUPPORTED_ACCELERATORS[flag.removesuffix("s")]
        raise _removed({flag: raw}, f"{hardware} are not hardware trainplan plans for", f"Remove {flag}=")

    return handle


def _plugins(claims: _Claims, raw: object) -> None:
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    for item in items:
        if isinstance(item, str) and item.strip().lower() in LEGACY_PRECISION_PLUGINS:
            precision = LEGACY_PRECISION_PLUGINS[item.strip().lower()]
            claims.claim("precision", "plugins", item, precision)
            claims.note("plugins", f"plugins={item!r}", f"precision={precision!r}", "precision has its own flag")
        elif isinstance(item, str) and item.strip().lower() in LEGACY_STRATEGIES:
            _strategy_claim(claims, "plugins", item)
        else:
            raise InvalidRequest(
                field="plugins",
                value=item,
                reason="only strategy and precision plugins given by name can be translated",
                allowed=(*LEGACY_STRATEGIES, *LEGACY_PRECISION_PLUGINS),
            )


def _auto_select_gpus(claims: _Claims, raw: object) -> None:
    if normalise.flag("auto_select_gpus", raw):
        claims.select_usable_gpus = True
        claims.note(
            "auto_select_gpus",
            "auto_select_gpus=True",
            "devices=find_usable_cuda_devices(n)",
            "selecting GPUs another process does not hold is a probe, not a training flag; the function is fast, "
            "never initialises CUDA in the caller and names the busy GPUs (still honoured during the deprecation "
            "period)",
        )


def _move_metrics_to_cpu(claims: _Claims, raw: object) -> None:
    if normalise.flag("move_metrics_to_cpu", raw):
        claims.claim("metrics_store", "move_metrics_to_cpu", True, HOST_METRICS_STORE)
        claims.note(
            "move_metrics_to_cpu",
            "move_metrics_to_cpu=True",
            "metrics_store='cpu' (or store_on_cpu=True per metric)",
            "placement is per metric now; under NCCL, CPU-stored values move to the device for each reduction",
        )


def _amp_backend(claims: _Claims, raw: object) -> None:
    name = raw.strip().lower() if isinstance(raw, str) else raw
    if name == "native":
        claims.note(
            "amp_backend", "amp_backend='native'", "(nothing)", "native torch AMP is the only AMP; drop the flag"
        )
        return
    if name == "apex":
        raise _removed(
            {"amp_backend": raw},
            "NVIDIA apex AMP was removed in Lightning 2.0; torch's native AMP replaces it",
            "Use precision='16-mixed' (or 'bf16-mixed') and drop amp_backend",
        )
    raise InvalidRequest(field="amp_backend", value=raw, reason="it is not an AMP backend", allowed=("native", "apex"))


def _amp_level(claims: _Claims, raw: object) -> None:
    raise _removed(
        {"amp_level": raw},
        "amp_level configured NVIDIA apex AMP, which was removed in Lightning 2.0",
        "Drop amp_level and use precision='16-mixed' (or 'bf16-mixed')",
    )


def _modern(topic: str) -> Callable[[_Claims, object], None]:
    def handle(claims: _Claims, raw: object) -> None:
        claims.claim(topic, topic, raw, raw)

    return handle


_MODERN_HANDLERS: Final[Mapping[str, Callable[[_Claims, object], None]]] = {
    "accelerator": _accelerator,
    "strategy": lambda claims, raw: _strategy_claim(claims, "strategy", raw),
    "devices": lambda claims, raw: claims.claim("devices", "devices", raw, normalise.devices(raw)),
}
"""The modern flags that old flags also claim in their own terms; every other modern flag claims its field as given."""

_HANDLERS: Final[Mapping[str, Callable[[_Claims, object], None]]] = {
    **{flag: _MODERN_HANDLERS.get(flag, _modern(flag)) for flag in MODERN_FLAGS},
    **{flag: _device_flag(flag) for flag in LEGACY_DEVICE_FLAGS},
    "ipus": _unsupported("ipus"),
    "hpus": _unsupported("hpus"),
    "distributed_backend": lambda claims, raw: _strategy_claim(claims, "distributed_backend", raw),
    "training_type": lambda claims, raw: _strategy_claim(claims, "training_type", raw),
    "plugins": _plugins,
    "auto_select_gpus": _auto_select_gpus,
    "move_metrics_to_cpu": _move_metrics_to_cpu,
    "amp_backend": _amp_backend,
    "amp_level": _amp_level,
}
"""Each flag's translation; the order of this table is the order claims are made (and conflicts named)."""


def devices_text(devices: object) -> str:
    """`devices` as written in Python: a tuple of indices as the list a user writes."""
    return repr(list(devices)) if isinstance(devices, tuple) else repr(devices)


def _agree(topic: str, claims: list[tuple[str, object, object]], fix: str) -> object:
    """The one value the flags agree on for a topic, or `Incompatible` naming two that disagree."""
    first_flag, first_raw, chosen = claims[0]
    for flag, raw, value in claims[1:]:
        # Lightning refused a precision plugin beside a precision even when they agreed; so does the bridge.
        merged = None if topic == "precision" else _merge(topic, chosen, value)
        if merged is None:
            rule = lookup(RULES, "legacy-conflict", name="RULES")
            how = " (only one may)" if topic == "precision" else ", to different values"
            reason = rule.reason.format(
                first=f"{first_flag}={first_raw!r}", second=f"{flag}={raw!r}", what=topic.replace("_", " "), how=how
            )
            values = {first_flag: first_raw, flag: raw} if first_flag != flag else {first_flag: first_raw}
            raise Incompatible(values=values, rule="legacy-conflict", reason=reason, fix=rule.fix.format(fix=fix))
        chosen = merged
    return chosen


def _merge(topic: str, first: object, second: object) -> object | None:
    if topic == "accelerator" and isinstance(first, str) and isinstance(second, str):
        # A group (`gpu`) agrees with itself and with each accelerator of the group: the more precise one wins.
        if first in ACCELERATOR_GROUPS and (second == first or second in ACCELERATOR_GROUPS[first]):
            return second
        if second in ACCELERATOR_GROUPS and first in ACCELERATOR_GROUPS[second]:
            return first
    if topic == "strategy" and isinstance(first, LegacyStrategy) and isinstance(second, LegacyStrategy):
        same = (first.strategy, dict(first.options)) == (second.strategy, dict(second.options))
        return first if same else None
    if type(first) is type(second) and first == second:
        return first
    return None


if TYPE_CHECKING:  # the record's module calls in here; the parsers take its class (no import cycle)
    from trainplan.spec.request import Request


def from_legacy(record: type[Request], flags: Mapping[str, object]) -> Request:
    """See `Request.from_legacy`: the modern request (a `record`), with a deprecation note per old flag."""
    claims = _Claims()
    for flag in flags:
        if flag not in _HANDLERS:
            raise InvalidRequest(
                field="flag",
                value=flag,
                reason="it is not a Trainer flag trainplan knows, old or new",
                allowed=(*MODERN_FLAGS, *LEGACY_FLAGS),
                suggestion=did_you_mean(flag, (*MODERN_FLAGS, *LEGACY_FLAGS)),
            )
    for flag, handle in _HANDLERS.items():
        if flag in flags and flags[flag] is not None:
            handle(claims, flags[flag])
    topics = {
        topic: _agree(topic, values, LEGACY_CONFLICT_FIXES.get(topic, f"write {topic}= once"))
        for topic, values in claims.by_topic.items()
    }
    config: dict[str, object] = {
        key: value for key, value in topics.items() if key not in ("strategy", "strategy_options")
    }
    legacy = topics.get("strategy")
    options = topics.get("strategy_options")
    if isinstance(legacy, LegacyStrategy) and legacy.strategy is not None:
        config["strategy"] = legacy.strategy
        if legacy.options:
            if options is not None:
                raise Incompatible(
                    values={"strategy": legacy.strategy, "strategy_options": options},
                    rule="legacy-conflict",
                    reason=(
                        f"the old strategy name already sets {dict(legacy.options)}, "
                        "and strategy_options were given too"
                    ),
                    fix="Write strategy= with the modern name and put every option in strategy_options",
                )
            options = _options(legacy)
    if options is not None:
        config["strategy_options"] = options
    request = fields.request_from_config(record, config)
    return attrs.evolve(request, select_usable_gpus=claims.select_usable_gpus, notes=(*request.notes, *claims.notes))


def _options(legacy: LegacyStrategy) -> StrategyOptions:
    assert legacy.strategy is not None
    family = lookup(FAMILIES, lookup(STRATEGIES, legacy.strategy, name="STRATEGIES").family, name="FAMILIES")
    options_type = OPTION_TYPES[family.family]
    values: dict[str, Any] = dict(legacy.options)
    return options_type(**values)
