"""Step 15: `sync_batchnorm`: refused on an accelerator that cannot synchronise batch statistics, noted where it has
no effect (one process)."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible


def check_sync_batchnorm(draft: Draft) -> None:
    if not draft.fields.sync_batchnorm:
        return
    accelerator, world_size, family = draft.accelerator.name, draft.world_size, draft.family
    if world_size > 1 and family.has_process_group and accelerator not in draft.rules.sync_batchnorm_accelerators:
        draft.refuse(incompatible("sync-batchnorm-device", {"sync_batchnorm": True, "accelerator": accelerator}))
    if world_size == 1 or not family.has_process_group:
        draft.note(
            "sync-batchnorm-no-effect",
            "warning",
            "sync_batchnorm=True has no effect: batch statistics are synchronised across processes, and this plan "
            "has one",
        )
