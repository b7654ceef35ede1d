"""Flags are never dropped: inside a worker of trainplan's launchers, a script's own `Request` takes the launch's
choices (strategy, precision, options, backend, ...) where it leaves a field at its default, and a field it sets
otherwise keeps the script's value with a warning naming both (on every rank: every worker resolves)."""

from __future__ import annotations

import os
import warnings

import pytest

import trainplan as tp
from tests.helpers import cpu
from trainplan import DDPOptions, FSDPOptions, Request
from trainplan.mapping.workers import with_launch_choices, worker_environment
from trainplan.resolve import resolve

LAUNCHED = Request(
    accelerator="cpu",
    strategy="ddp",
    devices=2,
    precision="bf16-mixed",
    strategy_options=DDPOptions(find_unused_parameters=True, timeout_seconds=5),
)


def _in_worker(monkeypatch: pytest.MonkeyPatch, launched: Request = LAUNCHED, rank: int = 1) -> None:
    """This process as worker `rank` of a `trainplan launch` of `launched` (its real variables)."""
    plan = resolve(launched, cpu())
    variables = worker_environment(
        plan, local_rank=rank, main_port=29400, visible_devices=None, visible_count=0, launcher="trainplan launch"
    )
    for key in list(os.environ):
        if key.startswith(("TRAINPLAN_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)


def test_a_request_that_leaves_the_choices_takes_the_launchs(monkeypatch: pytest.MonkeyPatch) -> None:
    _in_worker(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.TrainplanWarning)
        plan = tp.resolve(Request(accelerator="cpu"))
    assert plan.precision == "bf16-mixed" and plan.strategy.name == "ddp"
    assert plan.request.strategy_options == LAUNCHED.strategy_options
    assert plan.world_size == 2 and plan.cluster.global_rank == 1
    assert not [note for note in plan.notes if note.code == "launch-choice-overridden"]


def test_a_field_the_script_sets_otherwise_is_the_scripts_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _in_worker(monkeypatch)
    with pytest.warns(tp.TrainplanWarning, match=r"launch chose precision='bf16-mixed' \(--precision\).*'64-true'"):
        plan = tp.resolve(Request(precision="64-true"))
    assert plan.precision == "64-true"
    # What it left still comes from the launch.
    assert plan.request.strategy_options == LAUNCHED.strategy_options
    (note,) = [note for note in plan.notes if note.code == "launch-choice-overridden"]
    assert note.level == "warning" and "Leave precision out of the Request" in note.message


def test_options_travel_with_their_strategy_only() -> None:
    """Options the launch chose for another strategy than the script's are not applied, and a warning says so
    (they were dropped without a word)."""
    script = with_launch_choices(Request(strategy="fsdp"), LAUNCHED)
    assert script.strategy == "fsdp" and script.strategy_options is None
    assert [note.code for note in script.notes] == ["launch-choice-overridden"] * 2
    assert "strategy_options=" in script.notes[1].message and "were not applied" in script.notes[1].message
    launched = Request(strategy="ddp_find_unused_parameters_true", strategy_options=DDPOptions(timeout_seconds=5))
    for mine in (Request(strategy="ddp"), Request(strategy="ddp", strategy_options=DDPOptions(timeout_seconds=1800))):
        kept = with_launch_choices(mine, launched)
        assert kept.strategy_options == mine.strategy_options
        (dropped,) = [note for note in kept.notes if "strategy_options=" in note.message]
        assert "timeout_seconds=5" in dropped.message and "Launch with --strategy ddp" in dropped.message
    own = with_launch_choices(Request(strategy_options=DDPOptions(timeout_seconds=9)), LAUNCHED)
    assert own.strategy == "ddp" and own.strategy_options == DDPOptions(timeout_seconds=9)
    assert "timeout_seconds=9" in own.notes[0].message


def test_nothing_changes_outside_a_launch_or_for_the_launchs_defaults() -> None:
    assert with_launch_choices(Request(precision="16-mixed"), Request()) == Request(precision="16-mixed")
    same = Request(strategy="fsdp", strategy_options=FSDPOptions(cpu_offload=True))
    assert with_launch_choices(same, same) is same
    assert tp.resolve(Request(accelerator="cpu"), cpu()).precision == "32-true"


def test_the_banner_names_what_the_script_is_given() -> None:
    from trainplan.mapping.workers import launch_choices_line

    line = launch_choices_line(LAUNCHED)
    assert line is not None and "precision='bf16-mixed'" in line and "timeout_seconds=5" in line
    assert "a field it sets otherwise keeps its own, with a warning" in line
    assert launch_choices_line(Request(devices=2)) is None


def test_a_flag_written_at_its_default_is_a_choice_too() -> None:
    from trainplan.mapping.workers import launch_choices_line

    launched = Request(accelerator="cpu", devices=2)  # `--precision 32-true --metrics-store device` written
    written = frozenset({"precision", "metrics_store"})
    script = with_launch_choices(Request(precision="bf16-mixed", metrics_store="cpu"), launched, written)
    assert (script.precision, script.metrics_store) == ("bf16-mixed", "cpu"), "the script's own values run"
    assert [note.code for note in script.notes] == ["launch-choice-overridden"] * 2
    line = launch_choices_line(launched, written)
    assert line is not None and "precision='32-true'" in line and "metrics_store='device'" in line


def test_the_written_fields_are_read_from_the_flags_before_the_script() -> None:
    from trainplan.cli import _parser, _written_fields

    words = ["launch", "--precision=32-true", "--metrics-store", "device", "x.py", "--strategy", "fsdp"]
    arguments = _parser().parse_args(words)
    arguments.words = words
    assert _written_fields(arguments) == ["precision", "metrics_store"], "the script's own --strategy is its own"


def test_a_spawn_strategy_runs_as_the_launchs_with_its_options() -> None:
    script = with_launch_choices(Request(strategy="ddp_spawn"), LAUNCHED)
    assert script.strategy == "ddp" and script.strategy_options == LAUNCHED.strategy_options
    assert not script.notes, "ddp_spawn runs as ddp under a launcher: the same choice as the launch's"


def test_a_default_the_script_writes_is_written_and_kept_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Request(precision="32-true")` under `trainplan launch --precision bf16-mixed` ran bf16-mixed with no word:
    a field written at its default value counted as left. It is the script's, with the warning on every rank."""
    _in_worker(monkeypatch)
    with pytest.warns(tp.TrainplanWarning, match=r"launch chose precision='bf16-mixed' \(--precision\).*'32-true'"):
        plan = tp.resolve(Request(accelerator="cpu", precision="32-true"))
    assert plan.precision == "32-true"
    assert plan.request.strategy_options == LAUNCHED.strategy_options  # what it left still comes from the launch
    written = with_launch_choices(Request(strategy="auto", strategy_options=None), LAUNCHED)
    assert (written.strategy, written.strategy_options) == ("auto", None)
    note, options = written.notes  # the options travel with the launch's strategy, which the script does not run
    assert note.code == "launch-choice-overridden" and "sets strategy='auto'" in note.message
    assert options.code == "launch-choice-overridden" and "options were not applied" in options.message


def test_a_request_records_the_fields_written_and_keeps_them_through_evolve() -> None:
    import attrs

    assert Request().given == frozenset() and Request(precision="32-true").given == {"precision"}
    assert Request(precision="32-true") == Request()  # what it asks for is the same: only a launch tells them apart
    assert attrs.evolve(Request(precision="32-true"), devices=2).given == {"precision"}
    assert Request.from_config({"precision": "32", "devices": 2}).given == {"precision", "devices"}
    assert "given" not in repr(Request(precision="32-true"))
