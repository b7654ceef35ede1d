"""Step 12: the process group's backend: as asked (where the accelerator runs it) or the accelerator's default;
none for a single process. `check` goes on without one."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import lookup
from trainplan.spec.names import BackendKey


def choose_backend(draft: Draft) -> None:
    _adopt(draft, _choose_backend(draft))


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


def _choose_backend(draft: Draft) -> BackendKey | None:
    requested, accelerator = draft.fields.process_group_backend, draft.accelerator.name
    if not draft.family.has_process_group:
        if requested is not None:
            values = {"strategy": draft.strategy_name, "process_group_backend": requested}
            raise incompatible("backend-without-group", values)
        return None
    default = draft.accelerator.default_backend
    if requested is None:
        return default
    rule = lookup(draft.rules.backends, requested, name="BACKENDS")
    if accelerator not in rule.accelerators:
        raise incompatible(
            "backend-accelerator",
            {"process_group_backend": requested, "accelerator": accelerator},
            backend=requested,
            why=rule.why_not.get(accelerator, "it does not support this device"),
            instead=default,
        )
    return requested
