"""The plan so far: what the steps have decided, the notes and reasons they wrote and the problems they found.

One record carries it all through the recipe (`trainplan.resolve.pipeline`): each step reads what the steps before
it decided and writes its own part. A problem goes through `Draft.refuse`, which raises it in `resolve` (the first
problem ends it) and keeps it in `check` (the steps go on, each from what the others could decide).
"""

from __future__ import annotations

import attrs

from trainplan.parse.normalise import DevicesSpec
from trainplan.resolve.cluster import ClusterFacts
from trainplan.rules import AcceleratorRule, FamilyRule, Rules, StrategyRule
from trainplan.rules.memory import MemoryLayout
from trainplan.spec.environment import Environment
from trainplan.spec.errors import TrainplanError
from trainplan.spec.memory import MemoryPlan, MemoryPolicy, ModelFacts
from trainplan.spec.mesh import MeshLayout
from trainplan.spec.names import (
    AcceleratorFlag,
    BackendKey,
    ClusterFlag,
    CustomName,
    LauncherName,
    MetricsStore,
    NoteLevel,
    PrecisionKey,
    StrategyFlag,
    StrategyKey,
)
from trainplan.spec.notes import Note
from trainplan.spec.options import StrategyOptions
from trainplan.spec.plan import ClusterInfo, MetricPlacement
from trainplan.spec.request import NumNodes, Request


@attrs.define(kw_only=True)
class Fields:
    """The request's fields in their normal form (each through its row in `trainplan.parse.fields`), with the notes
    its spellings carry: what the normal request is built from. Written once by the normalising step, then only read
    (a frozen record would cost a call per field to build)."""

    accelerator: AcceleratorFlag | CustomName
    strategy: StrategyFlag | CustomName
    devices: DevicesSpec
    num_nodes: NumNodes
    precision: PrecisionKey
    process_group_backend: BackendKey | None
    cluster: ClusterFlag
    metrics_store: MetricsStore
    sync_batchnorm: bool
    select_usable_gpus: bool
    strategy_options: StrategyOptions | None
    model: ModelFacts | None
    memory_policy: MemoryPolicy | None
    notes: tuple[Note, ...]


@attrs.define(kw_only=True)
class Draft:
    """A plan in the making. The first fields are given; the others are each written by one step, in the recipe's
    order (one read before its step ran raises AttributeError: a bug in the recipe, never a user's error)."""

    request: Request
    """The request as given (the first step checks that it is one)."""
    env: Environment
    """The facts; `check` replaces them by facts with every accelerator present when the one asked for is not."""
    rules: Rules
    collecting: bool
    """`check`: problems are kept and the steps go on. `resolve`: the first problem is raised."""
    problems: list[TrainplanError] = attrs.Factory(list)
    notes: list[Note] = attrs.Factory(list)
    reasons: dict[str, str] = attrs.Factory(dict)
    """Why each choice was made, by decision (the plan's `reasons`)."""
    ended: bool = False
    memory_choice: MemoryLayout | None = None
    """The layout the memory step chose for strategy='auto' (the strategy step takes its strategy and options)."""
    """A step found nothing the later ones could go on from (a wrong argument, a wrong fact, an unknown accelerator)."""

    fields: Fields = attrs.field(init=False)
    facts: ClusterFacts = attrs.field(init=False)
    in_started_job: bool = attrs.field(init=False)
    """Whether a launcher or cluster manager already started every process of this job."""
    num_nodes: int = attrs.field(init=False)
    nodes_reason: str = attrs.field(init=False)
    accelerator: AcceleratorRule = attrs.field(init=False)
    devices: tuple[int, ...] = attrs.field(init=False)
    strategy_name: StrategyKey = attrs.field(init=False)
    strategy: StrategyRule = attrs.field(init=False)
    family: FamilyRule = attrs.field(init=False)
    options: StrategyOptions | None = attrs.field(init=False)
    processes_per_node: int = attrs.field(init=False)
    world_size: int = attrs.field(init=False)
    launcher: LauncherName = attrs.field(init=False)
    cluster: ClusterInfo = attrs.field(init=False)
    backend: BackendKey | None = attrs.field(init=False)
    precision: PrecisionKey = attrs.field(init=False)
    mesh: MeshLayout | None = attrs.field(init=False)
    memory: MemoryPlan | None = attrs.field(init=False)
    metrics: MetricPlacement = attrs.field(init=False)

    def refuse(self, problem: TrainplanError) -> None:
        """A problem that leaves the step able to go on: raised by `resolve`, kept by `check`."""
        if not self.collecting:
            raise problem
        self.problems.append(problem)

    def note(self, code: str, level: NoteLevel, message: str) -> None:
        self.notes.append(Note(code=code, level=level, message=message))

    def end(self) -> None:
        """Nothing after this step can be decided: the run ends (only `check` gets here; `resolve` raised)."""
        self.ended = True


__all__ = ["Draft", "Fields"]
