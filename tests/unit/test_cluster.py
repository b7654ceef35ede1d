"""Cluster environments read from environment variables: detection order, ranks, addresses, ports."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, get_args

import attrs
import pytest

from tests.helpers import LAUNCHED_1_OF_2, SLURM_2x4, TORCHRUN_2x2, cpu, cuda, plan_for
from trainplan import (
    BUILTIN_RULES,
    ClusterEnvironmentError,
    ClusterName,
    CustomName,
    Incompatible,
    InvalidRequest,
    Plan,
    PlanFormatError,
    Request,
    Unavailable,
)
from trainplan.effects.probing import relevant_variables
from trainplan.mapping.workers import worker_environment
from trainplan.resolve import cluster as cluster_module
from trainplan.resolve import expand_hostlist, resolve_uncached
from trainplan.resolve.cluster import detect
from trainplan.rules import (
    CLUSTERS,
    LAUNCHED_WORKERS,
    PROCESS_TREE_FACTS,
    ClusterRule,
    DefaultPort,
    JobPort,
    JobVariable,
    JobVariables,
    NotATask,
    VariableFormat,
    job_variables,
)

# What some launchers set: torchrun's rank variables and torchelastic's run id, without GROUP_RANK.
WITHOUT_GROUP_RANK: Mapping[str, str] = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "x",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


class TestHostlist:
    @pytest.mark.parametrize(
        ("text", "hosts"),
        [
            ("node1", ["node1"]),
            ("node[001-004,7],gpu2", ["node001", "node002", "node003", "node004", "node7", "gpu2"]),
            ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
            ("n[09-11]", ["n09", "n10", "n11"]),
            ("x,y", ["x", "y"]),
        ],
    )
    def test_expansion(self, text: str, hosts: list[str]) -> None:
        assert expand_hostlist(text) == hosts

    @pytest.mark.parametrize(
        ("text", "words"),
        [
            ("node[1-", "a '[' is not closed"),
            ("node]1[", "a ']' has no matching '['"),
            ("n[4-2]", "the range '4-2' in 'n[4-2]' runs backwards"),
            ("n[a-b]", "'a-b' in 'n[a-b]' is not a number"),
            ("", "the host list is empty"),
            ("n[[1]]", "brackets cannot nest"),
        ],
    )
    def test_malformed_lists_say_where(self, text: str, words: str) -> None:
        with pytest.raises(ValueError, match=re.escape(words)):
            expand_hostlist(text)

    def test_a_list_of_exactly_the_most_hosts_is_expanded_and_one_more_is_refused(self) -> None:
        assert len(expand_hostlist("n[1-50000],m[1-50000]")) == cluster_module.MAX_HOSTS == 100_000
        with pytest.raises(ValueError, match="names more than 100000 hosts"):
            expand_hostlist("n[1-50000],m[1-50001]")


class TestDetection:
    """Order: torchelastic > SLURM > LSF > MPI > local; Kubeflow only on request."""

    def test_torchelastic_wins_inside_slurm(self) -> None:
        assert detect("auto", {**SLURM_2x4, **TORCHRUN_2x2}).kind == "torchelastic"

    @pytest.mark.parametrize("name", ["bash", "interactive"])
    def test_an_srun_task_is_a_slurm_task_whatever_the_job_is_called(self, name: str) -> None:
        # `srun bash -c ...` names the job "bash", salloc "interactive": its srun tasks are still SLURM's.
        facts = detect("auto", {**SLURM_2x4, "SLURM_JOB_NAME": name})
        assert (facts.kind, facts.world_size, facts.global_rank, facts.notes) == ("slurm", 8, 5, ())

    def test_the_allocation_shell_plans_alone_with_a_warning(self) -> None:
        shell = {key: value for key, value in SLURM_2x4.items() if key not in {"SLURM_STEP_ID", "SLURM_PROCID"}}
        facts = detect("auto", {**shell, "SLURM_JOB_NAME": "interactive"})
        assert facts.kind == "local"
        assert [(note.code, note.level) for note in facts.notes] == [("slurm-allocation-shell", "warning")]
        assert "start the script with srun" in facts.notes[0].message

    def test_local_ignores_cluster_variables(self) -> None:
        assert detect("local", SLURM_2x4).kind == "local"

    def test_lightning_names_this_machine_as_local_does(self) -> None:
        # Lightning's LightningEnvironment: this machine, whatever cluster variables are set.
        plan = plan_for(cpu(variables=SLURM_2x4), cluster="lightning")
        assert (plan.cluster.kind, plan.request.cluster, plan.launcher) == ("local", "local", "none")

    def test_the_plan_says_whether_this_machine_was_asked_for_or_found(self) -> None:
        assert plan_for(cpu(), cluster="local").reasons["cluster"] == "cluster='local' was asked for"
        assert plan_for(cpu()).reasons["cluster"] == (
            "no cluster manager's variables were found (torchrun, MPI, SLURM, Kubeflow, LSF, env:// launcher)"
        )

    def test_a_cluster_found_after_passing_anothers_non_task_keeps_its_own_reason(self) -> None:
        # A Kubeflow pod that also carries a SLURM allocation's variables (SLURM_JOB_ID, no task of it): the pod's
        # world, with a note about SLURM's, never "no cluster manager started this process".
        pod = {"KUBERNETES_PORT": "x", "MASTER_ADDR": "m", "MASTER_PORT": "1234", "WORLD_SIZE": "2", "RANK": "1"}
        facts = detect("auto", {**pod, "SLURM_JOB_ID": "9", "SLURM_NNODES": "1"})
        assert (facts.kind, facts.reason) == ("kubeflow", "Kubeflow was detected")
        assert [note.code for note in facts.notes] == ["slurm-allocation-shell"]

    def test_a_variables_value_is_cut_to_64_characters_in_a_note(self) -> None:
        facts = detect("auto", {"SLURM_JOB_ID": "9" * 100, "SLURM_NNODES": "1"})
        assert f"allocation {'9' * 64} (salloc)" in facts.notes[0].message

    def test_a_kubeflow_pod_is_detected_but_not_a_bare_pod(self) -> None:
        variables = {"KUBERNETES_PORT": "x", "MASTER_ADDR": "m", "MASTER_PORT": "1234", "WORLD_SIZE": "2", "RANK": "0"}
        assert detect("auto", variables).kind == "kubeflow"
        assert detect("auto", {"KUBERNETES_PORT": "x"}).kind == "local"
        # The same env:// variables set by hand outside Kubernetes: this machine, not a pod.
        without_kubernetes = {key: value for key, value in variables.items() if key != "KUBERNETES_PORT"}
        assert detect("auto", without_kubernetes).kind == "local"
        torchrun_in_a_pod = {**variables, "LOCAL_RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
        assert detect("auto", torchrun_in_a_pod).kind == "torchelastic"
        assert detect("kubeflow", variables).kind == "kubeflow"

    def test_mpi_by_pmi_variables(self) -> None:
        facts = detect("auto", {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
        assert (facts.kind, facts.global_rank, facts.main_address) == ("mpi", 1, "127.0.0.1")


class TestSlurm:
    def test_plan_inside_a_two_node_job(self) -> None:
        plan = plan_for(cuda(4, variables=SLURM_2x4), devices=4, num_nodes=2)
        cluster = plan.cluster
        assert (plan.launcher, plan.world_size, cluster.kind) == ("external", 8, "slurm")
        assert (cluster.global_rank, cluster.local_rank, cluster.node_rank) == (5, 1, 1)
        assert cluster.main_address == "node001"
        assert cluster.main_port == 15000 + 4567

    def test_port_without_job_id_and_with_master_port(self) -> None:
        without = {key: value for key, value in SLURM_2x4.items() if key != "SLURM_JOB_ID"}
        assert detect("slurm", without).main_port == 12910
        assert detect("slurm", {**SLURM_2x4, "MASTER_PORT": "4000"}).main_port == 4000

    @pytest.mark.parametrize("job_id", ["", " "])
    def test_a_blank_job_id_is_no_job_id(self, job_id: str) -> None:
        assert detect("slurm", {**SLURM_2x4, "SLURM_JOB_ID": job_id}).main_port == 12910

    def test_tasks_per_node_with_repeat_count(self) -> None:
        assert detect("slurm", {**SLURM_2x4, "SLURM_NTASKS_PER_NODE": "4(x2)"}).processes_per_node == 4

    def test_uneven_tasks_per_node_is_named(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("slurm", {**SLURM_2x4, "SLURM_NTASKS_PER_NODE": "4(x1),2"})
        assert caught.value.variable == "SLURM_NTASKS_PER_NODE"

    def test_uneven_tasks_per_node_names_each_group_of_nodes(self) -> None:
        """Nodes with the same count are one group, named by its first and last host."""
        uneven = {**SLURM_2x4, "SLURM_NTASKS": "5", "SLURM_NNODES": "3", "SLURM_NODELIST": "node[001-003]"}
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("slurm", {**uneven, "SLURM_NTASKS_PER_NODE": "2(x2),1", "SLURM_PROCID": "1", "SLURM_NODEID": "0"})
        assert "SLURM put 2 tasks on each of 2 nodes (node001 … node002) and 1 task on node003 " in str(caught.value)
        assert "srun --nodes=3 --ntasks-per-node=2 (6 tasks)" in str(caught.value)

    def test_missing_rank_is_named(self) -> None:
        variables = {key: value for key, value in SLURM_2x4.items() if key != "SLURM_LOCALID"}
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("slurm", variables)
        assert caught.value.variable == "SLURM_LOCALID"
        assert "not set" in str(caught.value)

    def test_bad_nodelist_is_named(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("slurm", {**SLURM_2x4, "SLURM_NODELIST": "node[1-"})
        assert caught.value.variable == "SLURM_NODELIST"


class TestTorchelastic:
    def test_plan_inside_torchrun(self) -> None:
        plan = plan_for(cuda(2, variables=TORCHRUN_2x2), devices=2, num_nodes=2)
        assert plan.launcher == "external"
        assert (plan.cluster.global_rank, plan.cluster.local_rank, plan.cluster.node_rank) == (3, 1, 1)
        assert (plan.cluster.main_address, plan.cluster.main_port) == ("10.0.0.1", 29500)
        assert plan.device_for(1) == "cuda:1"

    @pytest.mark.parametrize(
        ("variable", "value", "words"),
        [
            ("RANK", "x", "whole number"),
            ("RANK", "4", "WORLD_SIZE=4"),
            ("LOCAL_RANK", "2", "LOCAL_WORLD_SIZE=2"),
            ("MASTER_PORT", "0", "65535"),
            ("MASTER_PORT", "65536", "65535"),
            ("WORLD_SIZE", "0", "at least 1"),
            ("GROUP_WORLD_SIZE", "0", "at least 1"),
            ("MASTER_ADDR", " ", "host name"),
            ("MASTER_ADDR", "[node1]", "host name"),  # brackets hold an IPv6 address only
        ],
    )
    def test_garbage_names_the_variable(self, variable: str, value: str, words: str) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**TORCHRUN_2x2, variable: value})
        assert caught.value.variable == variable and words in str(caught.value)

    def test_a_node_rank_beyond_the_nodes_names_its_variable(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**TORCHRUN_2x2, "GROUP_WORLD_SIZE": "2", "GROUP_RANK": "2"})
        assert caught.value.variable == "GROUP_RANK" and "smaller than GROUP_WORLD_SIZE=2" in str(caught.value)

    @pytest.mark.parametrize(("rank", "local_rank", "node_rank"), [("1", "1", 0), ("2", "0", 1), ("3", "1", 1)])
    def test_without_group_rank_the_world_stated_is_planned_node_after_node(
        self, rank: str, local_rank: str, node_rank: int
    ) -> None:
        variables = {**WITHOUT_GROUP_RANK, "RANK": rank, "LOCAL_RANK": local_rank}
        plan = plan_for(cpu(variables=variables), accelerator="cpu")
        assert (plan.cluster.kind, plan.launcher, plan.world_size, plan.num_nodes) == ("torchelastic", "external", 4, 2)
        cluster = plan.cluster
        assert (cluster.node_rank, cluster.global_rank, cluster.local_rank) == (node_rank, int(rank), int(local_rank))
        (note,) = (note for note in plan.notes if note.code == "cluster-node-rank-inferred")
        assert f"GROUP_RANK is not set: node rank {node_rank} inferred from RANK={rank}" in note.message

    def test_without_group_rank_ranks_out_of_blocks_are_refused_naming_it(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**WITHOUT_GROUP_RANK, "RANK": "3", "LOCAL_RANK": "0"})
        assert caught.value.variable == "GROUP_RANK"
        assert "RANK=3, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2" in caught.value.reason
        assert "GROUP_RANK=<this node's rank>" in caught.value.fix

    @pytest.mark.parametrize("missing", ["WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
    def test_the_run_id_with_a_rank_names_what_else_is_missing(self, missing: str) -> None:
        variables = {name: value for name, value in WITHOUT_GROUP_RANK.items() if name != missing}
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", variables)
        assert caught.value.variable == missing and "torchrun" in str(caught.value)

    def test_a_stale_run_id_without_a_rank_is_no_torchelastic_worker(self) -> None:
        # A run id left in a shell's environment (no RANK): not a worker, so SLURM's task is SLURM's.
        assert detect("auto", {"TORCHELASTIC_RUN_ID": "x"}).kind == "local"
        assert detect("auto", {**SLURM_2x4, "TORCHELASTIC_RUN_ID": "x"}).kind == "slurm"

    @pytest.mark.parametrize("port", [1, 65535])
    def test_every_tcp_port_is_a_main_port(self, port: int) -> None:
        assert detect("auto", {**TORCHRUN_2x2, "MASTER_PORT": str(port)}).main_port == port


# What a launcher that sets torch's env:// variables alone gives a process (DeepSpeed's, torch.distributed.launch
# --use_env, a hand-written wrapper): no TORCHELASTIC_RUN_ID, no GROUP_RANK.
TORCH_ENV_2x2: Mapping[str, str] = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


class TestTorchEnv:
    """A process with RANK, WORLD_SIZE and LOCAL_RANK and no cluster manager's variables is one rank of the world they
    state (torch's env://), found after every named cluster manager; its node is NODE_RANK or GROUP_RANK, else RANK //
    LOCAL_WORLD_SIZE, else unknown and refused."""

    def test_the_world_the_variables_state_is_planned_not_a_lone_process(self) -> None:
        plan = plan_for(cpu(variables=TORCH_ENV_2x2), accelerator="cpu")
        assert (plan.cluster.kind, plan.launcher, plan.world_size, plan.num_nodes) == ("torch_env", "external", 4, 2)
        cluster = plan.cluster
        assert (cluster.global_rank, cluster.local_rank, cluster.node_rank) == (1, 1, 0)
        assert (cluster.main_address, cluster.main_port) == ("10.0.0.1", 29500)
        (note,) = (note for note in plan.notes if note.code == "cluster-node-rank-inferred")
        assert note.level == "info"
        assert "NODE_RANK is not set: node rank 0 inferred from RANK=1, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2" in (
            note.message
        )
        assert plan.reasons["cluster"].startswith("torch's env:// variables were detected")

    def test_a_stated_node_rank_is_read(self) -> None:
        plan = plan_for(cpu(variables={**TORCH_ENV_2x2, "RANK": "3", "NODE_RANK": "1"}), accelerator="cpu")
        assert (plan.cluster.kind, plan.cluster.node_rank, plan.cluster.global_rank) == ("torch_env", 1, 3)
        assert "cluster-node-rank-inferred" not in {note.code for note in plan.notes}

    @pytest.mark.parametrize("variable", ["NODE_RANK", "GROUP_RANK"])
    def test_a_node_rank_without_local_world_size_takes_the_layout_asked_for(self, variable: str) -> None:
        # (GROUP_RANK with LOCAL_WORLD_SIZE is torchrun's set of variables: torchelastic's row reads it.)
        variables = {name: value for name, value in TORCH_ENV_2x2.items() if name != "LOCAL_WORLD_SIZE"}
        variables |= {"RANK": "3", variable: "1"}
        plan = plan_for(cpu(variables=variables), accelerator="cpu", devices=2, num_nodes=2)
        assert (plan.cluster.kind, plan.world_size, plan.cluster.node_rank) == ("torch_env", 4, 1)

    def test_without_node_rank_or_local_world_size_the_node_is_unknown_and_refused(self) -> None:
        variables = {name: value for name, value in TORCH_ENV_2x2.items() if name != "LOCAL_WORLD_SIZE"}
        with pytest.raises(ClusterEnvironmentError) as caught:
            plan_for(cpu(variables=variables), accelerator="cpu", devices=2, num_nodes=2)
        assert caught.value.variable == "NODE_RANK"
        assert "nor LOCAL_WORLD_SIZE" in caught.value.reason and "RANK=1, LOCAL_RANK=1" in caught.value.reason
        assert "NODE_RANK=<this node's rank>" in caught.value.fix and "LOCAL_WORLD_SIZE=" in caught.value.fix

    @pytest.mark.parametrize(
        ("changes", "variable", "words"),
        [
            ({"RANK": "4"}, "RANK", "smaller than WORLD_SIZE=4"),
            ({"LOCAL_RANK": "2"}, "LOCAL_RANK", "smaller than LOCAL_WORLD_SIZE=2"),
            # Out of blocks without a node rank: the node is unknown.
            ({"RANK": "3", "LOCAL_RANK": "0"}, "NODE_RANK", "RANK=3, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2"),
            # A stated node rank that the ranks contradict, either way.
            ({"RANK": "3", "LOCAL_RANK": "0", "NODE_RANK": "1"}, "LOCAL_RANK", "is local rank 1 of node 1"),
            ({"RANK": "3", "NODE_RANK": "0"}, "NODE_RANK", "global rank 3 is on node 1"),
            ({"WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE", "3 does not split into nodes of 2"),
        ],
    )
    def test_inconsistent_values_are_refused_with_the_numbers(
        self, changes: dict[str, str], variable: str, words: str
    ) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**TORCH_ENV_2x2, **changes})
        assert caught.value.variable == variable and words in str(caught.value), caught.value

    def test_torchruns_group_rank_is_checked_against_its_ranks_too(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**TORCHRUN_2x2, "GROUP_RANK": "0"})
        assert caught.value.variable == "GROUP_RANK" and "global rank 3 is on node 1" in str(caught.value)

    def test_rank_and_world_size_without_local_rank_plan_this_machine_alone_with_a_warning(self) -> None:
        plan = plan_for(cpu(variables={"RANK": "1", "WORLD_SIZE": "4"}), accelerator="cpu")
        assert (plan.cluster.kind, plan.world_size, plan.cluster.global_rank) == ("local", 1, 0)
        (note,) = (note for note in plan.notes if note.code == "env-without-local-rank")
        assert note.level == "warning" and "RANK=1 and WORLD_SIZE=4 are set without LOCAL_RANK" in note.message
        assert "env:// launcher's variables are set, but it is not one of its tasks" in plan.reasons["cluster"]
        alone = plan_for(cpu(variables={"RANK": "0", "WORLD_SIZE": "1"}), accelerator="cpu")
        assert {note.code: note.level for note in alone.notes}["env-without-local-rank"] == "info"

    def test_asked_for_by_name_without_local_rank_it_names_it(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("torch_env", {"RANK": "1", "WORLD_SIZE": "4"})
        assert caught.value.variable == "LOCAL_RANK" and "LOCAL_RANK=<this process's index" in caught.value.fix

    @pytest.mark.parametrize(
        ("others", "kind"),
        [
            (TORCHRUN_2x2, "torchelastic"),
            ({"TORCHELASTIC_RUN_ID": "x"}, "torchelastic"),
            (SLURM_2x4, "slurm"),
            ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "mpi"),
            ({"PMI_SIZE": "4", "PMI_RANK": "1", "MPI_LOCALNRANKS": "2"}, "mpi"),
            ({"KUBERNETES_PORT": "tcp://10.0.0.9:443", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "kubeflow"),
            (
                {"LSB_JOBID": "1", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "1"}
                | {"JSM_NAMESPACE_LOCAL_RANK": "1", "LSB_MCPU_HOSTS": "b 1 c1 2 c2 2"},
                "lsf",
            ),
        ],
    )
    def test_every_named_cluster_manager_is_found_first(self, others: Mapping[str, str], kind: str) -> None:
        assert detect("auto", {**TORCH_ENV_2x2, **others}).kind == kind

    def test_a_worker_trainplan_launched_is_trainplans(self) -> None:
        facts = detect("auto", LAUNCHED_1_OF_2)
        assert (facts.kind, facts.launched) == ("local", True)

    def test_without_master_port_one_node_meets_on_torchs_port_and_several_are_refused(self) -> None:
        one_node = {**TORCH_ENV_2x2, "WORLD_SIZE": "2"}
        del one_node["MASTER_PORT"], one_node["MASTER_ADDR"]
        plan = plan_for(cpu(variables=one_node), accelerator="cpu")
        assert (plan.cluster.main_address, plan.cluster.main_port, plan.num_nodes) == ("127.0.0.1", 29500, 1)
        assert "env-default-port" in {note.code for note in plan.notes}
        two_nodes = {name: value for name, value in TORCH_ENV_2x2.items() if name != "MASTER_PORT"}
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", two_nodes)
        assert caught.value.variable == "MASTER_PORT"
        without_address = {name: value for name, value in TORCH_ENV_2x2.items() if name != "MASTER_ADDR"}
        with pytest.raises(Incompatible) as refused:
            plan_for(cpu(variables=without_address), accelerator="cpu")
        assert refused.value.rule == "cluster-main-address" and "MASTER_ADDR=" in str(refused.value)

    def test_another_layout_asked_for_is_refused_with_the_launch_line(self) -> None:
        with pytest.raises(Incompatible) as caught:
            plan_for(cpu(variables=TORCH_ENV_2x2), accelerator="cpu", devices=4, num_nodes=1)
        assert caught.value.rule == "cluster-world-size"
        assert "4 processes, 4 on each of 1 node(s)" in str(caught.value), caught.value


class TestOthers:
    def test_lsf_hosts_skip_the_launch_node(self) -> None:
        variables = {
            "LSB_JOBID": "4321",
            "JSM_NAMESPACE_SIZE": "4",
            "JSM_NAMESPACE_RANK": "3",
            "JSM_NAMESPACE_LOCAL_RANK": "1",
            "LSB_MCPU_HOSTS": "batch1 1 c1 42 c2 42",
        }
        plan = plan_for(cuda(2, variables=variables), devices=2, num_nodes=2)
        assert (plan.cluster.kind, plan.cluster.main_address, plan.cluster.main_port) == ("lsf", "c1", 10321)
        assert (plan.cluster.node_rank, plan.cluster.global_rank) == (1, 3)

    def test_lsf_on_one_host_runs_there(self) -> None:
        job = {"LSB_JOBID": "4321", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "3"}
        job |= {"JSM_NAMESPACE_LOCAL_RANK": "3", "LSB_MCPU_HOSTS": "node1 4"}
        facts = detect("auto", job)
        assert (facts.kind, facts.main_address, facts.num_nodes) == ("lsf", "node1", 1)
        with pytest.raises(ClusterEnvironmentError, match="not a list of 'host count' pairs") as caught:
            detect("auto", {**job, "LSB_MCPU_HOSTS": "batch1 1 c1"})
        assert caught.value.variable == "LSB_MCPU_HOSTS"

    def test_jsrun_with_open_mpi_variables_is_lsfs_job(self) -> None:
        # jsrun starts Spectrum MPI's ranks with Open MPI's variables too: the same world, and LSF's row knows the
        # hosts and the node of each rank.
        lsf = {"LSB_JOBID": "4321", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "3"}
        lsf |= {"JSM_NAMESPACE_LOCAL_RANK": "1", "LSB_MCPU_HOSTS": "batch1 1 c1 42 c2 42"}
        ompi = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
        ompi |= {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        plan = plan_for(cpu(variables={**lsf, **ompi}), accelerator="cpu")
        assert (plan.cluster.kind, plan.cluster.main_address, plan.cluster.node_rank) == ("lsf", "c1", 1)
        assert (plan.cluster.global_rank, plan.num_nodes) == (3, 2)

    def test_local_reads_group_rank_when_node_rank_is_unset(self) -> None:
        # As Lightning's LightningEnvironment: NODE_RANK, else GROUP_RANK.
        variables = {"GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
        plan = plan_for(cpu(variables=variables), accelerator="cpu", devices=2, num_nodes=2)
        assert (plan.cluster.kind, plan.cluster.node_rank) == ("local", 1)

    def test_local_multi_node_reads_node_rank_and_warns_without_address(self) -> None:
        plan = plan_for(cpu(variables={"NODE_RANK": "1"}), accelerator="cpu", devices=2, num_nodes=2)
        assert (plan.cluster.node_rank, plan.launcher, plan.world_size) == (1, "subprocess", 4)
        assert "multi-node-local" in {note.code for note in plan.notes}

    def test_an_mpi_local_rank_beyond_the_devices_asked_for_is_refused(self) -> None:
        # Open MPI without OMPI_COMM_WORLD_LOCAL_SIZE: the request's devices are the processes per node, so local
        # ranks run from 0 to devices - 1.
        mpi = {
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_RANK": "3",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
        }
        last = plan_for(cpu(variables={**mpi, "OMPI_COMM_WORLD_LOCAL_RANK": "1"}), devices=2, num_nodes=2)
        assert (last.cluster.kind, last.world_size, last.cluster.local_rank) == ("mpi", 4, 1)
        with pytest.raises(Incompatible) as caught:
            plan_for(cpu(variables={**mpi, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}), devices=2, num_nodes=2)
        assert caught.value.rule == "cluster-rank-range"
        assert "local rank 2" in str(caught.value) and "devices=3" in str(caught.value)

    def test_mpi_default_port_is_noted(self) -> None:
        variables = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        plan = plan_for(cpu(variables=variables), accelerator="cpu", devices=2)
        assert plan.cluster.main_port == 29500
        assert "mpi-default-port" in {note.code for note in plan.notes}


class TestClustersAreRows:
    """Each row names the variables its processes carry (its schema); the module reads rows, not names."""

    def test_every_format_has_one_parser_and_every_variable_a_format_its_fact_reads(self) -> None:
        numbers, addresses = cluster_module._NUMBER_FORMATS, cluster_module._ADDRESS_FORMATS
        assert set(numbers) | set(addresses) == set(get_args(VariableFormat))
        for schema in (*(schema for rule in CLUSTERS.values() for schema in rule.schemas), LAUNCHED_WORKERS.schema):
            for fact, source in job_variables(schema):
                assert source.format in (addresses if fact == "main_address" else numbers), (schema.label, fact)

    def test_the_probe_copies_every_variable_a_row_names(self) -> None:
        named = {name for rule in CLUSTERS.values() for group in rule.detect_variables for name in group}
        for schema in (*(schema for rule in CLUSTERS.values() for schema in rule.schemas), LAUNCHED_WORKERS.schema):
            named |= {name for _, source in job_variables(schema) for name in source.names}
        assert len(named) > 30
        # The process tree's facts (the MPI proxy, its nodes) are written by the probe itself: never copied.
        assert set(relevant_variables(dict.fromkeys(named, "1"))) == named - set(PROCESS_TREE_FACTS)

    def test_a_launcher_writes_what_its_workers_read(self) -> None:
        plan = plan_for(cpu(), accelerator="cpu", devices=2)
        variables = worker_environment(
            plan, local_rank=1, main_port=29555, visible_devices=None, visible_count=0, launcher="subprocess"
        )
        read = {name for _, source in job_variables(LAUNCHED_WORKERS.schema) for name in source.names}
        assert read | set(LAUNCHED_WORKERS.also_written) <= set(variables)
        assert (variables["ROLE_RANK"], variables["ROLE_WORLD_SIZE"]) == ("1", "2")  # torchelastic's role variables
        facts = detect("auto", variables)
        assert (facts.launched, facts.kind, facts.launch_hint) == (True, "local", LAUNCHED_WORKERS.launch_hint)
        assert (facts.global_rank, facts.local_rank, facts.world_size, facts.main_port) == (1, 1, 2, 29555)

    def test_a_workers_reason_names_its_launcher_as_the_marker_does_without_blanks(self) -> None:
        facts = detect("auto", {**LAUNCHED_1_OF_2, "TRAINPLAN_LAUNCHED": " subprocess\n"})
        assert facts.reason == (
            "this process is worker 1 of 2 that trainplan's 'subprocess' launcher started (TRAINPLAN_LAUNCHED is set)"
        )

    def test_the_readers_facts_carry_their_rows_hint_and_kind(self) -> None:
        cases: tuple[tuple[ClusterName, Mapping[str, str]], ...] = (
            ("slurm", SLURM_2x4),
            ("torchelastic", TORCHRUN_2x2),
            ("local", {}),
        )
        for name, variables in cases:
            facts = detect(name, variables)
            assert facts.kind == name and facts.launch_hint == CLUSTERS[name].launch_hint

    def test_job_ports_follow_the_rows_formula(self) -> None:
        slurm, lsf = CLUSTERS["slurm"].job_port, CLUSTERS["lsf"].job_port
        assert slurm is not None and lsf is not None
        job = {**SLURM_2x4, "SLURM_JOB_ID": "98761234"}
        job.pop("MASTER_PORT", None)
        assert detect("slurm", job).main_port == slurm.base + 98761234 % slurm.modulo == 15000 + 1234
        lsf_job = {"LSB_JOBID": "4321", "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_RANK": "0"}
        lsf_job |= {"JSM_NAMESPACE_LOCAL_RANK": "0"}
        assert detect("lsf", lsf_job).main_port == lsf.base + 4321 % lsf.modulo == 10000 + 321


PBS_NAME = CustomName("pbs")

PBS = ClusterRule(
    name=PBS_NAME,
    description="PBS, processes started by pbsdsh (invented for this test)",
    detect_variables=(frozenset({"PBS_JOBNUM", "PBS_TASKNUM"}),),
    detect_priority=8,
    creates_processes=True,
    node_rank_variable="PBS_NODENUM",
    schemas=(
        JobVariables(
            label="PBS",
            reason="PBS was {how} (PBS_JOBNUM and PBS_TASKNUM are set)",
            world_size=JobVariable(names=("PBS_NP",), required=True),
            processes_per_node=JobVariable(names=("PBS_NUM_PPN",), required=True),
            global_rank=JobVariable(names=("PBS_TASKNUM",), required=True),
            local_rank=JobVariable(names=("PBS_VNODENUM",), required=True),
            node_rank=JobVariable(names=("PBS_NODENUM",), required=True),
            main_address=(JobVariable(names=("PBS_MOM_HOST",), format="host"),),
            main_port=JobVariable(names=("PBS_PORT",), format="port"),
            job_id=JobVariable(names=("PBS_JOBNUM",), required=True),
        ),
    ),
    launch_hint="qsub -l nodes={num_nodes}:ppn={processes_per_node}",
    job_port=JobPort(base=20000, modulo=1000),
)
"""A cluster trainplan does not know, with plain integer variables: one row, and nothing else."""

PBS_RULES = BUILTIN_RULES.extend(clusters=[PBS])
"""A rule set with the row, added by value."""

PBS_JOB = {
    "PBS_JOBNUM": "4321",
    "PBS_NP": "8",
    "PBS_NUM_PPN": "4",
    "PBS_TASKNUM": "5",
    "PBS_VNODENUM": "1",
    "PBS_NODENUM": "1",
    "PBS_MOM_HOST": "mom01",
}
"""Task 5 of a 2-node job with 4 tasks per node."""


class TestANewClusterIsOneRow:
    """A cluster manager with plain integer variables is one `ClusterRule` row: detected, read, checked and
    refused through the same reader as the built-in ones."""

    def test_a_job_under_it_resolves_to_its_layout(self) -> None:
        plan = resolve_uncached(Request(accelerator="cpu"), cpu(variables=PBS_JOB), PBS_RULES)
        cluster = plan.cluster
        assert (cluster.kind, plan.launcher, plan.world_size, plan.num_nodes, plan.processes_per_node) == (
            "pbs",
            "external",
            8,
            2,
            4,
        )
        assert (cluster.global_rank, cluster.local_rank, cluster.node_rank) == (5, 1, 1)
        assert (cluster.main_address, cluster.main_port) == ("mom01", 20000 + 4321 % 1000)
        assert plan.reasons["cluster"] == "PBS was detected (PBS_JOBNUM and PBS_TASKNUM are set)"

    def test_the_built_in_rules_do_not_know_it(self) -> None:
        plan = resolve_uncached(Request(accelerator="cpu"), cpu(variables=PBS_JOB), BUILTIN_RULES)
        assert plan.cluster.kind == "local"
        assert detect("auto", PBS_JOB, PBS_RULES).reason.startswith("PBS was detected")
        alone = detect("auto", {}, PBS_RULES).reason
        managers = "PBS, torchrun, MPI, SLURM, Kubeflow, LSF, env:// launcher"
        assert alone == f"no cluster manager's variables were found ({managers})"

    @pytest.mark.parametrize(
        ("variable", "value", "words"),
        [
            ("PBS_TASKNUM", "five", "whole number"),
            ("PBS_TASKNUM", "8", "smaller than PBS_NP=8"),
            ("PBS_VNODENUM", "4", "smaller than PBS_NUM_PPN=4"),
            ("PBS_NUM_PPN", "0", "at least 1"),
            ("PBS_PORT", "70000", "65535"),
            ("PBS_MOM_HOST", "mom01:22", "host name"),
        ],
    )
    def test_garbage_names_the_variable(self, variable: str, value: str, words: str) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            resolve_uncached(Request(accelerator="cpu"), cpu(variables={**PBS_JOB, variable: value}), PBS_RULES)
        assert (caught.value.variable, caught.value.cluster) == (variable, "PBS")
        assert words in str(caught.value)

    def test_a_missing_variable_is_named(self) -> None:
        variables = {name: value for name, value in PBS_JOB.items() if name != "PBS_NP"}
        with pytest.raises(ClusterEnvironmentError, match="Start the processes with the PBS launcher"):
            detect("auto", variables, PBS_RULES)

    def test_another_layout_is_refused_with_its_launch_hint(self) -> None:
        request = Request(accelerator="cpu", devices=2, num_nodes=2)
        with pytest.raises(Incompatible) as caught:
            resolve_uncached(request, cpu(variables=PBS_JOB), PBS_RULES)
        assert caught.value.rule == "cluster-world-size"
        assert "qsub -l nodes=2:ppn=2" in str(caught.value)

    def test_its_plan_reads_back_from_json_with_its_rule_set_and_is_refused_by_name_without_it(self) -> None:
        plan = resolve_uncached(Request(accelerator="cpu"), cpu(variables=PBS_JOB), PBS_RULES)
        assert Plan.from_dict(plan.to_dict(), rules=PBS_RULES) == plan
        assert Plan.from_dict(plan.to_dict()) == plan  # a downstream plan, its rule set not at hand: its own facts
        with pytest.raises(PlanFormatError) as caught:
            Plan.from_dict(plan.to_dict(), rules=BUILTIN_RULES)
        assert caught.value.path == "plan.cluster.kind" and "the rule set has no cluster 'pbs'" in str(caught.value)

    def test_a_request_may_name_it_in_its_rule_set_only(self) -> None:
        asked = resolve_uncached(Request(accelerator="cpu", cluster=PBS_NAME), cpu(variables=PBS_JOB), PBS_RULES)
        assert asked.cluster.kind == "pbs" and asked.reasons["cluster"].startswith("PBS was asked for")
        assert Plan.from_dict(asked.to_dict(), rules=PBS_RULES) == asked
        with pytest.raises(PlanFormatError, match=r"request\.cluster"):
            Plan.from_dict({**asked.to_dict(), "cluster": BUILTIN_RULES_CLUSTER}, rules=BUILTIN_RULES)
        assert Request.from_config({"cluster": " PBS "}, PBS_RULES).cluster == "pbs"
        with pytest.raises(InvalidRequest) as caught:
            Request.from_config({"cluster": "pbs"})
        assert caught.value.field == "cluster" and "pbs" not in caught.value.allowed
        with pytest.raises(Unavailable, match=r"no PBS variables \(PBS_JOBNUM and PBS_TASKNUM not set\)"):
            resolve_uncached(Request(cluster=PBS_NAME), cpu(), PBS_RULES)

    def test_the_probe_copies_its_variables_for_its_rule_set(self) -> None:
        assert relevant_variables({**PBS_JOB, "HOME": "/root"}, PBS_RULES) == PBS_JOB
        assert relevant_variables(PBS_JOB) == {}  # trainplan's own rules name none of them
        assert {"PBS_JOBNUM", "PBS_NP", "PBS_MOM_HOST", "PBS_PORT"} <= PBS_RULES.cluster_variables

    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"name": "PBS"}, "rules.clusters"),
            ({"name": "slurm"}, "rules.clusters"),
            ({"name": "torchrun"}, "rules.clusters"),  # an alias of a built-in cluster
            ({"description": 3}, "rules.clusters['pbs'].description"),
            ({"detect_variables": ()}, "rules.clusters['pbs'].detect_variables"),
            ({"detect_variables": frozenset({"PBS_JOBNUM"})}, "rules.clusters['pbs'].detect_variables"),
            ({"detect_variables": (frozenset(),)}, "rules.clusters['pbs'].detect_variables[0]"),
            ({"detect_variables": (frozenset({"PBS JOB"}),)}, "rules.clusters['pbs'].detect_variables[0]"),
            ({"detect_priority": 7}, "rules.clusters['pbs'].detect_priority"),  # torchelastic's
            ({"detect_priority": True}, "rules.clusters['pbs'].detect_priority"),
            ({"creates_processes": "yes"}, "rules.clusters['pbs'].creates_processes"),
            ({"schemas": ()}, "rules.clusters['pbs'].schemas"),
            ({"schemas": ("PBS_NP",)}, "rules.clusters['pbs'].schemas[0]"),
            ({"launch_hint": "qsub -l nodes={nodes}"}, "rules.clusters['pbs'].launch_hint"),
            ({"max_processes_per_node": 0}, "rules.clusters['pbs'].max_processes_per_node"),
            ({"job_port": JobPort(base=65000, modulo=1000)}, "rules.clusters['pbs'].job_port.modulo"),
            ({"job_port": 20000}, "rules.clusters['pbs'].job_port"),
            ({"default_port": DefaultPort(port=0)}, "rules.clusters['pbs'].default_port.port"),
            ({"default_port": DefaultPort(port=1, note="on {host}")}, "rules.clusters['pbs'].default_port.note"),
            (
                {"default_port": DefaultPort(port=1, several_nodes_fix="qsub -v {host}")},
                "rules.clusters['pbs'].default_port.several_nodes_fix",
            ),
            ({"same_job_as": ("flux",)}, "rules.clusters['pbs'].same_job_as"),
            ({"same_job_as": ("pbs",)}, "rules.clusters['pbs'].same_job_as"),
            ({"started_by_fact": "PBS_MOM"}, "rules.clusters['pbs'].started_by_fact"),
            (
                {
                    "not_tasks": (
                        NotATask(
                            code="x",
                            unset=frozenset(),
                            tasks=("B",),
                            when_one="alone",
                            when_many="alone",
                            level_when_one="loud",  # type: ignore[arg-type]  # the check under test
                        ),
                    )
                },
                "rules.clusters['pbs'].not_tasks[0].level_when_one",
            ),
            (
                {
                    "not_tasks": (
                        NotATask(code="x", unset=frozenset({"A"}), tasks=("B",), when_one="refuse", when_many="alone"),
                    )
                },
                "rules.clusters['pbs'].not_tasks[0].code",
            ),
            (
                {
                    "not_tasks": (
                        NotATask(
                            code="x",
                            unset=frozenset({"A"}),
                            tasks=("B",),
                            when_one="alone",
                            when_many="alone",
                            message="{",
                        ),
                    )
                },
                "rules.clusters['pbs'].not_tasks[0].message",
            ),
            (
                {
                    "not_tasks": (
                        NotATask(
                            code="x",
                            unset=frozenset({"A"}),
                            tasks=("B",),
                            when_one="maybe",  # type: ignore[arg-type]  # no such verdict: what is refused
                            when_many="alone",
                        ),
                    )
                },
                "rules.clusters['pbs'].not_tasks[0].when_one",
            ),
        ],
    )
    def test_a_malformed_row_is_refused_naming_the_field(self, changes: dict[str, Any], field: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            BUILTIN_RULES.extend(clusters=[attrs.evolve(PBS, **changes)])
        assert caught.value.field == field

    @pytest.mark.parametrize(
        ("changes", "words"),
        [
            (
                {"name": CustomName("Pbs")},
                "is not accepted: a downstream name is lowercase letters, digits and underscores, starting with a "
                "letter",
            ),
            ({"started_by_fact": "PBS_MOM"}, "started_by_fact='PBS_MOM' is not accepted: it names a fact of"),
            ({"not_tasks": ("PBS_MOM",)}, "is not accepted: it is a NotATask: a process with the variables"),
            (
                {
                    "not_tasks": (
                        NotATask(
                            code="x",
                            unset=frozenset({"A"}),
                            tasks=("B",),
                            when_one="alone",
                            when_many="alone",
                            level="loud",  # type: ignore[arg-type]  # the check under test
                        ),
                    )
                },
                "level='loud' is not accepted: no such level",
            ),
        ],
    )
    def test_a_malformed_row_is_refused_in_words_naming_the_value(self, changes: dict[str, Any], words: str) -> None:
        with pytest.raises(InvalidRequest, match=re.escape(words)):
            BUILTIN_RULES.extend(clusters=[attrs.evolve(PBS, **changes)])

    def test_a_second_new_row_cannot_take_a_built_in_rows_priority(self) -> None:
        """The priorities taken grow with each row added; the built-in rows' stay taken."""
        other = attrs.evolve(PBS, name=CustomName("pbs2"), detect_variables=(frozenset({"PBS2_JOBNUM"}),))
        slurm = BUILTIN_RULES.clusters["slurm"].detect_priority
        for rows in ([PBS, attrs.evolve(other, detect_priority=slurm)], [PBS, attrs.evolve(other, detect_priority=8)]):
            with pytest.raises(InvalidRequest, match="has that priority too") as caught:
                BUILTIN_RULES.extend(clusters=rows)
            assert caught.value.field == "rules.clusters['pbs2'].detect_priority"

    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"label": ""}, "label"),
            ({"reason": "PBS {nope}"}, "reason"),
            ({"reason_asked": "PBS {0}"}, "reason_asked"),
            ({"uneven_fix": "on {cluster}"}, "uneven_fix"),  # filled with {num_nodes} only
            ({"main_address_fix": None}, "main_address_fix"),
            ({"world_size": "PBS_NP"}, "world_size"),
            ({"world_size": JobVariable(names=())}, "world_size.names"),
            ({"world_size": JobVariable(names=("PBS_NP",), format="roman")}, "world_size.format"),  # type: ignore[arg-type]
            ({"world_size": JobVariable(names=("PBS_NP",), unset_fix="{launcher}")}, "world_size.unset_fix"),
            ({"world_size": JobVariable(names=("PBS_NP",), default=-1)}, "world_size.default"),
            ({"local_rank": -1}, "local_rank"),
            ({"main_address": JobVariable(names=("PBS_MOM_HOST",))}, "main_address"),
            ({"main_address": (None,)}, "main_address[0]"),
            ({"job_id_shift": 64}, "job_id_shift"),
        ],
    )
    def test_a_malformed_schema_is_refused_naming_the_field(self, changes: dict[str, Any], field: str) -> None:
        schema = attrs.evolve(PBS.schemas[0], **changes)
        with pytest.raises(InvalidRequest) as caught:
            BUILTIN_RULES.extend(clusters=[attrs.evolve(PBS, schemas=(schema,))])
        assert caught.value.field == f"rules.clusters['pbs'].schemas[0].{field}"

    def test_rows_are_given_as_a_list_of_cluster_rules_one_per_name(self) -> None:
        for clusters, words in (
            (PBS, "list of ClusterRule"),
            ([PBS, PBS], "two rows of one call"),
            ([PBS.schemas[0]], "each row is a ClusterRule"),
        ):
            with pytest.raises(InvalidRequest, match=words) as caught:
                BUILTIN_RULES.extend(clusters=clusters)  # type: ignore[arg-type]
            assert caught.value.field == "rules.clusters"


BUILTIN_RULES_CLUSTER = {
    "kind": "local",
    "creates_processes": False,
    "main_address": "127.0.0.1",
    "main_port": None,
    "node_rank": 0,
    "global_rank": 0,
    "local_rank": 0,
}
"""A one-process plan's cluster under trainplan's own rules (its request still names the downstream cluster)."""


class TestClusterRefusalsSpeakOfTheirRow:
    """A cluster's refusals name it by its label and give its own fix, not another cluster's."""

    def test_a_cluster_asked_for_without_its_variables_is_named_by_its_label(self) -> None:
        with pytest.raises(Unavailable) as caught:
            detect("slurm", {"HOME": "/root"})
        assert caught.value.available == "no SLURM variables (SLURM_NTASKS not set)"
        assert caught.value.fix.startswith("Run it as one of SLURM's processes (SLURM, processes started by srun)")

    def test_the_main_address_fix_is_the_clusters_own(self) -> None:
        two_nodes = Request(accelerator="cpu", devices=2, num_nodes=2)
        open_mpi = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
        hydra = {"PMI_SIZE": "4", "PMI_RANK": "1", "MPI_LOCALRANKID": "1"}
        fixes = {}
        for name, variables in (("openmpi", open_mpi), ("hydra", hydra)):
            with pytest.raises(Incompatible) as caught:
                resolve_uncached(two_nodes, cpu(variables=variables))
            assert caught.value.rule == "cluster-main-address"
            fixes[name] = caught.value.fix
        assert "mpirun -x MASTER_ADDR" in fixes["openmpi"] and "mpiexec" not in fixes["openmpi"]
        assert "mpiexec -genv MASTER_ADDR" in fixes["hydra"] and "mpirun" not in fixes["hydra"]
        # A downstream cluster whose jobs name no host: its row's fix (here the default), nothing of MPI's.
        schema = attrs.evolve(PBS.schemas[0], main_address=(), loopback_needs_one_node=True)
        rules = BUILTIN_RULES.extend(clusters=[attrs.evolve(PBS, schemas=(schema,))])
        with pytest.raises(Incompatible) as caught:
            resolve_uncached(Request(accelerator="cpu"), cpu(variables=PBS_JOB), rules)
        assert caught.value.rule == "cluster-main-address" and caught.value.fix == schema.main_address_fix
        assert str(caught.value).startswith("PBS spans 2 nodes (PBS_NP=8, PBS_NUM_PPN=4)")
        assert "mpirun" not in str(caught.value) and "MASTER_ADDR" in caught.value.fix

    def test_a_cluster_without_a_port_variable_speaks_of_the_main_port(self) -> None:
        """A downstream cluster that names no port variable: a fix that would name it says "the main port"."""
        job_id = JobVariable(names=("PBS_JOBNUM",), format="job_number")
        schema = attrs.evolve(PBS.schemas[0], main_port=None, job_id=job_id)
        rules = BUILTIN_RULES.extend(clusters=[attrs.evolve(PBS, schemas=(schema,))])
        with pytest.raises(ClusterEnvironmentError) as caught:
            resolve_uncached(Request(accelerator="cpu"), cpu(variables={**PBS_JOB, "PBS_JOBNUM": "job7"}), rules)
        assert caught.value.variable == "PBS_JOBNUM"
        assert str(caught.value).endswith("it is not a job number. Set the main port to choose the port yourself.")


def test_mpich_over_two_nodes_without_a_port_is_refused_in_its_rows_words() -> None:
    """The fixed default port over several nodes: refused, the fix the MPI row writes (each launcher's spelling)."""
    variables = {"PMI_SIZE": "4", "PMI_RANK": "0", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}
    variables |= {"MASTER_ADDR": "10.0.0.1", "TRAINPLAN_MPI_NODES": "2"}
    with pytest.raises(ClusterEnvironmentError) as refused:
        resolve_uncached(Request(accelerator="cpu"), cpu(variables=variables))
    default = BUILTIN_RULES.clusters["mpi"].default_port
    assert default is not None and default.one_node_only
    assert refused.value.variable == "MASTER_PORT" and "fixed port 29500" in str(refused.value)
    assert str(refused.value).endswith(default.several_nodes_fix.format(variable="MASTER_PORT", port=29500) + ".")
    assert "mpiexec -genv MASTER_PORT <port>" in str(refused.value) and "mpirun -x MASTER_PORT=<port>" in str(
        refused.value
    )
