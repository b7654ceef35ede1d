"""Cluster environments read from environment variables: detection order, ranks, addresses, ports."""

from __future__ import annotations

from typing import get_args

import attrs
import pytest

from tests.helpers import SLURM_2x4, TORCHRUN_2x2, cpu, cuda, plan_for
from trainplan import BUILTIN_RULES, ClusterEnvironmentError, Incompatible, Request
from trainplan.effects.probing import relevant_variables
from trainplan.mapping.workers import worker_environment
from trainplan.resolve import cluster as cluster_module
from trainplan.resolve import expand_hostlist, resolve_uncached
from trainplan.resolve.cluster import detect
from trainplan.rules import (
    CLUSTERS,
    LAUNCHED_WORKERS,
    MPI_PROXY_FACT,
    ClusterRule,
    JobPort,
    JobVariable,
    JobVariables,
    VariableFormat,
    job_variables,
)


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

    @pytest.mark.parametrize("text", ["node[1-", "node]1[", "n[4-2]", "n[a-b]", "", "n[[1]]"])
    def test_malformed_lists_say_where(self, text: str) -> None:
        with pytest.raises(ValueError):
            expand_hostlist(text)


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

    def test_a_kubeflow_pod_is_detected_but_not_a_bare_pod(self) -> None:
        variables = {"KUBERNETES_PORT": "x", "MASTER_ADDR": "m", "MASTER_PORT": "1234", "WORLD_SIZE": "2", "RANK": "0"}
        assert detect("auto", variables).kind == "kubeflow"
        assert detect("auto", {"KUBERNETES_PORT": "x"}).kind == "local"
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

    def test_tasks_per_node_with_repeat_count(self) -> None:
        assert detect("slurm", {**SLURM_2x4, "SLURM_NTASKS_PER_NODE": "4(x2)"}).processes_per_node == 4

    def test_uneven_tasks_per_node_is_named(self) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("slurm", {**SLURM_2x4, "SLURM_NTASKS_PER_NODE": "4(x1),2"})
        assert caught.value.variable == "SLURM_NTASKS_PER_NODE"

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
            ("WORLD_SIZE", "0", "at least 1"),
            ("MASTER_ADDR", " ", "host name"),
        ],
    )
    def test_garbage_names_the_variable(self, variable: str, value: str, words: str) -> None:
        with pytest.raises(ClusterEnvironmentError) as caught:
            detect("auto", {**TORCHRUN_2x2, variable: value})
        assert caught.value.variable == variable and words in str(caught.value)


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

    def test_local_multi_node_reads_node_rank_and_warns_without_address(self) -> None:
        plan = plan_for(cpu(variables={"NODE_RANK": "1"}), accelerator="cpu", devices=2, num_nodes=2)
        assert (plan.cluster.node_rank, plan.launcher, plan.world_size) == (1, "subprocess", 4)
        assert "multi-node-local" in {note.code for note in plan.notes}

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
        # The MPI proxy is a fact of the process tree that the probe writes itself: never copied from a variable.
        assert set(relevant_variables(dict.fromkeys(named, "1"))) == named - {MPI_PROXY_FACT}

    def test_a_launcher_writes_what_its_workers_read(self) -> None:
        plan = plan_for(cpu(), accelerator="cpu", devices=2)
        variables = worker_environment(
            plan, local_rank=1, main_port=29555, visible_devices=None, visible_count=0, launcher="subprocess"
        )
        read = {name for _, source in job_variables(LAUNCHED_WORKERS.schema) for name in source.names}
        assert read | set(LAUNCHED_WORKERS.also_written) <= set(variables)
        facts = detect("auto", variables)
        assert (facts.launched, facts.kind, facts.launch_hint) == (True, "local", LAUNCHED_WORKERS.launch_hint)
        assert (facts.global_rank, facts.local_rank, facts.world_size, facts.main_port) == (1, 1, 2, 29555)

    def test_the_readers_facts_carry_their_rows_hint_and_kind(self) -> None:
        for name, variables in (("slurm", SLURM_2x4), ("torchelastic", TORCHRUN_2x2), ("local", {})):
            facts = detect(name, variables)  # type: ignore[arg-type]  # the loop's names are cluster names
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


PBS = ClusterRule(
    name="pbs",  # type: ignore[arg-type]  # an invented cluster: its name is none of trainplan's
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

PBS_RULES = attrs.evolve(BUILTIN_RULES, clusters={**BUILTIN_RULES.clusters, PBS.name: PBS})
"""A rule set with the row (a rule set value; `Rules.extend` takes no cluster rows)."""

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
        assert alone == "no cluster manager's variables were found (PBS, torchrun, MPI, SLURM, Kubeflow, LSF)"

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
