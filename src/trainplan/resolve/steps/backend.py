"""Step 12: the process group's backend: as asked (where the accelerator runs it) or the accelerator's default;
none for a single process. `check` goes on without one."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import AcceleratorRule, FamilyRule, Rules, lookup
from trainplan.spec.names import BackendKey, StrategyKey


def choose_backend(draft: Draft) -> None:
    backend = _choose_backend(
        draft.fields.process_group_backend, draft.family, draft.strategy_name, draft.accelerator, draft.rules
    )
    _adopt(draft, backend)


def no_backend(draft: Draft) -> None:
    """`check`'s way on after the backend was refused."""
    _adopt(draft, None)


def _adopt(draft: Draft, backend: BackendKey | None) -> None:
    draft.backend = backend
    asked = draft.fields.process_group_backend
    if not draft.family.has_process_group:
        draft.reasons["backend"] = "a single process creates no process group"
    elif backend is None:
        draft.reasons["backend"] = f"asked for {asked!r}"
    else:
        description = lookup(draft.rules.backends, backend, name="BACKENDS").description
        draft.reasons["backend"] = (
            f"asked for {backend!r} ({description})"
            if asked is not None
            else f"the default for {draft.accelerator.name!r} ({description})"
        )


def _choose_backend(
    requested: BackendKey | None,
    family: FamilyRule,
    strategy: StrategyKey,
    accelerator_rule: AcceleratorRule,
    rules: Rules,
) -> BackendKey | None:
    accelerator = accelerator_rule.name
    if not family.has_process_group:
        if requested is not None:
            raise incompatible("backend-without-group", {"strategy": strategy, "process_group_backend": requested})
        return None
    default = accelerator_rule.default_backend
    if requested is None:
        return default
    rule = lookup(rules.backends, requested, name="BACKENDS")
    if accelerator not in rule.accelerators:
        raise incompatible(
            "backend-accelerator",
            {"process_group_backend": requested, "accelerator": accelerator},
            backend=requested,
            why=rule.why_not.get(accelerator, "it does not support this device"),
            instead=default,
        )
    return requested
