"""One plan, one world, without processes: what a job's processes resolve to, what a launcher gives its workers,
one GPU convention on every path, joining, and a metric store that is never silently out of its world."""

from __future__ import annotations

import itertools
import shlex
import subprocess
from typing import Any

import attrs
import pytest
import torch

from tests.helpers import LAUNCHED_1_OF_2, SLURM_2x4, TORCHRUN_2x2, cpu, cuda
from trainplan import (
    DDPOptions,
    Environment,
    FSDPOptions,
    Incompatible,
    JoinError,
    MetricStore,
    NotInWorld,
    Plan,
    Request,
    TrainplanError,
    WorldMismatch,
    join,
)
from trainplan.effects.launching import choose_free_port
from trainplan.effects.metrics import CollectiveOp
from trainplan.mapping.workers import (
    nested_launch,
    process_group_timeout,
    script_request,
    worker_environment,
    worker_view,
)
from trainplan.render.emit import emit_slurm, emit_torchrun, slurm_worker_line
from trainplan.resolve import resolve

# --------------------------------------------------------------------------------------------------
# Inside a started job, 'auto' adopts the job


def _layout(plan: Plan) -> tuple[object, ...]:
    return (plan.num_nodes, plan.processes_per_node, plan.world_size, plan.launcher)


@pytest.mark.parametrize(
    ("name", "env", "layout", "ranks"),
    [
        ("torchrun on cpu", cpu(variables=TORCHRUN_2x2), (2, 2, 4, "external"), (3, 1, 1)),
        ("torchrun on gpus", cuda(2, variables=TORCHRUN_2x2), (2, 2, 4, "external"), (3, 1, 1)),
        ("srun on gpus", cuda(4, variables=SLURM_2x4), (2, 4, 8, "external"), (5, 1, 1)),
        (
            "mpirun",
            cpu(
                variables={
                    "OMPI_COMM_WORLD_SIZE": "4",
                    "OMPI_COMM_WORLD_RANK": "1",
                    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                    "OMPI_MCA_ess_base_jobid": "2886991873",  # every Open MPI rank has it (the port comes from it)
                    "MASTER_ADDR": "head",
                }
            ),
            (2, 2, 4, "external"),
            (1, 1, None),  # MPI states no node index
        ),
        (
            "jsrun",
            cpu(
                variables={
                    "LSB_JOBID": "77",
                    "JSM_NAMESPACE_SIZE": "4",
                    "JSM_NAMESPACE_RANK": "2",
                    "JSM_NAMESPACE_LOCAL_RANK": "0",
                    "LSB_MCPU_HOSTS": "batch 1 h1 2 h2 2",
                }
            ),
            (2, 2, 4, "external"),
            (2, 0, 1),
        ),
        ("trainplan's launcher", cpu(variables=LAUNCHED_1_OF_2), (1, 2, 2, "external"), (1, 1, 0)),
    ],
)
def test_everything_auto_takes_the_layout_the_job_started(
    name: str, env: Environment, layout: tuple[object, ...], ranks: tuple[int, int, int | None]
) -> None:
    plan = resolve(Request(), env)
    assert _layout(plan) == layout
    assert (plan.cluster.global_rank, plan.cluster.local_rank, plan.cluster.node_rank) == ranks
    assert plan.strategy.name == "ddp" and plan.cluster.creates_processes
    assert any(note.code == "job-layout" and "inside a started job" in note.message for note in plan.notes)


def test_a_kubeflow_pod_is_one_process_of_a_node() -> None:
    pod = {"KUBERNETES_PORT": "tcp://10.0.0.1:443", "MASTER_ADDR": "m", "MASTER_PORT": "23456"}
    plan = resolve(Request(cluster="kubeflow"), cpu(variables={**pod, "WORLD_SIZE": "3", "RANK": "2"}))
    assert _layout(plan) == (3, 1, 3, "external") and plan.cluster.global_rank == 2


def test_outside_a_job_auto_means_one_node() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), cpu())
    assert (plan.num_nodes, plan.launcher, plan.request.num_nodes) == (1, "subprocess", "auto")
    assert not any(note.code == "job-layout" for note in plan.notes)


def test_explicit_fields_that_contradict_the_job_keep_the_clear_error() -> None:
    with pytest.raises(Incompatible, match="torchrun started 4 processes") as caught:
        resolve(Request(devices=1), cpu(variables=TORCHRUN_2x2))
    assert "--nproc-per-node=1" in str(caught.value)
    assert resolve(Request(devices=2), cpu(variables=TORCHRUN_2x2)).num_nodes == 2, "nodes still adopt"


def test_a_worker_of_trainplans_launcher_joins_whatever_strategy_started_it() -> None:
    for strategy in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"):
        plan = resolve(Request(accelerator="cpu", strategy=strategy, devices=2), cpu(variables=LAUNCHED_1_OF_2))
        assert plan.launcher == "external", strategy
        assert plan.cluster.global_rank == 1 and plan.cluster.main_port == 29555


# --------------------------------------------------------------------------------------------------
# What a launcher gives its workers, and what the workers see: the two agree


def _workers_of(plan: Plan, env: Environment, port: int = 29400) -> list[tuple[Plan, Environment]]:
    visible = env.variables.get("CUDA_VISIBLE_DEVICES")
    seen = []
    for local_rank in range(plan.processes_per_node):
        variables = worker_environment(
            plan,
            local_rank=local_rank,
            main_port=port,
            visible_devices=visible,
            visible_count=env.cuda_device_count,
            launcher=plan.launcher,
        )
        inside = attrs.evolve(
            env.with_variables(variables),
            cuda_device_count=len(plan.devices) if plan.accelerator == "cuda" else env.cuda_device_count,
        )
        assert plan.cluster.node_rank is not None  # trainplan's own launchers always know their node
        rank = plan.cluster.node_rank * plan.processes_per_node + local_rank
        view = worker_view(plan, global_rank=rank, local_rank=local_rank, main_port=port)
        seen.append((view, inside))
    return seen


def _essentials(plan: Plan) -> tuple[Any, ...]:
    cluster = plan.cluster
    return (
        plan.accelerator,
        plan.strategy.family,
        plan.strategy.options,
        plan.devices,
        plan.physical_devices,
        _layout(plan),
        (cluster.global_rank, cluster.local_rank, cluster.node_rank, cluster.main_port, cluster.main_address),
        plan.process_group_backend,
        plan.precision,
        tuple(plan.device_for(rank) for rank in range(plan.processes_per_node)),
    )


LAUNCHED_CASES = [
    case
    for case in itertools.product(
        (
            ("cpu", 2),
            ("cpu", 3),
            ("cuda", 2),
            ("cuda", (0, 2)),
            ("cuda", (3, 1)),
            ("cuda", -1),
        ),
        ("ddp", "ddp_spawn", "ddp_fork", "ddp_find_unused_parameters_true", "fsdp"),
        (1, 2),
        (None, "3,1,0,2", "GPU-aa,GPU-bb,GPU-cc,GPU-dd"),
        ("32-true", "bf16-mixed"),
    )
    # FSDP plans CUDA only, and CUDA_VISIBLE_DEVICES means nothing on CPU.
    if case[0][0] == "cuda" or (case[1] != "fsdp" and case[3] is None)
]


@pytest.mark.parametrize(("devices_on", "strategy", "nodes", "visible", "precision"), LAUNCHED_CASES)
def test_a_workers_view_is_what_the_worker_resolves(
    devices_on: tuple[str, Any], strategy: str, nodes: int, visible: str | None, precision: str
) -> None:
    accelerator, devices = devices_on
    variables = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "NODE_RANK": str(nodes - 1)}
    if visible is not None:
        variables["CUDA_VISIBLE_DEVICES"] = visible
    env = Environment(cuda_device_count=4 if accelerator == "cuda" else 0, cpu_count=4, variables=variables)
    request = Request(
        accelerator=accelerator,  # type: ignore[arg-type]
        strategy=strategy,  # type: ignore[arg-type]
        devices=devices,
        num_nodes=nodes,
        precision=precision,  # type: ignore[arg-type]
    )
    plan = resolve(request, env)
    for view, inside in _workers_of(plan, env):
        resolved = resolve(plan.request, inside)
        assert _essentials(resolved) == _essentials(view)
        assert resolved.launcher == "external" and view.launcher == "external"
        # Every path names the same physical GPU for a local rank.
        local = view.cluster.local_rank
        assert local is not None
        assert view.physical_device_for(local) == plan.physical_device_for(local)


# --------------------------------------------------------------------------------------------------
# One GPU convention: devices [0, 2] of a 4-GPU node, local rank 1 → physical GPU 2 on every path


FOUR_GPUS = cuda(4, variables={"MASTER_PORT": "29400"})
ZERO_AND_TWO = resolve(Request(devices=[0, 2]), FOUR_GPUS)


def test_the_plan_names_the_physical_gpus() -> None:
    assert ZERO_AND_TWO.devices == (0, 2) and ZERO_AND_TWO.physical_devices == ("0", "2")
    assert ZERO_AND_TWO.physical_device_for(1) == "2"
    behind = resolve(Request(devices=[0, 2]), cuda(4, variables={"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}))
    assert behind.physical_devices == ("GPU-a", "GPU-c") and "cuda:2 (GPU GPU-c)" in behind.explain()


@pytest.mark.parametrize(
    "env", [Environment(mps_available=True), Environment(xla_device_count=4), cpu()], ids=["mps", "xla", "cpu"]
)
def test_only_cuda_plans_name_physical_gpus(env: Environment) -> None:
    """`Plan.physical_devices`: "Empty for non-CUDA plans" (no visibility variable names their devices)."""
    plan = resolve(Request(), env)
    assert plan.accelerator != "cuda" and plan.devices
    assert plan.physical_devices == ()
    assert plan.physical_device_for(0) == plan.device_for(0)


def test_trainplans_launchers_narrow_cuda_visible_devices_and_local_rank_is_the_device() -> None:
    variables = worker_environment(
        ZERO_AND_TWO, local_rank=1, main_port=29400, visible_devices=None, visible_count=4, launcher="subprocess"
    )
    assert variables["CUDA_VISIBLE_DEVICES"] == "0,2" and variables["LOCAL_RANK"] == "1"
    assert "TRAINPLAN_DEVICE" not in variables
    inside = cuda(2, variables=variables)
    for request in (Request(), Request(devices=[0, 2]), Request(devices=2)):
        plan = resolve(request, inside)
        assert plan.device_for(1) == "cuda:1" and plan.physical_device_for(1) == "2", request


def test_the_emitted_torchrun_line_selects_the_same_gpus() -> None:
    words = shlex.split(emit_torchrun(ZERO_AND_TWO, ["train.py"]))
    assert words[0] == "CUDA_VISIBLE_DEVICES=0,2"
    worker = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29400",
        "CUDA_VISIBLE_DEVICES": "0,2",
    }
    for request in (Request(), Request(devices=[0, 2])):
        plan = resolve(request, cuda(2, variables=worker))
        assert plan.launcher == "external" and plan.device_for(1) == "cuda:1" and plan.physical_device_for(1) == "2"
    explicit = resolve(Request(devices=[0, 2]), cuda(2, variables=worker))
    assert any(note.code == "job-devices" for note in explicit.notes)


@pytest.mark.parametrize(
    ("allocated", "expected"),
    [(None, "0,2"), ("0,1,2", "0,2"), ("5,6,7", "5,7"), ("GPU-x,GPU-y,GPU-z", "GPU-x,GPU-z")],
)
def test_the_emitted_sbatch_selects_the_same_gpus(allocated: str | None, expected: str) -> None:
    script = emit_slurm(ZERO_AND_TWO, ["train.py"])
    assert "#SBATCH --gpus-per-node=3" in script
    words = shlex.split(slurm_worker_line(script))
    assert words[:2] == ["bash", "-c"]
    selection = words[2].split("exec ")[0] + 'echo "$CUDA_VISIBLE_DEVICES $TRAINPLAN_SELECTED_DEVICES"'
    environment = {"PATH": "/usr/bin:/bin"}
    if allocated is not None:
        environment["CUDA_VISIBLE_DEVICES"] = allocated
    result = subprocess.run(["bash", "-c", selection], env=environment, capture_output=True, text=True, check=True)
    assert result.stdout.split() == [expected, "0,2"]


def test_a_launchers_own_cuda_visible_devices_is_honoured() -> None:
    plan = resolve(Request(devices=[0, 2]), cuda(4, variables={"CUDA_VISIBLE_DEVICES": "3,1,0,2"}))
    variables = worker_environment(
        plan, local_rank=1, main_port=29400, visible_devices="3,1,0,2", visible_count=4, launcher="spawn"
    )
    assert variables["CUDA_VISIBLE_DEVICES"] == "3,0" and variables["TRAINPLAN_SELECTED_DEVICES"] == "0,2"
    assert plan.physical_device_for(1) == "0"
    inside = resolve(Request(devices=[0, 2]), cuda(2, variables=variables))
    assert inside.physical_device_for(1) == "0" and inside.device_for(1) == "cuda:1"


# --------------------------------------------------------------------------------------------------
# No nesting by accident; script mode; timeouts


def test_starting_workers_from_a_started_process_is_refused() -> None:
    starting = resolve(Request(accelerator="cpu", devices=2), cpu())
    for variables, who in ((TORCHRUN_2x2, "torchelastic"), (LAUNCHED_1_OF_2, "trainplan's launcher")):
        problem = nested_launch(starting, variables)
        assert problem is not None and f"that {who} started" in str(problem)
        assert "trainplan.resolve()" in str(problem)
    inside = resolve(Request(accelerator="cpu"), cpu(variables=TORCHRUN_2x2))
    assert nested_launch(inside, TORCHRUN_2x2) is None, "an external plan runs in place"
    assert nested_launch(starting, {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "bash"}) is None, "salloc shell"


def test_script_mode_runs_spawn_strategies_as_their_script_counterparts() -> None:
    request = script_request(Request(strategy="ddp_spawn_find_unused_parameters_true"))
    assert request.strategy == "ddp_find_unused_parameters_true"
    assert [note.code for note in request.notes] == ["script-strategy"]
    plan = resolve(request, cpu(variables=TORCHRUN_2x2))
    assert plan.launcher == "external" and any(note.code == "script-strategy" for note in plan.notes)
    assert script_request(Request(strategy="fsdp")) == Request(strategy="fsdp")


def test_the_process_group_timeout_is_the_strategys_option() -> None:
    options = DDPOptions(timeout_seconds=3)
    ddp = resolve(Request(accelerator="cpu", devices=2, strategy_options=options), cpu())
    assert process_group_timeout(ddp) == 3
    fsdp = resolve(Request(devices=2, strategy="fsdp", strategy_options=FSDPOptions()), cuda(2))
    assert process_group_timeout(fsdp) == 1800


# --------------------------------------------------------------------------------------------------
# Joining


def test_join_a_single_process_plan_binds_its_device_and_creates_no_group() -> None:
    plan = resolve(Request(accelerator="cpu"), cpu())
    with join(plan) as world:
        assert (world.rank, world.world_size, world.device, world.created) == (0, 1, "cpu", False)
        assert not torch.distributed.is_initialized()


def test_join_refuses_a_plan_that_starts_its_own_workers() -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), cpu())
    with pytest.raises(JoinError, match=r"launcher 'subprocess'.*trainplan.launch\(plan, fn\)"):
        join(plan)
    external = attrs.evolve(
        resolve(Request(), cpu(variables=TORCHRUN_2x2)),
        cluster=attrs.evolve(resolve(Request(), cpu(variables=TORCHRUN_2x2)).cluster, global_rank=None),
    )
    with pytest.raises(JoinError, match="does not say this process's rank"):
        join(external)
    with pytest.raises(JoinError, match=r"takes a trainplan\.Plan"):
        join("plan")  # type: ignore[arg-type]


def test_join_refuses_another_ranks_plan_and_a_plan_no_launcher_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    rank_1 = resolve(Request(accelerator="cpu"), cpu(variables=LAUNCHED_1_OF_2))
    with pytest.raises(JoinError, match="no launcher started this process"):
        join(rank_1)
    for key, value in {**LAUNCHED_1_OF_2, "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(
        JoinError, match="The plan is rank 1's, but trainplan's launcher started this process as rank 0"
    ):
        join(rank_1)


def test_join_creates_the_group_once_and_checks_an_existing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    port = str(choose_free_port("127.0.0.1"))
    one = {**LAUNCHED_1_OF_2, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    for key, value in {**one, "MASTER_PORT": port}.items():
        monkeypatch.setenv(key, value)
    plan = resolve(Request(accelerator="cpu", strategy="ddp"), cpu(variables={**one, "MASTER_PORT": port}))
    assert plan.world_size == 1 and plan.process_group_backend == "gloo"
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with join(plan) as world:
            assert not world.created, "an existing group is used as it is, and left to its owner"
        assert torch.distributed.is_initialized()
        two = resolve(Request(accelerator="cpu"), cpu(variables={**LAUNCHED_1_OF_2, "RANK": "0", "LOCAL_RANK": "0"}))
        with pytest.raises(WorldMismatch, match="world size 2, but the process group this process is in has"):
            join(two)
    finally:
        torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# A metric store is never silently out of its world


class FakeGroup:
    def __init__(self, size: int, rank: int = 0) -> None:
        self.size, self.my_rank = size, rank

    @property
    def world_size(self) -> int:
        return self.size

    @property
    def rank(self) -> int:
        return self.my_rank

    def all_reduce(self, tensor: torch.Tensor, op: CollectiveOp) -> None:
        if op == "sum":
            tensor.mul_(self.size)

    def all_gather_object(self, value: object) -> list[object]:
        return [value] * self.size


TWO = resolve(Request(accelerator="cpu", devices=2), cpu())
RANK_1_OF_2 = resolve(Request(accelerator="cpu"), cpu(variables=LAUNCHED_1_OF_2))
ONE = resolve(Request(accelerator="cpu"), cpu())


def test_a_store_of_a_world_without_a_process_group_refuses_to_answer_locally() -> None:
    assert not torch.distributed.is_initialized()
    store = MetricStore(TWO)  # the real torch.distributed: no group exists
    store.log("loss", 1.0)
    with pytest.raises(NotInWorld, match=r"world of 2 processes.*with trainplan.join\(plan\):"):
        store.compute()
    assert store.compute(sync=False) == {"loss": 1.0}, "per-rank values only when asked for"
    with pytest.raises(NotInWorld):
        MetricStore(TWO).compute()  # even with nothing logged: never a silent {}


@pytest.mark.parametrize(
    ("plan", "group", "words"),
    [
        (TWO, FakeGroup(3), "world size 2, but the process group this process is in has world size 3"),
        (ONE, FakeGroup(2), "world size 1, but the process group this process is in has world size 2"),
        (RANK_1_OF_2, FakeGroup(2, rank=0), "rank 1, but the process group this process is in has rank 0"),
    ],
)
def test_a_store_in_another_world_is_a_typed_error(plan: Plan, group: FakeGroup, words: str) -> None:
    store = MetricStore(plan, collective=group)
    store.log("loss", 1.0)
    with pytest.raises(WorldMismatch, match=words):
        store.compute()


def test_a_store_in_its_own_world_reduces() -> None:
    store = MetricStore(RANK_1_OF_2, collective=FakeGroup(2, rank=1))
    store.log("tokens", 5, reduce="sum")
    assert store.compute() == {"tokens": 10}


def test_a_torchrun_inside_a_trainplan_worker_gives_its_own_world() -> None:
    from trainplan.effects.launching import worker_plan

    # trainplan's marker and plan are inherited; torchrun's newer variables (and run id) describe this process.
    stale = worker_environment(
        resolve(Request(accelerator="cpu"), cpu()),
        local_rank=0,
        main_port=29400,
        visible_devices=None,
        visible_count=0,
        launcher="trainplan launch",
    )
    inner = {**stale, **TORCHRUN_2x2}
    assert worker_plan(inner) is None
    plan = resolve(Request(), cpu(variables=inner))
    assert plan.cluster.kind == "torchelastic" and plan.world_size == 4 and plan.cluster.global_rank == 3


def test_layout_errors_name_both_layouts_and_who_started_the_job() -> None:
    with pytest.raises(Incompatible, match=r"torchrun started 4 processes as 2 node\(s\) × 2 .* num_nodes=1 × 4"):
        resolve(Request(devices=4, num_nodes=1), cpu(variables=TORCHRUN_2x2))
    with pytest.raises(Incompatible, match="trainplan's launcher started 2 processes"):
        resolve(Request(devices=3), cpu(variables=LAUNCHED_1_OF_2))


def test_a_spawn_strategy_inside_any_job_joins_as_its_script_counterpart() -> None:
    for variables in (TORCHRUN_2x2, LAUNCHED_1_OF_2, SLURM_2x4):
        plan = resolve(Request(accelerator="cpu", strategy="ddp_spawn"), cpu(variables=variables))
        assert plan.strategy.name == "ddp" and plan.launcher == "external"
        assert any(note.code == "script-strategy" for note in plan.notes)


def test_a_worker_view_says_so_in_a_note() -> None:
    view = worker_view(resolve(Request(accelerator="cpu", devices=2), cpu()), global_rank=1, local_rank=1, main_port=1)
    assert any(note.code == "job-layout" for note in view.notes)


@pytest.mark.parametrize(("global_rank", "local_rank"), [(1, 2), (2, 1), (-1, 0), (0, -1)])
def test_a_worker_view_outside_the_plans_world_is_refused(global_rank: int, local_rank: int) -> None:
    plan = resolve(Request(accelerator="cpu", devices=2), cpu())  # one node of two processes: ranks 0 and 1
    last = worker_view(plan, global_rank=1, local_rank=1, main_port=1)
    assert (last.cluster.global_rank, last.cluster.local_rank) == (1, 1)
    with pytest.raises(TrainplanError, match="outside the plan's world of 2"):
        worker_view(plan, global_rank=global_rank, local_rank=local_rank, main_port=1)


def test_join_refuses_a_plan_from_another_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    old = resolve(Request(accelerator="cpu"), cpu(variables=LAUNCHED_1_OF_2))
    for key, value in {**LAUNCHED_1_OF_2, "MASTER_PORT": "29556"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(JoinError, match="meets at port 29555, but this job meets at 29556"):
        join(old)


def test_a_busy_rendezvous_port_is_a_typed_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        variables = {**LAUNCHED_1_OF_2, "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": port}
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
        plan = resolve(Request(accelerator="cpu"), cpu(variables=variables))
        with pytest.raises(JoinError, match=r"cannot listen on 127\.0\.0\.1"):
            join(plan)


def test_a_torchrun_inside_a_trainplan_worker_keeps_the_outer_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainplan

    outer = resolve(Request(accelerator="cpu", devices=1, precision="bf16-mixed"), cpu())
    stale = worker_environment(
        outer, local_rank=0, main_port=29400, visible_devices=None, visible_count=0, launcher="trainplan launch"
    )
    for key, value in {**stale, **TORCHRUN_2x2, "TORCHELASTIC_RUN_ID": "inner"}.items():
        monkeypatch.setenv(key, value)
    plan = trainplan.resolve()
    assert (plan.precision, plan.world_size, plan.cluster.kind) == ("bf16-mixed", 4, "torchelastic")


def test_under_a_c10d_rendezvous_a_worker_takes_the_node_rank_it_was_assigned() -> None:
    # `trainplan launch --node-rank 1 ...` with c10d: the rendezvous may make this node node 0. The engine gives
    # each worker RANK and GROUP_RANK (no NODE_RANK); the worker's plan follows them, not the command line.
    env = cpu(variables={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "NODE_RANK": "1"})
    plan = resolve(Request(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2), env)
    variables = worker_environment(
        plan, local_rank=1, main_port=29400, visible_devices=None, visible_count=0, launcher=plan.launcher
    )
    variables = {key: value for key, value in variables.items() if key != "NODE_RANK"}
    variables.update({"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1"})
    inside = resolve(plan.request, cpu(variables=variables))
    assert (inside.cluster.node_rank, inside.cluster.global_rank, inside.cluster.local_rank) == (0, 1, 1)
    view = worker_view(plan, global_rank=1, local_rank=1, main_port=29400, started_by="trainplan launch")
    assert view.cluster.node_rank == 0 == inside.cluster.node_rank


@pytest.mark.parametrize("rank", [0, 1])
def test_a_world_whose_nodes_were_inferred_stops_waiting_within_the_bound(
    monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    """MPICH's variables of a rank alone on its node (MPI_LOCALNRANKS=1 of PMI_SIZE=2; read off MPICH 4.0): the nodes
    are inferred, so join waits for its peers a bounded time (here 1 s), then says why and what to write."""
    import trainplan.effects.world as world_module

    variables = {"PMI_SIZE": "2", "PMI_RANK": str(rank), "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    variables |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(choose_free_port("127.0.0.1"))}
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(world_module, "INFERRED_JOIN_SECONDS", 1)
    plan = resolve(Request(accelerator="cpu"), cpu(variables=variables))
    assert "cluster-nodes-inferred" in {note.code for note in plan.notes}
    with pytest.raises(JoinError, match=r"did not form at 127\.0\.0\.1:\d+ within 1 s.*MPI states no node count"):
        join(plan)
