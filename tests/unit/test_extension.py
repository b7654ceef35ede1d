"""Extension as values: a downstream rule set adds strategies and replaces rows without touching the built-in one."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.downstream_rules import BUCKET_CAP, CHECKPOINT_IO, CHECKPOINT_IO_NOTEBOOK, RULES, STATIC_DEEPSPEED
from tests.helpers import LAUNCHED_1_OF_2, cpu
from trainplan import (
    BUILTIN_RULES,
    CustomName,
    DDPOptions,
    Environment,
    Incompatible,
    InvalidRequest,
    Plan,
    PlanFormatError,
    Request,
    Rules,
    StrategyRule,
)
from trainplan.cli import main
from trainplan.effects.rules_loading import read_plan_text
from trainplan.mapping.frameworks import accelerate_arguments, lightning_arguments, option_keywords
from trainplan.parse.plan_json import plan_from_json_text
from trainplan.resolve import check, resolve, resolve_uncached
from trainplan.rules import (
    UNNAMED_RULES,
    Carried,
    Keyword,
    Needs,
    OptionRow,
    ProcessGroupTimeout,
    Refused,
    ThroughMesh,
)


def test_a_downstream_strategy_resolves_with_its_preset_and_launcher() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2, strategy=CHECKPOINT_IO), cpu(), RULES)
    assert (plan.strategy.name, plan.strategy.family, plan.launcher) == (CHECKPOINT_IO, "ddp", "subprocess")
    assert plan.strategy.options == DDPOptions(static_graph=True, given=[])  # the preset's value; nothing written


def test_a_rule_set_names_its_own_strategies_and_lists_them_for_one_it_lacks() -> None:
    assert RULES.strategy_name("ddp_custom_checkpoint_io") == CHECKPOINT_IO
    assert RULES.strategy_name("ddp") == "ddp"
    for rules, name in ((BUILTIN_RULES, "ddp_custom_checkpoint_io"), (RULES, "auto"), (RULES, "nowhere")):
        with pytest.raises(InvalidRequest, match=f"strategy='{name}' is not accepted: this rule set has no such"):
            rules.strategy_name(name)
    with pytest.raises(InvalidRequest) as caught:
        BUILTIN_RULES.strategy_name("ddp_custom_checkpoint_io")
    assert caught.value.allowed == tuple(BUILTIN_RULES.strategies)
    assert CHECKPOINT_IO not in caught.value.allowed


def test_the_builtin_rule_set_refuses_the_downstream_name_and_is_unchanged() -> None:
    with pytest.raises(InvalidRequest, match="strategy='ddp_custom_checkpoint_io'"):
        resolve(Request(accelerator="cpu", devices=2, strategy=CHECKPOINT_IO), cpu())
    assert CHECKPOINT_IO not in BUILTIN_RULES.strategies
    assert "cpu" not in BUILTIN_RULES.families["deepspeed"].accelerators


def test_the_memo_keeps_rule_sets_apart() -> None:
    request, env = Request(accelerator="cpu", devices=2, strategy="deepspeed"), cpu(packages=frozenset({"deepspeed"}))
    assert resolve(request, env, RULES).strategy.name == "deepspeed"
    with pytest.raises(Incompatible, match="strategy 'deepspeed' runs on 'cuda'"):
        resolve(request, env)


def test_a_replaced_family_row_and_a_downstream_preset_of_it() -> None:
    env = cpu(packages=frozenset({"deepspeed"}))
    plan = resolve_uncached(Request(accelerator="cpu", devices=2, strategy=STATIC_DEEPSPEED), env, RULES)
    assert plan.strategy.family == "deepspeed" and plan.strategy.options is not None
    assert attrs.asdict(plan.strategy.options)["stage"] == 1


def test_counterparts_of_a_downstream_strategy() -> None:
    """Its fork counterpart in a notebook; its script counterpart inside a started job."""
    notebook = Environment(cpu_count=4, interactive=True)
    with pytest.raises(Incompatible, match=f"strategy={CHECKPOINT_IO_NOTEBOOK!r}"):
        resolve(Request(accelerator="cpu", devices=2, strategy=CHECKPOINT_IO), notebook, RULES)
    inside = resolve(Request(strategy=CHECKPOINT_IO_NOTEBOOK, accelerator="cpu"), cpu(variables=LAUNCHED_1_OF_2), RULES)
    assert (inside.strategy.name, inside.launcher) == (CHECKPOINT_IO, "external")


def test_check_takes_the_rule_set() -> None:
    assert list(check(Request(accelerator="cpu", devices=2, strategy=CHECKPOINT_IO), cpu(), RULES)) == []


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (StrategyRule(name=CustomName("ddp"), family="ddp", launcher="subprocess"), "already has a strategy"),
        (StrategyRule(name=CustomName("tpu"), family="xla", launcher="xla"), "already has a strategy"),
        (StrategyRule(name=CustomName("Bad Name"), family="ddp", launcher="subprocess"), "lowercase letters"),
        (StrategyRule(name=CustomName("mine"), family="ddp", launcher="subprocess", preset={"stage": 1}), "no such"),
    ],
)
def test_extend_refuses_what_cannot_work(rule: StrategyRule, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        BUILTIN_RULES.extend(strategies=[rule])


def test_extend_refuses_an_unknown_counterpart() -> None:
    with pytest.raises(InvalidRequest, match="counterpart"):
        BUILTIN_RULES.extend(script_counterparts={CustomName("nowhere"): "ddp"})


def test_from_config_and_the_cli_take_the_rule_set(capsys: pytest.CaptureFixture[str]) -> None:
    request = Request.from_config({"strategy": "DDP_CUSTOM_CHECKPOINT_IO", "accelerator": "cpu"}, RULES)
    assert request.strategy == CHECKPOINT_IO
    arguments = ["plan", "--no-probe", "--accelerator", "cpu", "--devices", "2", "--strategy", CHECKPOINT_IO]
    assert main([*arguments, "--rules", "tests.downstream_rules:RULES"]) == 0
    assert "ddp_custom_checkpoint_io (family ddp)" in capsys.readouterr().out
    assert main(["matrix", "--rules", "tests.downstream_rules:RULES"]) == 0
    assert "`ddp_custom_checkpoint_io`" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spelled", "words"),
    [
        ("tests.downstream_rules", "Write MODULE:NAME"),
        ("tests.no_such_module:RULES", "cannot import"),
        ("tests.downstream_rules:CHECKPOINT_IO", "not a trainplan.Rules"),
    ],
)
def test_the_cli_names_a_bad_rules_option(spelled: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["matrix", "--rules", spelled])
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(("alias", "name"), [("single_tpu", "single_xla"), ("xla_debug", "xla")])
def test_lightnings_still_registered_names_are_aliases_with_a_note(alias: str, name: str) -> None:
    env = Environment(xla_device_count=4 if name == "xla" else 1)
    request = Request.from_config({"strategy": alias, "accelerator": "xla"})
    plan = resolve(request, env)
    assert plan.strategy.name == name
    assert any(note.code == "strategy-alias" and alias in note.message for note in plan.notes)
    direct = resolve(Request(strategy=alias, accelerator="xla"), env)  # type: ignore[arg-type]  # a loose spelling
    assert any(note.code == "strategy-alias" for note in direct.notes)


DEEPSPEED_ON_CPU = Request(accelerator="cpu", devices=2, strategy=STATIC_DEEPSPEED)


def _deepspeed_on_cpu(rules: Rules = RULES) -> Plan:
    return resolve_uncached(DEEPSPEED_ON_CPU, cpu(packages=frozenset({"deepspeed"})), rules)


def test_a_plan_of_a_downstream_rule_set_reads_back_and_names_its_rules() -> None:
    """A replaced family row (DeepSpeed on CPU) is no reason to refuse the plan a worker reads back."""
    plan = _deepspeed_on_cpu()
    assert plan.rules == "tests.downstream_rules:RULES"
    text = json.dumps(plan.to_dict())
    assert plan_from_json_text(text) == plan  # as far as its own facts go
    assert plan_from_json_text(text, RULES) == plan
    assert read_plan_text(text) == plan  # the worker's way: the recorded rule set imported
    with pytest.raises(PlanFormatError, match=r"plan\.rules"):
        plan_from_json_text(text, BUILTIN_RULES)


def test_a_plan_of_trainplans_own_rules_records_none_and_is_checked_against_them() -> None:
    plan = resolve_uncached(Request(accelerator="cpu", devices=2, strategy="ddp"), cpu())
    assert plan.rules is None and "rules" not in plan.to_dict()
    forged = {**_deepspeed_on_cpu().to_dict()}
    del forged["rules"]  # the same DeepSpeed-on-CPU plan claiming to come from the built-in rules
    with pytest.raises(PlanFormatError, match="does not run on 'cpu'"):
        Plan.from_dict(forged)


def test_an_unnamed_rule_set_relaxes_only_the_rows_it_may_replace() -> None:
    unnamed = BUILTIN_RULES.extend(families=[RULES.families["deepspeed"]])
    plan = resolve_uncached(
        Request(accelerator="cpu", devices=2, strategy="deepspeed"), cpu(packages=frozenset({"deepspeed"})), unnamed
    )
    assert plan.rules == UNNAMED_RULES
    assert read_plan_text(json.dumps(plan.to_dict())) == plan
    broken = {**plan.to_dict(), "world_size": 3}
    with pytest.raises(PlanFormatError, match="world_size"):
        Plan.from_dict(broken)
    with pytest.raises(PlanFormatError, match="process_group_backend"):
        Plan.from_dict({**plan.to_dict(), "process_group_backend": "nccl"})  # backends are never replaced


def test_extend_refuses_a_name_that_is_no_reference() -> None:
    with pytest.raises(InvalidRequest, match=r"rules\.name"):
        BUILTIN_RULES.extend(name="not a module")


def test_a_refused_request_is_refused_once() -> None:
    """The memo tries only its key: a refusal (a ValueError) is not caught and resolved a second time."""
    with pytest.raises(Incompatible) as refused:
        resolve(Request(accelerator="cpu", devices=2, strategy="deepspeed"), cpu(packages=frozenset({"deepspeed"})))
    assert refused.value.__context__ is None and refused.value.__cause__ is None


@pytest.mark.parametrize("rules", [None, "tests.downstream_rules:RULES", {}])
def test_resolve_and_check_refuse_what_is_not_a_rule_set(rules: object) -> None:
    request = Request(accelerator="cpu")
    with pytest.raises(InvalidRequest, match=r"takes a trainplan\.Rules"):
        resolve(request, cpu(), rules)  # type: ignore[arg-type]
    problems = list(check(request, cpu(), rules))  # type: ignore[arg-type]
    assert [type(problem) for problem in problems] == [InvalidRequest]


def test_a_rule_set_cannot_be_changed_in_place() -> None:
    """Tables are read-only: the memo and the cold path can never disagree about what a rule set says."""
    ddp = BUILTIN_RULES.families["ddp"]
    for table in (BUILTIN_RULES.families, BUILTIN_RULES.strategies, RULES.precisions, RULES.strategy_spellings):
        with pytest.raises(TypeError):
            table["ddp"] = ddp  # type: ignore[index]
    with pytest.raises(TypeError):
        del BUILTIN_RULES.launchers["spawn"]  # type: ignore[attr-defined]


def test_the_cli_imports_rules_from_the_working_directory_and_names_a_module_that_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `python -m` would: a console script finds the project's module; one that raises is a clean error (rc 2)."""
    (tmp_path / "cwd_rules_for_trainplan.py").write_text(
        "from trainplan import BUILTIN_RULES\nRULES = BUILTIN_RULES.extend()\n"
    )
    (tmp_path / "raising_rules_for_trainplan.py").write_text("raise RuntimeError('no licence server')\n")
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    assert main(["matrix", "--rules", "cwd_rules_for_trainplan:RULES"]) == 0
    assert sys.path == path_before, "the working directory is on sys.path for that import only"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["matrix", "--rules", "raising_rules_for_trainplan:RULES"])
    error = capsys.readouterr().err
    assert exited.value.code == 2
    assert "cannot import 'raising_rules_for_trainplan' (RuntimeError: no licence server)" in error
    assert "Traceback" not in error


@pytest.mark.parametrize("code", [0, 3, "done"])
def test_a_rules_module_that_exits_on_import_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: object
) -> None:
    """A module whose top level calls sys.exit(0) (a script without its __main__ guard) made `--rules` exit 0 with
    nothing printed, as if the command had succeeded."""
    name = f"exiting_rules_for_trainplan_{abs(hash(code))}"
    (tmp_path / f"{name}.py").write_text(f"import sys\nsys.exit({code!r})\n")
    monkeypatch.chdir(tmp_path)
    for arguments in (["matrix"], ["plan", "--no-probe"]):
        with pytest.raises(SystemExit) as exited:
            main([*arguments, "--rules", f"{name}:RULES"])
        error = capsys.readouterr().err
        assert exited.value.code == 2, error
        assert f"importing {name!r} called sys.exit({code!r})" in error and '__name__ == "__main__"' in error


def _mine(family: str = "ddp", launcher: str = "subprocess", **preset: object) -> StrategyRule:
    return StrategyRule(name=CustomName("mine"), family=family, launcher=launcher, preset=preset)  # type: ignore[arg-type]


PRECISION_32 = BUILTIN_RULES.precisions["32-true"]
PRECISION_16 = BUILTIN_RULES.precisions["16-mixed"]
NPU: frozenset[Any] = frozenset({"cpu", "npu"})  # an accelerator no rule set has


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"strategies": [_mine(), _mine()]}, "two rows of one call"),
        ({"families": [BUILTIN_RULES.families["ddp"]] * 2}, "two rows of one call"),
        ({"strategies": [_mine(static_graph="yes")]}, "static_graph"),
        ({"strategies": [_mine(timeout_seconds=-5)]}, "positive integer"),
        ({"strategies": [_mine(launcher="none")]}, "does not run under it"),
        ({"strategies": [_mine(launcher="xla")]}, "does not run under it"),
        ({"strategies": [_mine(family="dp", launcher="spawn")]}, "does not run under it"),
        ({"strategies": [_mine(family="single_device", launcher="fork")]}, "does not run under it"),
        ({"script_counterparts": {"ddp_spawn": "fsdp"}}, "runs the same family"),
        ({"fork_counterparts": {"ddp": "ddp_spawn"}}, "a notebook cannot run either"),
        ({"spawn_counterparts": {"ddp_fork": "ddp_notebook"}}, "forks too"),
        ({"script_counterparts": {"ddp_fork": "ddp_spawn"}}, "starts its processes itself"),
        ({"precisions": [attrs.evolve(PRECISION_16, fallback_why={})]}, "a fallback says why"),
        ({"precisions": [attrs.evolve(PRECISION_16, fallback={"cpu": "transformer-engine"})]}, "runs on 'cpu' itself"),
        ({"precisions": [attrs.evolve(PRECISION_32, accelerators=NPU)]}, "no such accelerator"),
        ({"families": [attrs.evolve(BUILTIN_RULES.families["ddp"], accelerators=NPU)]}, "no such accelerator"),
        ({"strategies": "abc"}, "not a str"),
        ({"strategies": ["abc"]}, "each row is a StrategyRule"),
        ({"fork_counterparts": ["ddp"]}, "maps a strategy"),
    ],
)
def test_extend_refuses_rows_that_cannot_work(arguments: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        BUILTIN_RULES.extend(**arguments)  # type: ignore[arg-type]


def test_extend_takes_the_rows_that_can() -> None:
    """The refusals above are not blanket: the coherent spellings of the same rows are taken."""
    rules = BUILTIN_RULES.extend(
        strategies=[_mine(launcher="spawn", static_graph=True, timeout_seconds=60)],
        families=iter([BUILTIN_RULES.families["ddp"]]),  # any iterable, read once
        precisions=[PRECISION_16],
        script_counterparts={CustomName("mine"): "ddp"},
    )
    plan = resolve_uncached(Request(accelerator="cpu", devices=2, strategy=CustomName("mine")), cpu(), rules)
    options = DDPOptions(static_graph=True, timeout_seconds=60, given=[])
    assert (plan.launcher, plan.strategy.options) == ("spawn", options)


def test_a_forking_strategy_without_a_spawn_counterpart_is_not_offered_ddp_spawn() -> None:
    from tests.downstream_rules import CHECKPOINT_IO_NOTEBOOK, RULES
    from trainplan import Environment, Incompatible, Request
    from trainplan.resolve import resolve_uncached

    cases = [
        (Request(accelerator="cpu", strategy=CHECKPOINT_IO_NOTEBOOK, devices=2), Environment(start_methods=("spawn",))),
        (
            Request(accelerator="cuda", strategy=CHECKPOINT_IO_NOTEBOOK, devices=2),
            Environment(cuda_device_count=2, cuda_initialized=True),
        ),
    ]
    for (request, env), rule in zip(cases, ("fork-unavailable", "fork-after-cuda"), strict=True):
        with pytest.raises(Incompatible) as caught:
            resolve_uncached(request, env, rules=RULES)
        assert caught.value.rule == rule
        assert "ddp_spawn" not in str(caught.value) and "no spawn-started variant" in str(caught.value)


# --------------------------------------------------------------------------------------------------
# Options added by value


def _option(**fields: object) -> OptionRow:
    """A DDP option of a downstream rule set (`bucket_cap_mb`'s row, with `fields` in place)."""
    return attrs.evolve(BUCKET_CAP, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        (_option(name="given"), "rules.options['ddp', 'given'].name", "not a field of the family's record"),
        (_option(name="extra"), "rules.options['ddp', 'extra'].name", "not a field of the family's record"),
        (_option(name="static_graph"), "rules.options['ddp', 'static_graph'].name", "not a field"),
        (_option(name="Bucket-Cap"), "rules.options['ddp', 'Bucket-Cap'].name", "lowercase letters"),
        (_option(family="dp"), "rules.options['dp', 'bucket_cap_mb'].family", "takes no options"),
        (_option(default=0), "rules.options['ddp', 'bucket_cap_mb'].default", "positive integer"),
        (_option(default=[25]), "rules.options['ddp', 'bucket_cap_mb'].default", "positive integer"),
        (_option(accelerate=None), "rules.options['ddp', 'bucket_cap_mb'].accelerate", "say how it spells"),
        (_option(deepspeed_config=()), "rules.options['ddp', 'bucket_cap_mb'].deepspeed_config", "never runs there"),
        (_option(lightning=()), "rules.options['ddp', 'bucket_cap_mb'].lightning", "at least one"),
        (_option(torch=(Keyword("a"), "b")), "rules.options['ddp', 'bucket_cap_mb'].torch", "tuple of Keywords"),
        (_option(torch=ThroughMesh("tp")), "rules.options['ddp', 'bucket_cap_mb']", "ModelParallelOptions' own"),
        (_option(torch=Carried(("nothing",))), "rules.options['ddp', 'bucket_cap_mb'].torch.by", "other options"),
        (_option(torch=Refused("")), "rules.options['ddp', 'bucket_cap_mb'].torch.reason", "says why"),
        (_option(check="big"), "rules.options['ddp', 'bucket_cap_mb'].check", "which values the option takes"),
        (
            _option(torch=ProcessGroupTimeout(), accelerate=ProcessGroupTimeout()),
            "rules.options['ddp', 'bucket_cap_mb'].torch",
            "already has the process group's timeout, 'timeout_seconds'",
        ),
        (_option(torch=ProcessGroupTimeout()), "rules.options['ddp', 'bucket_cap_mb'].accelerate", "is one"),
        (
            _option(needs=Needs(values={"stage": 3}, refusal="deepspeed-offload-stage")),
            "rules.options['ddp', 'bucket_cap_mb'].needs",
            "another option of the family",
        ),
        (
            _option(needs=Needs(values={"static_graph": True}, refusal="no-such-rule")),  # type: ignore[arg-type]
            "rules.options['ddp', 'bucket_cap_mb'].needs.refusal",
            "no such rule",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_extend_refuses_an_option_that_cannot_work(row: OptionRow, field: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)) as caught:
        BUILTIN_RULES.extend(options=[row])
    assert caught.value.field == field


def test_extend_refuses_an_option_twice_and_what_is_not_a_row() -> None:
    with pytest.raises(InvalidRequest, match="the family has an option of that name"):
        RULES.extend(options=[BUCKET_CAP])
    with pytest.raises(InvalidRequest, match="each row is a OptionRow"):
        BUILTIN_RULES.extend(options=["bucket_cap_mb"])  # type: ignore[list-item]


def test_a_preset_names_only_options_of_its_family_never_given() -> None:
    """A preset naming `given` (or anything that is not a row of the family) is an InvalidRequest naming the preset,
    its allowed options the rows' (never `given` or `extra`)."""
    presets: list[dict[str, Any]] = [{"given": frozenset()}, {"extra": {}}, {"bucket_cap_mb": 50}]
    for preset in presets:
        with pytest.raises(InvalidRequest) as caught:
            BUILTIN_RULES.extend(strategies=[_mine(**preset)])
        assert caught.value.field == "rules.strategies['mine'].preset"
        assert caught.value.allowed == tuple(row.name for row in BUILTIN_RULES.options["ddp"])
    rules = RULES.extend(strategies=[_mine(bucket_cap_mb=100)])  # an option the rule set added: a preset may fix it
    plan = resolve(Request(accelerator="cpu", devices=2, strategy=CustomName("mine")), cpu(), rules)
    assert plan.strategy.options == DDPOptions(extra={"bucket_cap_mb": 100}, given=[])
    with pytest.raises(InvalidRequest, match="a positive integer"):
        RULES.extend(strategies=[_mine(bucket_cap_mb=0)])


def test_an_added_option_travels_from_a_config_file_a_flag_and_json_to_every_framework(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`bucket_cap_mb` (the downstream rule set's): a config file's mapping fills the record's `extra`, the value is
    checked by its row, the plan reads back equal with its rule set, and torch's DDP, Lightning and Accelerate get
    it; trainplan's own rules refuse it by name."""
    request = Request.from_config(
        {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "strategy_options": {"bucket_cap_mb": 50}}, rules=RULES
    )
    assert request.strategy_options == DDPOptions(extra={"bucket_cap_mb": 50})
    with pytest.raises(InvalidRequest, match="does not take these options"):
        Request.from_config({"strategy": "ddp", "strategy_options": {"bucket_cap_mb": 50}})
    with pytest.raises(InvalidRequest, match="no option 'bucket_cap_mb' of family 'ddp'"):
        resolve(request, cpu())
    with pytest.raises(InvalidRequest, match="DDP's buckets are megabytes each"):
        resolve(attrs.evolve(request, strategy_options=DDPOptions(extra={"bucket_cap_mb": 4096})), cpu(), RULES)
    plan = resolve(request, cpu(), RULES)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict())), rules=RULES) == plan
    assert lightning_arguments(plan, rules=RULES).strategy.arguments["bucket_cap_mb"] == 50
    assert accelerate_arguments(plan, RULES).ddp["bucket_cap_mb"] == 50
    assert option_keywords(plan, "torch", "torch", RULES)["bucket_cap_mb"] == 50
    flags = ["plan", "--rules", "tests.downstream_rules:RULES", "--accelerator", "cpu", "--devices", "2"]
    assert main([*flags, "--strategy", "ddp", "--strategy-option", "bucket_cap_mb=50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["options"]["extra"] == {"bucket_cap_mb": 50}


def test_options_round_trip_with_which_were_written() -> None:
    """A plan's options read back equal: a preset's values, the request's written options (not every option), and
    the options a rule set adds."""
    plan = resolve(Request(accelerator="cpu", devices=2, strategy="ddp_find_unused_parameters_true"), cpu())
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["strategy"]["options"]["given"] == [] and data["request"]["strategy_options"] is None
    assert Plan.from_dict(data) == plan
    written = DDPOptions(static_graph=False)
    plan = resolve(Request(accelerator="cpu", devices=2, strategy_options=written), cpu())
    back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.request.strategy_options == written != DDPOptions()
    data["strategy"]["options"]["given"] = ["given"]
    with pytest.raises(PlanFormatError, match="are not options of ddp"):
        Plan.from_dict(data)


def test_a_family_row_is_checked_against_the_precision_a_fallback_runs_not_the_one_asked_for() -> None:
    """16-mixed on CPU runs as bf16-mixed (autocast there is bfloat16 only): a replaced family row that lists one of
    the two and not the other takes the request by what would run. (Every built-in family lists both or neither, so
    only a downstream row can tell the two apart.)"""
    ddp = BUILTIN_RULES.families["ddp"]
    without_bf16 = BUILTIN_RULES.extend(families=[attrs.evolve(ddp, precisions=ddp.precisions - {"bf16-mixed"})])
    without_fp16 = BUILTIN_RULES.extend(families=[attrs.evolve(ddp, precisions=ddp.precisions - {"16-mixed"})])
    request = Request(accelerator="cpu", devices=2, strategy="ddp", precision="16-mixed")
    with pytest.raises(Incompatible) as caught:
        resolve_uncached(request, cpu(), without_bf16)
    assert caught.value.rule == "precision-strategy"
    # The refusal names what would run, and offers only what runs as a precision the row takes.
    reason, offered = str(caught.value).split(" which accepts ", 1)
    assert "precision='16-mixed' (which runs as 'bf16-mixed' on 'cpu') is not supported by strategy 'ddp'" in reason
    assert "'32-true'" in offered and "mixed'" not in offered
    plan = resolve_uncached(request, cpu(), without_fp16)
    assert plan.precision == "bf16-mixed" and "precision-fallback" in {note.code for note in plan.notes}
