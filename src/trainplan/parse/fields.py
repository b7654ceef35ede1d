"""The request's fields as rows: one row per `Request` field says everything the code that handles fields reads.

A row names its field and holds its parsers: how a loose value is normalised (given the rule set, whose names it
may depend on), what a refused value becomes in `check`, the deprecation notes its spellings carry, how a config
file's spelling is read, how the field is written to and read from the JSON wire format, and its `trainplan plan`
flag. `Request.from_config`, resolve's field-by-field normalisation, the wire format (`plan_json`) and the CLI's
request flags loop over these rows and never name a field one by one.

Adding a field to `Request` is the record plus one row here, plus resolve's typed record of the normal fields
(`resolve.draft.Fields`); tests/unit/test_request_fields.py names each place and fails, naming it, when a field is
missing there.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from trainplan.parse import memory, normalise
from trainplan.parse.wire import (
    Reader,
    builtin_or_custom,
    options_from_dict,
    options_to_dict,
)
from trainplan.rules import BUILTIN_RULES, DEFAULT_PRECISION, Rules, option_checks
from trainplan.spec.errors import InvalidRequest, PlanFormatError, a_kind, did_you_mean
from trainplan.spec.names import (
    ACCELERATOR_FLAGS,
    BACKENDS,
    CLUSTER_FLAGS,
    CUSTOM_NAME,
    CUSTOM_PRECISION,
    METRICS_STORES,
    PRECISION_FLAGS,
    PRECISIONS,
    STRATEGY_FLAGS,
    StrategyFlag,
)
from trainplan.spec.notes import Note

if TYPE_CHECKING:  # the record's module calls in here; the parsers take its class (no import cycle)
    from trainplan.spec.request import Request

Normaliser = Callable[[object, Rules], object]
"""A field's value as a `Request` holds it → its normal form under a rule set, or `InvalidRequest`."""
ConfigReader = Callable[[object, Rules, Mapping[str, object]], object]
"""A field's value from a config file → its normal form, given the rule set and the fields read before it."""
NoteMaker = Callable[[object, object, Rules], tuple[Note, ...]]
"""The deprecation notes for a value as given: (the value, its normal form or `REFUSED`, the rule set) → notes."""

REFUSED: Final = object()
"""What a `NoteMaker` gets for the normal form of a value its normaliser refused."""

IN_RECORD_ORDER: Final = 100
"""The rank of a row that needs no other place in an order than its place in the record."""
LAST: Final = 200
"""The rank of a row that must come after every other (strategy options depend on the strategy)."""


@attrs.frozen
class Given:
    """A default that is the same under every rule set (a row's `default`)."""

    value: object

    def __call__(self, rules: Rules) -> object:
        return self.value


@attrs.frozen
class Plain:
    """A normaliser that needs no rule set: `function(value)`."""

    function: Callable[[object], object]

    def __call__(self, value: object, rules: Rules) -> object:
        return self.function(value)


@attrs.frozen
class Spelled:
    """A normaliser of names that depend on the rule set: `function(value, rules.<spellings>)`."""

    function: Callable[[object, Any], object]  # (value, the spellings map: each field's own key type)
    spellings: str  # the rule set's attribute: its names and aliases for the field

    def __call__(self, value: object, rules: Rules) -> object:
        return self.function(value, getattr(rules, self.spellings))


@attrs.frozen
class Loosely:
    """A config reader: a config file's spelling read first (`loose`), then the row's normaliser (`then`)."""

    loose: Callable[[object], object]
    then: Normaliser

    def __call__(self, value: object, rules: Rules, read: Mapping[str, object]) -> object:
        return self.then(self.loose(value), rules)


@attrs.frozen(kw_only=True)
class Flag:
    """A request field's `trainplan plan` (and `trainplan launch`) flag."""

    option: str
    help: str
    kind: Literal["value", "switch", "options"] = "value"
    """`value`: one string, normalised as a config value; `switch`: present or not; `options`: KEY=VALUE, repeated,
    read into the mapping a strategy's options record is filled from."""
    default: object = None
    metavar: str | None = None
    words: tuple[str, ...] = ()
    """The values a shell completes for a `value` flag (`trainplan completion`): the built-in names; none for free
    text such as devices."""

    @property
    def dest(self) -> str:
        """Where argparse keeps the flag's value (the option's name in snake case)."""
        return self.option.removeprefix("--").replace("-", "_")


@attrs.frozen(kw_only=True)
class RequestField:
    """One `Request` field: its name, its parsers both ways, its defaults and its flag."""

    name: str
    """The record's attribute; also the field's key in a config mapping and in the JSON wire format."""
    default: Callable[[Rules], object]
    """What a config without the key gives, and what a refused value becomes in `check` (which goes on)."""
    normalise: Normaliser
    """The value as a `Request` holds it → its normal form (resolve's field-by-field pass, `check`)."""
    from_config: ConfigReader | None = None
    """A config file's value → its normal form (`Request.from_config`); None: `normalise` as it is."""
    notes: NoteMaker | None = None
    """Deprecation notes for the spelling given (aliases the rule set notes), in `check` order."""
    config_notes: bool = True
    """Whether `Request.from_config` records the notes too, or only resolve does."""
    to_json: Callable[[object], object] = attrs.field(default=lambda value: value)
    """The normal value as plain JSON (`Plan.to_dict`'s `request`); by default the value itself (a name, a number, a
    bool or None)."""
    from_json: Callable[[Reader, str], object]
    """The field read back from JSON at its key; `PlanFormatError` names the bad path."""
    read_check: Callable[[object], object] | None = None
    """Checks a value read back in a plan as resolve would have made it (refuses with `InvalidRequest`); None: the
    JSON reader checked it already."""
    flag: Flag | None = None
    """The field's CLI flag; None: no flag sets it."""
    check_rank: int = IN_RECORD_ORDER
    """Where `check` reports the field's refusal (and adds its notes): by rank, then in record order."""
    config_rank: int = IN_RECORD_ORDER
    """Where `Request.from_config` reads the field (the first refusal is the one raised): by rank, then in record
    order (a row whose reader needs another field's normal value ranks after it)."""
    read_rank: int = IN_RECORD_ORDER
    """Where the JSON reader reads the field (the first bad path is the one raised): by rank, then in record order."""


# --------------------------------------------------------------------------------------------------
# Each field's parsers where a row needs more than a call of a normaliser.


def _default_precision(rules: Rules) -> object:
    return rules.default_precision


def _precision_notes(value: object, normal: object, rules: Rules) -> tuple[Note, ...]:
    return () if normal is REFUSED else normalise.precision_alias_notes(value, normal)  # type: ignore[arg-type]


def _accelerator_notes(value: object, normal: object, rules: Rules) -> tuple[Note, ...]:
    return normalise.accelerator_alias_notes(value, rules.accelerator_alias_notes)


def _strategy_notes(value: object, normal: object, rules: Rules) -> tuple[Note, ...]:
    return normalise.strategy_alias_notes(value, rules.strategy_alias_notes)


def _options_from_config(value: object, rules: Rules, read: Mapping[str, object]) -> object:
    strategy: StrategyFlag = read["strategy"]  # type: ignore[assignment]  # read before (config_rank)
    return normalise.options_from_config(strategy, value, rules)


def _devices_to_json(devices: object) -> object:
    return list(devices) if isinstance(devices, tuple) else devices


def _devices_from_json(read: Reader, key: str) -> object:
    raw_devices = read._get(key)
    if isinstance(raw_devices, list):
        return tuple(read.int_list(key))
    if isinstance(raw_devices, (int, str)) and not isinstance(raw_devices, bool):
        return raw_devices
    raise PlanFormatError(path=f"{read.path}.{key}", reason="expected an integer, a string or a list")


def _num_nodes_from_json(read: Reader, key: str) -> object:
    if read._get(key) == "auto":
        return "auto"
    return read.field(key, int)


def _flag_from_json(read: Reader, key: str) -> object:
    return read.field(key, bool)


def _accelerator_read_check(value: object) -> object:
    return builtin_or_custom(value, ACCELERATOR_FLAGS) or normalise.accelerator(value)


def _strategy_read_check(value: object) -> object:
    # A downstream strategy name was read as a CustomName already; a built-in spelling is checked here.
    return (
        value in STRATEGY_FLAGS
        or (isinstance(value, str) and CUSTOM_NAME.fullmatch(value))
        or normalise.strategy(value)
    )


def _precision_read_check(value: object) -> object:
    return builtin_or_custom(value, PRECISION_FLAGS, CUSTOM_PRECISION) or normalise.precision(value)


def _cluster_read_check(value: object) -> object:
    return builtin_or_custom(value, CLUSTER_FLAGS) or normalise.cluster(value)


def _backend_read_check(value: object) -> object:
    return builtin_or_custom(value, (*BACKENDS, None)) or normalise.backend(value)


def _switch(name: str) -> tuple[Normaliser, ConfigReader]:
    """A bool field's normaliser and config reader (`true`, `yes`, `1` ... read as bools from a config file)."""
    normaliser = Plain(functools.partial(normalise.flag, name))
    return normaliser, Loosely(normalise.loose_bool, normaliser)


_SYNC_BATCHNORM = _switch("sync_batchnorm")
_SELECT_USABLE_GPUS = _switch("select_usable_gpus")
_NUM_NODES = Plain(normalise.num_nodes)


# --------------------------------------------------------------------------------------------------
# The rows, in the record's order (the JSON keys, the CLI flags and the config keys allowed follow it).

REQUEST_FIELD_ROWS: Final[tuple[RequestField, ...]] = (
    RequestField(
        name="accelerator",
        default=Given("auto"),
        normalise=Spelled(normalise.accelerator_in, "accelerator_spellings"),
        notes=_accelerator_notes,
        config_notes=False,  # from_config has never noted `tpu`; resolve does (tests/unit/test_choices.py)
        from_json=lambda read, key: read.strategy(key, ACCELERATOR_FLAGS),
        read_check=_accelerator_read_check,
        flag=Flag(
            option="--accelerator",
            default="auto",
            help=f"one of {', '.join(ACCELERATOR_FLAGS)}",
            words=ACCELERATOR_FLAGS,
        ),
        check_rank=1,
        config_rank=3,
    ),
    RequestField(
        name="strategy",
        default=Given("auto"),
        normalise=Spelled(normalise.strategy_in, "strategy_spellings"),
        notes=_strategy_notes,
        from_json=lambda read, key: read.strategy(key, STRATEGY_FLAGS),
        read_check=_strategy_read_check,
        flag=Flag(
            option="--strategy",
            default="auto",
            help=f"e.g. {', '.join(STRATEGY_FLAGS[:6])}, ...",
            words=STRATEGY_FLAGS,
        ),
        check_rank=2,
        config_rank=0,  # first: the options read from a config file fill the strategy's record
    ),
    RequestField(
        name="devices",
        default=Given("auto"),
        normalise=Plain(normalise.devices),
        to_json=_devices_to_json,
        from_json=_devices_from_json,
        read_check=normalise.devices,
        flag=Flag(option="--devices", default="auto", help="a count, -1 (all), auto, or indices like 0,2"),
        check_rank=3,
        config_rank=1,
        read_rank=0,
    ),
    RequestField(
        name="num_nodes",
        default=Given("auto"),
        normalise=_NUM_NODES,
        from_config=Loosely(normalise.loose_number, _NUM_NODES),
        from_json=_num_nodes_from_json,
        read_check=normalise.num_nodes,
        flag=Flag(option="--num-nodes", default="auto", help="number of machines (auto: the job's, else 1)"),
    ),
    RequestField(
        name="precision",
        default=_default_precision,
        normalise=Spelled(normalise.precision_in, "precision_spellings"),
        notes=_precision_notes,
        from_json=lambda read, key: read.strategy(key, PRECISION_FLAGS, CUSTOM_PRECISION),
        read_check=_precision_read_check,
        flag=Flag(
            option="--precision",
            default=DEFAULT_PRECISION,
            help="e.g. 32-true, 16-mixed, bf16-mixed, 64-true",
            words=PRECISIONS,
        ),
        check_rank=0,
        config_rank=2,
    ),
    RequestField(
        name="process_group_backend",
        default=Given(None),
        normalise=Spelled(normalise.backend_in, "backend_spellings"),
        from_json=lambda read, key: read.optional_custom(key, BACKENDS),
        read_check=_backend_read_check,
        flag=Flag(option="--process-group-backend", help=f"one of {', '.join(BACKENDS)}", words=BACKENDS),
    ),
    RequestField(
        name="cluster",
        default=Given("auto"),
        normalise=Spelled(normalise.cluster_in, "cluster_spellings"),
        from_json=lambda read, key: read.strategy(key, CLUSTER_FLAGS),
        read_check=_cluster_read_check,
        flag=Flag(option="--cluster", default="auto", help=f"one of {', '.join(CLUSTER_FLAGS)}", words=CLUSTER_FLAGS),
    ),
    RequestField(
        name="metrics_store",
        default=Given("device"),
        normalise=Plain(normalise.metrics_store),
        from_json=lambda read, key: read.choice(key, METRICS_STORES),
        read_check=normalise.metrics_store,
        flag=Flag(
            option="--metrics-store",
            default="device",
            help=f"one of {', '.join(METRICS_STORES)}",
            words=METRICS_STORES,
        ),
    ),
    RequestField(
        name="sync_batchnorm",
        default=Given(False),
        normalise=_SYNC_BATCHNORM[0],
        from_config=_SYNC_BATCHNORM[1],
        from_json=_flag_from_json,
        flag=Flag(option="--sync-batchnorm", kind="switch", help="synchronise batch-norm statistics"),
    ),
    RequestField(
        name="strategy_options",
        default=Given(None),
        normalise=Spelled(option_checks.strategy_options, "options"),  # checked by the rule set's option rows
        from_config=_options_from_config,
        to_json=options_to_dict,  # type: ignore[arg-type]
        from_json=options_from_dict,
        # read back: checked against the rows of the plan's rule set (`plan_json`), not trainplan's alone
        flag=Flag(
            option="--strategy-option",
            kind="options",
            metavar="KEY=VALUE",
            help="a strategy option, e.g. find_unused_parameters=true, stage=3",
        ),
        check_rank=LAST,
        config_rank=LAST,
    ),
    RequestField(
        name="select_usable_gpus",
        default=Given(False),
        normalise=_SELECT_USABLE_GPUS[0],
        from_config=_SELECT_USABLE_GPUS[1],
        from_json=_flag_from_json,
        flag=Flag(
            option="--select-usable-gpus",
            kind="switch",
            help="take the GPUs no other process holds (the auto_select_gpus bridge)",
        ),
    ),
    RequestField(
        name="model",
        default=Given(None),
        normalise=Plain(memory.model_facts),
        to_json=memory.to_dict,
        from_json=memory.facts_from_json,
        read_check=memory.model_facts,
        # no flag: `trainplan fit` builds the facts from --params and a shape
    ),
    RequestField(
        name="memory_policy",
        default=Given(None),
        normalise=Plain(memory.memory_policy),
        to_json=memory.to_dict,
        from_json=memory.policy_from_json,
        read_check=memory.memory_policy,
    ),
)
"""One row per `Request` field but `notes` (the record's own bookkeeping, written and read by `plan_json`)."""

REQUEST_FIELDS: Final[tuple[str, ...]] = tuple(row.name for row in REQUEST_FIELD_ROWS)
"""The keys `Request.from_config` takes, in the record's order."""

IN_CHECK_ORDER: Final = tuple(sorted(REQUEST_FIELD_ROWS, key=operator.attrgetter("check_rank")))
IN_CONFIG_ORDER: Final = tuple(sorted(REQUEST_FIELD_ROWS, key=operator.attrgetter("config_rank")))
IN_READ_ORDER: Final = tuple(sorted(REQUEST_FIELD_ROWS, key=operator.attrgetter("read_rank")))


def request_from_config(record: type[Request], config: Mapping[str, object], rules: Rules | None = None) -> Request:
    """See `Request.from_config`: a `record` (the `Request` class) built from loose values."""
    rules = BUILTIN_RULES if rules is None else rules
    given: object = config
    if not isinstance(given, Mapping):
        raise InvalidRequest(
            field="config",
            value=config,
            reason=f"from_config takes a mapping of field names to values, not {a_kind(given)}",
            fix="Pass a dict, e.g. Request.from_config({'accelerator': 'cpu', 'devices': 2})",
        )
    unknown = [key for key in config if key not in REQUEST_FIELDS]
    if unknown:
        raise InvalidRequest(
            field="key",
            value=unknown[0],
            reason="it is not a field of Request",
            allowed=REQUEST_FIELDS,
            suggestion=did_you_mean(unknown[0], REQUEST_FIELDS),
        )
    raw: dict[str, object] = {}
    normal: dict[str, object] = {}
    for row in IN_CONFIG_ORDER:
        value = config[row.name] if row.name in config else row.default(rules)
        raw[row.name] = value
        if row.from_config is None:
            normal[row.name] = row.normalise(value, rules)
        else:
            normal[row.name] = row.from_config(value, rules, normal)
    notes = [
        note
        for row in IN_CHECK_ORDER
        if row.notes is not None and row.config_notes
        for note in row.notes(raw[row.name], normal[row.name], rules)
    ]
    # The config's keys are what was written (a default value included); every field is passed, normalised.
    return record(**normal, notes=tuple(notes), given=frozenset(config))  # type: ignore[arg-type]  # normalised rows
