"""Request.from_config: loose values (config files, flags) to a typed, canonical request."""

from __future__ import annotations

import pytest

from trainplan import DDPOptions, Environment, InvalidRequest, ModelParallelOptions, Request, resolve


def test_case_aliases_and_digit_strings() -> None:
    request = Request.from_config(
        {"accelerator": "TPU", "devices": " 0, 2 ", "num_nodes": "2", "precision": "16", "sync_batchnorm": "true"}
    )
    assert request == Request(accelerator="xla", devices=(0, 2), num_nodes=2, precision="16-mixed", sync_batchnorm=True)
    assert [note.code for note in request.notes] == ["precision-alias"]


def test_options_under_auto_fill_the_record_of_the_one_family_auto_would_take() -> None:
    """`--strategy-option timeout_seconds=60` without --strategy was refused: auto chooses ddp for several devices
    (and model_parallel only for a mesh's degrees), so a key only DDP's record and the mesh's take is DDP's."""
    assert Request.from_config({"strategy_options": {"timeout_seconds": 60}}).strategy_options == DDPOptions(
        timeout_seconds=60
    )
    assert Request.from_config({"strategy_options": {"tp": 2}}).strategy_options == ModelParallelOptions(tp=2)
    plan = resolve(Request.from_config({"devices": 2, "strategy_options": {"timeout_seconds": 60}}), Environment())
    assert plan.strategy.name == "ddp" and plan.strategy.options == DDPOptions(timeout_seconds=60)
    with pytest.raises(InvalidRequest, match="strategy='deepspeed'"):  # auto never chooses deepspeed
        Request.from_config({"strategy_options": {"stage": 3}})


def test_strategy_options_from_a_mapping() -> None:
    request = Request.from_config({"strategy": "ddp", "strategy_options": {"find_unused_parameters": True}})
    assert request.strategy_options == DDPOptions(find_unused_parameters=True)


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({"acelerator": "cpu"}, "key", "Did you mean key='accelerator'"),
        ({"strategy": "dpp"}, "strategy", "Did you mean"),
        ({"strategy_options": {"stage": 3}}, "strategy_options", "need a strategy"),
        ({"strategy": "dp", "strategy_options": {"stage": 3}}, "strategy_options", "takes no options"),
        ({"strategy": "ddp", "strategy_options": {"stage": 3}}, "strategy_options", "does not take"),
        (
            {"strategy": "fsdp", "strategy_options": {"sharding_strategy": "ALL"}},
            "strategy_options.sharding_strategy",
            "",
        ),
        ({"num_nodes": "two"}, "num_nodes", "positive integer"),
        ({"metrics_store": "gpu"}, "metrics_store", "not a known name"),
        ({"process_group_backend": 3}, "process_group_backend", "not an int"),
        ({"sync_batchnorm": 3}, "sync_batchnorm", "not an int"),
        ({"devices": [0, "a"]}, "devices", "is a str"),
    ],
)
def test_unknown_keys_and_values_are_named(config: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        Request.from_config(config)
    assert caught.value.field == field
    assert words in str(caught.value)
