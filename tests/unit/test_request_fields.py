"""A `Request` field is written in the record plus one row (`trainplan.parse.fields`), and in resolve's typed record
of the normal fields, each place named here.

`Request.from_config`, resolve's normalisation, the JSON wire format and the CLI's request flags loop over the rows;
the memo's key reads the type of every field of the record. Each place is checked field by field: a field missing
from one fails naming the place. A request class with one field more, written nowhere else, shows that every check
catches it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import trainplan as tp
from trainplan import BUILTIN_RULES, Environment, InvalidRequest, PlanFormatError, Request, cli
from trainplan.parse import fields
from trainplan.parse.plan_json import request_from_json_text, request_to_dict
from trainplan.resolve import check, pipeline
from trainplan.resolve.draft import Fields

BOOKKEEPING = ("notes", "given")
"""The record's own bookkeeping, not asked for: `notes` (carried from `from_legacy`) and `given` (the fields written,
which a launched worker reads). Neither has a row; `notes` travels through resolve's record, `given` does not."""
RECORD_FIELDS = tuple(field.name for field in attrs.fields(Request) if field.name != "given")
ROW_FIELDS = tuple(name for name in RECORD_FIELDS if name not in BOOKKEEPING)


class Stranger:
    """A value of a type no field takes."""

    def __repr__(self) -> str:
        return "Stranger()"


class OtherStranger:
    """Another such type: equal-looking values of two types must not share a memo entry."""

    def __repr__(self) -> str:
        return "OtherStranger()"


@attrs.frozen(kw_only=True)
class RequestWithANewField(Request):
    """What a contributor writes first: the record with one field more, and nothing else yet."""

    new_field: int = 0


def _with(record: type[Request], field: str, value: object) -> Request:
    """The record's default request with one field set to `value`, whatever its type (the record keeps it)."""
    values: dict[str, Any] = {field: value}
    return attrs.evolve(record(), **values)


Check = Callable[[type[Request], str], str | None]
"""(the request class, a field) → None when the place handles the field, else what is wrong there."""


def _row(record: type[Request], field: str) -> str | None:
    if field not in fields.REQUEST_FIELDS:
        return "it has no row in trainplan.parse.fields.REQUEST_FIELD_ROWS"
    return None


def _fields_record(record: type[Request], field: str) -> str | None:
    if field not in attrs.fields_dict(Fields):
        return "resolve.draft.Fields has no attribute for it"
    return None


def _memo_key(record: type[Request], field: str) -> str | None:
    """The memo's key tells the field's types apart (`True == 1`, yet `devices=True` is refused)."""
    env = Environment()
    one = pipeline._types(_with(record, field, Stranger()), env)
    other = pipeline._types(_with(record, field, OtherStranger()), env)
    if one == other:
        return f"resolve.pipeline._types (the memo's key) does not read the type of {field}"
    return None


PLACES: dict[str, tuple[Check, tuple[str, ...]]] = {
    "the row": (_row, ROW_FIELDS),
    "Fields": (_fields_record, RECORD_FIELDS),
    # The key holds the request's notes themselves (they are not part of its equality).
    "the memo's key": (_memo_key, ROW_FIELDS),
}
"""Every place a new `Request` field must still be written (besides the record), and the fields it covers."""

CASES = [(place, field) for place, (_, covered) in PLACES.items() for field in covered]


@pytest.mark.parametrize(("place", "field"), CASES, ids=[f"{place}-{field}" for place, field in CASES])
def test_every_field_is_written_in_every_place(place: str, field: str) -> None:
    checked, _ = PLACES[place]
    problem = checked(Request, field)
    assert problem is None, f"Request.{field} is missing from {place}: {problem}"


@pytest.mark.parametrize("place", PLACES)
def test_a_field_added_to_the_record_alone_is_caught_in_every_place(place: str) -> None:
    checked, _ = PLACES[place]
    problem = checked(RequestWithANewField, "new_field")
    assert problem is not None, f"{place} does not notice a Request field it lacks"


def test_the_rows_are_the_record_in_its_order() -> None:
    assert fields.REQUEST_FIELDS == ROW_FIELDS
    assert len({row.name for row in fields.REQUEST_FIELD_ROWS}) == len(fields.REQUEST_FIELD_ROWS)


def test_a_refused_field_takes_its_default_and_a_missing_key_gives_it() -> None:
    defaults = Request()
    for row in fields.REQUEST_FIELD_ROWS:
        assert row.default(BUILTIN_RULES) == getattr(defaults, row.name), row.name
    assert Request.from_config({}) == defaults


def test_check_reports_refused_fields_in_the_rows_check_order() -> None:
    request = Request(**dict.fromkeys(ROW_FIELDS, Stranger()))  # type: ignore[arg-type]
    reported = [error.field for error in check(request, Environment()) if isinstance(error, InvalidRequest)]
    assert reported[: len(ROW_FIELDS)] == [row.name for row in fields.IN_CHECK_ORDER]
    assert reported[: len(ROW_FIELDS)] == [
        "precision",
        "accelerator",
        "strategy",
        "devices",
        "num_nodes",
        "process_group_backend",
        "cluster",
        "metrics_store",
        "sync_batchnorm",
        "select_usable_gpus",
        "model",
        "memory_policy",
        "strategy_options",
    ]


def test_from_config_raises_the_first_refusal_in_the_rows_config_order() -> None:
    config: dict[str, object] = dict.fromkeys(ROW_FIELDS, Stranger())
    raised = []
    for _ in ROW_FIELDS:
        with pytest.raises(InvalidRequest) as caught:
            Request.from_config(config)
        raised.append(caught.value.field)
        del config[caught.value.field]
    assert raised == [row.name for row in fields.IN_CONFIG_ORDER]
    assert raised[:4] == ["strategy", "devices", "precision", "accelerator"]
    assert raised[-1] == "strategy_options"  # read with the strategy it fills


def test_the_wire_format_writes_each_row_and_reads_it_in_the_rows_read_order() -> None:
    written = request_to_dict(Request())
    assert list(written) == [*ROW_FIELDS, "notes"]
    assert request_from_json_text(json.dumps(written)) == Request()
    given: dict[str, object] = {"notes": []}
    missing = []
    for _ in ROW_FIELDS:
        with pytest.raises(PlanFormatError) as caught:
            request_from_json_text(json.dumps(given))
        key = caught.value.path.removeprefix("request.")
        missing.append(key)
        given[key] = written[key]
    assert missing == [row.name for row in fields.IN_READ_ORDER]
    assert missing[0] == "devices"


def test_the_cli_request_flags_are_the_rows_flags() -> None:
    parser = cli._parser()
    commands = next(action for action in parser._actions if action.dest == "command")
    plan = commands.choices["plan"]  # type: ignore[index]
    group = next(group for group in plan._action_groups if group.title == "request (mirrors trainplan.Request)")
    options = [action.option_strings[0] for action in group._group_actions]
    assert options == [row.flag.option for row in fields.REQUEST_FIELD_ROWS if row.flag is not None]
    flagged = {row.flag.dest: row.name for row in fields.REQUEST_FIELD_ROWS if row.flag is not None}
    # every field has a flag today but the memory records, which `trainplan fit` builds from its own flags
    assert set(flagged.values()) == set(ROW_FIELDS) - {"model", "memory_policy"}


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda n: tp.Request(devices=n(2)), "devices"),
        (lambda n: tp.Request(devices=[n(0), n(1)]), "devices"),
        (lambda n: tp.Request(num_nodes=n(1)), "num_nodes"),
        (
            lambda n: tp.Request(
                model=attrs.evolve(tp.transformer_facts(parameters=7e9), parameter_count=n(7 * 10**9))
            ),
            "model.parameter_count",
        ),
        (
            lambda n: tp.Request(model=attrs.evolve(tp.transformer_facts(parameters=7e9), batch_size=n(2))),
            "model.batch_size",
        ),
    ],
)
def test_a_numpy_integer_is_refused_naming_int(
    build: Callable[[Callable[[int], object]], tp.Request], field: str
) -> None:
    """Counts are Python ints in every field of a request (as JSON and the plan hold them); numpy's int64 was refused
    as 'a int64 is not a device selection' or 'it must be a whole number from 1 to ...', which it is."""
    numpy = pytest.importorskip("numpy")
    env = tp.Environment(cuda_device_count=8, cuda_memory_bytes=(40 << 30,) * 8)
    with pytest.raises(tp.InvalidRequest) as refused:
        tp.resolve(build(numpy.int64), env)
    assert refused.value.field == field
    assert "numpy.int64 is not a Python int: write int(x)" in str(refused.value)


def test_transformer_facts_names_int_for_a_numpy_count() -> None:
    numpy = pytest.importorskip("numpy")
    with pytest.raises(tp.InvalidRequest, match=r"numpy\.int64 is not a Python int: write int\(x\)"):
        tp.transformer_facts(parameters=7e9, layers=numpy.int64(32))
