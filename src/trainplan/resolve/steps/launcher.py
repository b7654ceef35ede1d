"""Step 10: the launcher: the strategy's own, or inside a started job the one that joins it; refused where the
session cannot run it (a notebook, no fork, CUDA already initialised). `check` goes on with the host's launcher."""

from __future__ import annotations

from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import HOST_LAUNCHER, lookup
from trainplan.spec.errors import Incompatible
from trainplan.spec.names import LauncherName


def choose_launcher(draft: Draft) -> None:
    _adopt(draft, _choose_launcher(draft))


def host_launcher(draft: Draft) -> None:
    """`check`'s way on after the launcher was refused."""
    _adopt(draft, HOST_LAUNCHER)


def _adopt(draft: Draft, launcher: LauncherName) -> None:
    draft.launcher = launcher
    launcher_rule = lookup(draft.rules.launchers, launcher, name="LAUNCHERS")
    draft.reasons["launcher"] = launcher_rule.description
    if launcher_rule.joins and draft.facts.launched:
        draft.reasons["launcher"] = "trainplan's launcher already started every process; join its world"


def _choose_launcher(draft: Draft) -> LauncherName:
    name, env, rules = draft.strategy_name, draft.env, draft.rules
    launcher = draft.strategy.launcher
    launcher_rule = lookup(rules.launchers, launcher, name="LAUNCHERS")
    override = launcher_rule.in_started_job
    if draft.in_started_job and draft.family.has_process_group and override is not None:
        # A process of a started job joins it; it never starts more (spawn and fork strategies were turned
        # into their script counterparts above).
        return override
    if env.interactive and not launcher_rule.interactive_compatible:
        instead = rules.fork_strategy_for.get(name)
        error = incompatible(
            "interactive-launcher",
            {"strategy": name},
            launcher_description=launcher_rule.description,
            instead=instead or "",
        )
        if instead is None:
            error = Incompatible(
                values=error.values,
                rule=error.rule,
                reason=error.reason,
                fix=f"Run the code as a script: {name!r} has no notebook-compatible variant",
            )
        raise error
    if launcher_rule.forks:
        instead = rules.spawn_strategy_for.get(name)
        blocked_by = draft.accelerator.fork_blocked_by
        refusal: Incompatible | None = None
        if launcher_rule.start_method not in env.start_methods:
            refusal = incompatible(
                "fork-unavailable",
                {"strategy": name},
                methods=", ".join(env.start_methods) or "no start method",
                instead=instead or "",
            )
        elif blocked_by is not None and getattr(env, blocked_by):
            refusal = incompatible("fork-after-cuda", {"strategy": name}, instead=instead or "")
        if refusal is not None and instead is None:
            # A strategy of an extended rule set without a spawn counterpart: there is no name to offer.
            refusal = Incompatible(
                values=refusal.values,
                rule=refusal.rule,
                reason=refusal.reason,
                fix=f"{name!r} has no spawn-started variant in this rule set: run the code as a script, or give it "
                "one (Rules.extend(spawn_counterparts=...))",
            )
        if refusal is not None:
            raise refusal
    return launcher
