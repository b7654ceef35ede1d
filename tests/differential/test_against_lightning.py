"""Differential test: trainplan against PyTorch Lightning's `_AcceleratorConnector` on a generated sample.

Over requests × environments that Lightning's connector can be built for on this machine (CPU, simulated
CUDA device counts, SLURM and torchrun variables, interactive or not), both must agree on accelerator,
strategy family, device indices, num_nodes, world size, launcher kind, cluster kind, precision, and on
error versus no error, except where trainplan differs on purpose: each such difference is a predicate
below whose reason is in `rules.DIFFERENCES` (and, from there, in the README). Skips without Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pytorch_lightning")

from tests.differential.lightning_harness import Outcome, lightning, ours
from tests.differential.sample import model_parallel_sample, request_for, sample
from trainplan import ClusterEnvironmentError, Environment, Incompatible, Request, TrainplanError, Unavailable
from trainplan.resolve import resolve
from trainplan.rules import DIFFERENCES, LIGHTNING_SIZES

SAMPLE_SIZE = 800


def _our_error(flags: dict[str, Any], env: Environment) -> TrainplanError | None:
    try:
        resolve(request_for(flags), env)
    except TrainplanError as error:
        return error
    return None


def _rule(error: TrainplanError | None) -> str | None:
    return error.rule if isinstance(error, Incompatible) else None


def _cluster_variables(env: Environment) -> bool:
    return "RANK" in env.variables or (
        "SLURM_NTASKS" in env.variables and env.variables.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    )


Explanation = Callable[[dict[str, Any], Environment, Outcome, Outcome, "TrainplanError | None"], bool]

EXPLAINED: dict[str, Explanation] = {
    "srun-task-of-a-shell-job": lambda flags, env, mine, theirs, error: (
        env.variables.get("SLURM_JOB_NAME") in ("bash", "interactive") and "SLURM_STEP_ID" in env.variables
    ),
    "ddp-under-cluster-with-spawn": lambda flags, env, mine, theirs, error: (
        not mine.error and mine.launcher == "external" and theirs.launcher in ("spawn", "fork")
    ),
    "cluster-world-size": lambda flags, env, mine, theirs, error: _rule(error) == "cluster-world-size",
    "torchelastic-visible-devices": lambda flags, env, mine, theirs, error: (
        isinstance(error, Unavailable) and "RANK" in env.variables and env.cuda_device_count == 1
    ),
    # Refused here where Lightning plans node 0 (a node rank mismatch alone is no field of the outcome: its own test).
    "torchelastic-without-group-rank": lambda flags, env, mine, theirs, error: (
        isinstance(error, ClusterEnvironmentError)
        and error.variable == "GROUP_RANK"
        and "TORCHELASTIC_RUN_ID" in env.variables
        and "GROUP_RANK" not in env.variables
    ),
    "interactive-under-cluster": lambda flags, env, mine, theirs, error: (
        theirs.error and not mine.error and env.interactive and mine.launcher == "external"
    ),
    # Found by RANK, WORLD_SIZE and LOCAL_RANK with no cluster manager's: planned or refused here as the variables'
    # world, where Lightning's LightningEnvironment ('local') plans num_nodes × devices.
    "torch-env-detected": lambda flags, env, mine, theirs, error: (
        _torch_env(env)
        and theirs.cluster in ("local", None)
        and (mine.cluster == "torch_env" or isinstance(error, ClusterEnvironmentError))
    ),
    "auto-adopts-job": lambda flags, env, mine, theirs, error: (
        flags["devices"] == "auto"
        and _cluster_variables(env)
        and (_rule(error) in ("job-gpus", "job-layout-unknown") or (not mine.error and mine.launcher == "external"))
    ),
    "strategy-dp": lambda flags, env, mine, theirs, error: flags["strategy"] == "dp" and theirs.error,
    "single-device-strategy": lambda flags, env, mine, theirs, error: (
        flags["strategy"] == "single_device"
        and (_rule(error) in ("strategy-device-count", "strategy-nodes") or mine.devices != theirs.devices)
    ),
    "backend-on-single-process": lambda flags, env, mine, theirs, error: _rule(error) == "backend-without-group",
    "mps-ddp": lambda flags, env, mine, theirs, error: (
        _rule(error) == "strategy-accelerator" and _value(error, "accelerator") == "mps"
    ),
    "kubeflow-detected": lambda flags, env, mine, theirs, error: (
        "KUBERNETES_PORT" in env.variables
        and (mine.launcher == "external" or _rule(error) in ("cluster-one-process-per-node", "cluster-world-size"))
    ),
    "fork-after-cuda": lambda flags, env, mine, theirs, error: _rule(error) == "fork-after-cuda",
    # Lightning's setup fails (its sizes do not multiply to the world) where trainplan's 'auto' takes the rest.
    "model-parallel-auto": lambda flags, env, mine, theirs, error: (
        _lightning_auto(flags) and theirs.error and not mine.error and _precision_both_run(flags)
    ),
    # Both plan; Lightning's tensor parallelism spans each node, trainplan shards data over every process.
    "model-parallel-default": lambda flags, env, mine, theirs, error: (
        flags["strategy"] == "model_parallel"
        and flags.get("strategy_options") is None
        and not mine.error
        and not theirs.error
        and (mine.world_size, 1) == mine.mesh
        and (theirs.num_nodes, (theirs.world_size or 0) // (theirs.num_nodes or 1)) == theirs.mesh
    ),
    # Lightning's strategy refuses these precisions; trainplan plans them (with data parallelism alone).
    "model-parallel-precision": lambda flags, env, mine, theirs, error: (
        flags["strategy"] == "model_parallel"
        and not _precision_both_run(flags)
        and theirs.error
        and not mine.error
        and mine.mesh is not None
        and (str(flags["precision"]) in ("64-true", "64") or mine.mesh[-1] == 1)  # 16-mixed: data parallel alone
    ),
    # Lightning accepts DeepSpeed on CPU; trainplan's deepspeed rows run on CUDA (seen only where Lightning could
    # build it: with the deepspeed package installed).
    "deepspeed-cpu": lambda flags, env, mine, theirs, error: (
        _rule(error) == "strategy-accelerator"
        and str(flags["strategy"]).startswith("deepspeed")
        and _value(error, "accelerator") == "cpu"
        and not theirs.error
        and theirs.accelerator == "cpu"
    ),
    "xla-fsdp-trainer": lambda flags, env, mine, theirs, error: (
        flags["strategy"] == "xla_fsdp" and theirs.error and not mine.error
    ),
}


def _torch_env(env: Environment) -> bool:
    """torch's env:// variables without torchelastic's (its run id, GROUP_RANK with LOCAL_WORLD_SIZE) or SLURM's."""
    variables = env.variables
    torchelastic = "TORCHELASTIC_RUN_ID" in variables or {"GROUP_RANK", "LOCAL_WORLD_SIZE"} <= set(variables)
    stated = {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= set(variables)
    return stated and not torchelastic and "SLURM_NTASKS" not in variables


def _lightning_auto(flags: dict[str, Any]) -> bool:
    options = flags.get("strategy_options")
    sizes = [getattr(options, size.argument, None) for size in LIGHTNING_SIZES]
    return flags["strategy"] == "model_parallel" and "auto" in sizes


def _precision_both_run(flags: dict[str, Any]) -> bool:
    """A precision Lightning's ModelParallelStrategy runs (32-true, bf16-mixed, bf16-true, 16-true)."""
    return str(flags["precision"]) not in ("16-mixed", "16", "64-true", "64")


def _value(error: TrainplanError | None, name: str) -> object:
    return error.values.get(name) if isinstance(error, Incompatible) else None


def test_every_documented_difference_is_a_named_predicate() -> None:
    """The README says each difference is a predicate here: the two lists are the same."""
    assert set(EXPLAINED) == set(DIFFERENCES)


def _compare(monkeypatch: pytest.MonkeyPatch, cases: list[tuple[dict[str, Any], Environment]]) -> tuple[int, set[str]]:
    """How many cases agree, and the differences that explain the others; fails naming the first unexplained."""
    unexplained = []
    agreed = 0
    used: set[str] = set()
    for flags, env in cases:
        mine = ours(request_for(flags), env)
        theirs = lightning(monkeypatch, flags, env)
        if mine == theirs:
            agreed += 1
            continue
        error = _our_error(flags, env)
        reasons = [name for name, explains in EXPLAINED.items() if explains(flags, env, mine, theirs, error)]
        used.update(reasons)
        if not reasons:
            unexplained.append((flags, env, mine, theirs, error))
    assert not unexplained, "\n".join(
        f"{flags} on cuda={env.cuda_device_count} interactive={env.interactive} {dict(env.variables)}:\n"
        f"  trainplan {mine} ({error})\n  lightning {theirs}"
        for flags, env, mine, theirs, error in unexplained[:10]
    )
    return agreed, used


def test_trainplan_agrees_with_lightning_except_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    agreed, used = _compare(monkeypatch, sample(SAMPLE_SIZE))
    assert agreed > SAMPLE_SIZE // 2, "the sample should mostly be agreement, or it tests little"
    # The differences this sample shows (the model-parallel ones and xla_fsdp have tests of their own below).
    assert used == {
        "auto-adopts-job",
        "cluster-world-size",
        "ddp-under-cluster-with-spawn",
        "interactive-under-cluster",
        "single-device-strategy",
        "srun-task-of-a-shell-job",
        "strategy-dp",
        "torchelastic-visible-devices",
    }, used


def test_model_parallel_agrees_with_lightning_except_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model_parallel request Lightning can spell: the same plan and mesh sizes (Lightning's, as its setup
    computes them), except the three documented model-parallel differences, each of which the sample exercises."""
    agreed, used = _compare(monkeypatch, model_parallel_sample())
    assert used == {
        "model-parallel-auto",
        "model-parallel-default",
        "model-parallel-precision",
    }, used
    assert agreed > 0


def test_xla_fsdp_is_fabric_only_and_the_difference_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fabric registers `xla_fsdp`, the Trainer does not: its connector refuses the name where trainplan plans it,
    and the named predicate is what explains that."""
    from lightning_fabric.strategies import STRATEGY_REGISTRY as FABRIC_STRATEGIES
    from pytorch_lightning.strategies import StrategyRegistry as TRAINER_STRATEGIES

    assert "xla_fsdp" in FABRIC_STRATEGIES and "xla_fsdp" not in TRAINER_STRATEGIES
    flags: dict[str, Any] = {
        "accelerator": "tpu",
        "strategy": "xla_fsdp",
        "devices": 8,
        "num_nodes": 1,
        "precision": "bf16-true",
    }
    env = Environment(xla_device_count=8, cpu_count=8)
    mine, theirs = ours(request_for(flags), env), lightning(monkeypatch, flags, env)
    assert (mine.family, mine.launcher, mine.world_size) == ("xla_fsdp", "xla", 8) and theirs.error
    explained = [name for name, explains in EXPLAINED.items() if explains(flags, env, mine, theirs, None)]
    assert explained == ["xla-fsdp-trainer"]


def test_torchelastic_without_group_rank_is_read_node_after_node_where_lightning_says_node_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both find a torchelastic worker by its run id; Lightning's node rank is GROUP_RANK or 0, trainplan's RANK //
    LOCAL_WORLD_SIZE (the same on the first node), and a worker out of blocks is refused naming GROUP_RANK."""
    from lightning_fabric.plugins.environments import TorchElasticEnvironment

    base = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    base |= {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    monkeypatch.delenv("GROUP_RANK", raising=False)
    for rank, local_rank, mine_node in (("1", "1", 0), ("3", "1", 1), ("3", "0", None)):
        variables = {**base, "RANK": rank, "LOCAL_RANK": local_rank}
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        theirs = TorchElasticEnvironment()
        assert TorchElasticEnvironment.detect() and theirs.node_rank() == 0 and theirs.global_rank() == int(rank)
        env = Environment(cpu_count=8, variables=variables)
        flags: dict[str, Any] = {"accelerator": "cpu", "strategy": "auto", "devices": "auto", "num_nodes": "auto"}
        error = _our_error(flags | {"precision": "32-true"}, env)
        if mine_node is None:
            explained = [
                name
                for name, explains in EXPLAINED.items()
                if explains(flags, env, ours(Request(accelerator="cpu"), env), Outcome(error=False), error)
            ]
            assert explained == ["torchelastic-without-group-rank"]
            continue
        plan = resolve(Request(accelerator="cpu"), env)
        assert (plan.cluster.kind, plan.world_size) == ("torchelastic", theirs.world_size())
        assert (plan.cluster.node_rank, plan.cluster.global_rank) == (mine_node, theirs.global_rank())


def test_torch_env_variables_are_the_world_here_and_num_nodes_times_devices_in_lightning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both take RANK, WORLD_SIZE and LOCAL_RANK without torchelastic's variables for processes started externally
    (Lightning: LightningEnvironment, by LOCAL_RANK); Lightning's world is the flags' and its node NODE_RANK or 0,
    trainplan's the variables' (the same where the flags agree), its node NODE_RANK or RANK // LOCAL_WORLD_SIZE; a
    process whose node is unknown is refused here, planned as node 0 there: the named difference explains both."""
    from lightning_fabric.plugins.environments import LightningEnvironment

    base = {"WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    for name in ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    flags: dict[str, Any] = {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 2}
    flags |= {"precision": "32-true"}
    for extra, node in (({"LOCAL_WORLD_SIZE": "2"}, 1), ({"NODE_RANK": "1"}, 1), ({}, None)):
        variables = {**base, "RANK": "3", "LOCAL_RANK": "1", **extra}
        env = Environment(cpu_count=8, variables=variables)
        with monkeypatch.context() as patch:
            for name, value in variables.items():
                patch.setenv(name, value)
            assert LightningEnvironment().creates_processes_externally
        mine, theirs = ours(request_for(flags), env), lightning(monkeypatch, flags, env)
        assert (theirs.cluster, theirs.launcher, theirs.world_size) == ("local", "external", 4)
        error = _our_error(flags, env)
        explained = [name for name, explains in EXPLAINED.items() if explains(flags, env, mine, theirs, error)]
        assert explained == ["torch-env-detected"], (extra, mine, error)
        if node is None:
            assert isinstance(error, ClusterEnvironmentError) and error.variable == "NODE_RANK"
            continue
        plan = resolve(request_for(flags), env)
        assert (plan.cluster.kind, plan.launcher, plan.world_size) == ("torch_env", "external", theirs.world_size)
        assert (plan.cluster.node_rank, plan.cluster.global_rank, plan.cluster.local_rank) == (node, 3, 1)
