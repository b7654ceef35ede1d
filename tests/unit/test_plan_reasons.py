"""What a plan says of its backend and its precision (`plan.reasons`, which `explain` prints), and the texts of their
refusals: each pinned word for word, since `make mutate` found no test that read them."""

from __future__ import annotations

import pytest

from tests.downstream_rules import HCCL, NPU, RULES
from tests.helpers import cpu, cuda, plan_for
from trainplan import Environment, Incompatible, Request
from trainplan.resolve import resolve

GLOO = "Meta's CPU collective library (also reduces CUDA tensors, through host copies)"


@pytest.mark.parametrize(
    ("env", "request_fields", "reason"),
    [
        (cpu(), {}, "a single process creates no process group"),
        (cpu(), {"devices": 2}, f"the default for 'cpu' ({GLOO})"),
        (cuda(2), {}, "the default for 'cuda' (NVIDIA's collective library)"),
        (cuda(2), {"process_group_backend": "gloo"}, f"asked for 'gloo' ({GLOO})"),
    ],
)
def test_the_backends_reason(env: Environment, request_fields: dict[str, object], reason: str) -> None:
    assert plan_for(env, **request_fields).reasons["backend"] == reason


def test_the_precisions_reason_is_its_rows_description_after_the_fallback() -> None:
    assert plan_for(cpu()).reasons["precision"] == "float32 weights and compute"
    plan = plan_for(cpu(), devices=2, precision="16-mixed")
    assert plan.reasons["precision"] == "bfloat16 automatic mixed precision"
    (note,) = [note for note in plan.notes if note.code == "precision-fallback"]
    assert (note.level, note.message) == (
        "warning",
        "precision='16-mixed' is not supported on 'cpu' (autocast there supports bfloat16 only); using 'bf16-mixed' "
        "instead",
    )


@pytest.mark.parametrize(
    ("env", "request_fields", "rule", "reason", "fix"),
    [
        (
            cuda(2),
            {"process_group_backend": "xla"},
            "backend-accelerator",
            "process_group_backend='xla' cannot serve accelerator 'cuda': the xla backend serves XLA devices only",
            "Use process_group_backend='nccl' (the default for 'cuda'), or leave it unset",
        ),
        (
            cpu(),
            {"process_group_backend": "gloo"},
            "backend-without-group",
            "strategy 'single_device' runs one process and creates no process group, so a backend has no effect",
            "Remove process_group_backend, or use a multi-process strategy such as 'ddp'",
        ),
        (
            Environment(mps_available=True),
            {"precision": "64-true"},
            "precision-accelerator",
            "precision='64-true' is not available on accelerator 'mps': the MPS backend has no float64 support",
            "Use precision='32-true'",
        ),
        (
            cuda(2),
            {"precision": "transformer-engine"},
            "precision-package",
            "precision='transformer-engine' needs the 'transformer_engine' package, which is not installed",
            "Install it (`pip install transformer_engine`), or use precision='bf16-mixed'",
        ),
    ],
)
def test_the_refusals_texts(
    env: Environment, request_fields: dict[str, object], rule: str, reason: str, fix: str
) -> None:
    with pytest.raises(Incompatible) as refused:
        resolve(Request(**request_fields), env)  # type: ignore[arg-type]
    assert (refused.value.rule, refused.value.reason, refused.value.fix) == (rule, reason, fix)


def test_a_downstream_row_that_gives_no_reason_still_refuses_with_one() -> None:
    """A backend or precision row need not say why it does not run on each accelerator: the refusal then says it
    plainly, and a precision row with no `instead` there offers the rule set's default precision."""
    with pytest.raises(Incompatible) as refused:
        resolve(Request(strategy="xla", process_group_backend=HCCL), Environment(xla_device_count=2), RULES)
    assert refused.value.reason == (
        "process_group_backend='hccl' cannot serve accelerator 'xla': it does not support this device"
    )
    with pytest.raises(Incompatible) as refused:
        resolve(Request(accelerator=NPU, precision="64-true"), Environment().with_device_counts({NPU: 8}), RULES)
    assert (refused.value.reason, refused.value.fix) == (
        "precision='64-true' is not available on accelerator 'npu': it is not supported there",
        "Use precision='32-true'",
    )


def test_a_refusal_of_an_id_without_a_row_names_the_table() -> None:
    from typing import cast

    from trainplan.resolve.refusal import incompatible
    from trainplan.rules import RefusalId
    from trainplan.spec.errors import MissingRule

    with pytest.raises(MissingRule) as missing:
        incompatible(cast(RefusalId, "no-such-refusal"), {})
    assert (missing.value.table, missing.value.key) == ("RULES", "no-such-refusal")
