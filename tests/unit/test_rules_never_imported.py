"""A rule set is imported only when the caller names it (`--rules`, `load_rules`) or a launcher hands its own workers
the one its caller named; a plan's `rules` field, TRAINPLAN_PLAN and an inherited TRAINPLAN_RULES are compared with
what is loaded, never imported, and the current directory is never put ahead of `sys.path` (the red-team review,
round three, N2)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import trainplan as tp
from tests.downstream_rules import RULES
from trainplan import Environment, InvalidRequest, Plan, Request
from trainplan.effects.rules_loading import handed_rules, load_rules, loaded_rules, read_plan_text, rules_of
from trainplan.resolve import resolve
from trainplan.rules import LAUNCHED_MARKER, LAUNCHER_RULES_VARIABLE, PLAN_VARIABLE, RULES_VARIABLE

ZEN = "Beautiful is better than ugly"


def _plan_naming(reference: str) -> Plan:
    data: dict[str, Any] = resolve(Request(accelerator="cpu"), Environment(cpu_count=2)).to_dict()
    return Plan.from_dict({**data, "rules": reference})


def _plant(folder: Path, name: str) -> Path:
    """A module in `folder` that leaves a file behind when it is imported (and would be a rule set)."""
    marker = folder / f"{name}.imported"
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "import trainplan\nRULES = trainplan.BUILTIN_RULES.extend(name=__name__ + ':RULES')\n"
    )
    return marker


@pytest.fixture
def no_zen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "this", raising=False)


@pytest.mark.usefixtures("no_zen")
@pytest.mark.parametrize("call", ["runtime", "adapter", "rules_of", "read_plan_text"])
def test_a_plans_rules_field_is_never_imported(call: str, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan_naming("this:RULES")  # the standard library's module that prints the Zen of Python on import
    with pytest.raises(InvalidRequest) as refused:
        if call == "runtime":
            tp.runtime(plan)
        elif call == "adapter":
            tp.lightning_trainer_arguments(plan)
        elif call == "rules_of":
            rules_of(plan)
        else:
            read_plan_text(json.dumps(plan.to_dict()))
    assert ZEN not in capsys.readouterr().out and "this" not in sys.modules
    message = str(refused.value)
    assert "'this' is not imported in this process" in message and "give rules=this.RULES" in message


def test_a_plan_of_a_loaded_rule_set_runs_with_it_and_another_rule_set_is_refused() -> None:
    plan = _plan_naming("tests.downstream_rules:RULES")
    assert loaded_rules(plan.rules or "").reference == "tests.downstream_rules:RULES"
    assert read_plan_text(json.dumps(plan.to_dict()), rules=RULES).rules == "tests.downstream_rules:RULES"
    with pytest.raises(tp.PlanFormatError, match="read it with the rule set it names"):
        read_plan_text(json.dumps(plan.to_dict()), rules=RULES.extend(name="tests.downstream_rules:OTHER"))
    with pytest.raises(InvalidRequest, match=r"is nothing, not a trainplan\.Rules"):
        loaded_rules("tests.downstream_rules:NO_SUCH_NAME")


@pytest.mark.parametrize("how", [RULES_VARIABLE, PLAN_VARIABLE, f"{PLAN_VARIABLE} and {LAUNCHED_MARKER}"])
def test_a_module_planted_in_the_current_directory_is_never_imported_by_resolve(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _plant(tmp_path, "evilrules")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "evilrules", raising=False)
    path = list(sys.path)
    if how == RULES_VARIABLE:
        monkeypatch.setenv(RULES_VARIABLE, "evilrules:RULES")
    else:
        monkeypatch.setenv(PLAN_VARIABLE, json.dumps(_plan_naming("evilrules:RULES").to_dict()))
    if LAUNCHED_MARKER in how:
        for name, value in {LAUNCHED_MARKER: "trainplan launch", "RANK": "0", "LOCAL_RANK": "0"}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("MASTER_PORT", "29500")
        monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(InvalidRequest, match="'evilrules' is not imported in this process"):
        tp.resolve()
    assert not marker.exists() and "evilrules" not in sys.modules and sys.path == path


def test_a_launchers_hand_over_is_honoured_in_its_own_child_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _plant(tmp_path, "handedrules")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "handedrules", raising=False)
    for stale in (f"{os.getpid()} handedrules:RULES", "1 handedrules:RULES", "handedrules:RULES", ""):
        assert handed_rules({LAUNCHER_RULES_VARIABLE: stale}) is None
    assert not marker.exists() and "handedrules" not in sys.modules
    handed = handed_rules({LAUNCHER_RULES_VARIABLE: f"{os.getppid()} handedrules:RULES"})
    assert handed is not None and handed.reference == "handedrules:RULES" and marker.exists()
    assert handed_rules({}) is None


def test_the_current_directory_is_searched_after_sys_path_never_ahead_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed, here = tmp_path / "site", tmp_path / "cwd"
    installed.mkdir()
    here.mkdir()
    (installed / "probe_rules_mod.py").write_text("import trainplan\nRULES = trainplan.BUILTIN_RULES\n")
    shadow = _plant(here, "probe_rules_mod")
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.chdir(here)
    monkeypatch.delitem(sys.modules, "probe_rules_mod", raising=False)
    path = list(sys.path)
    assert load_rules("probe_rules_mod:RULES", from_working_directory=True) is tp.BUILTIN_RULES
    assert not shadow.exists() and sys.path == path
    only_here = _plant(here, "only_here_rules")
    monkeypatch.delitem(sys.modules, "only_here_rules", raising=False)
    assert load_rules("only_here_rules:RULES", from_working_directory=True).reference == "only_here_rules:RULES"
    assert only_here.exists() and sys.path == path  # found in the current directory, last
