"""The variables real engines set, read off SLURM 22.05, Open MPI 4.1.4 and MPICH 4.0 (hydra) on the test machine,
and the one verdict every process of each job reaches.

These sets are copied from real processes (`env` in each task, trimmed to what the cluster rows read): the cluster
suite (`tests/cluster`) runs the same launch patterns against the real daemons; these pin the rules without them.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import cpu
from trainplan import ClusterEnvironmentError, Incompatible, Plan, Request, TrainplanError
from trainplan.resolve import resolve_uncached

_JOB_1N = {
    "SLURM_JOB_ID": "5",
    "SLURM_JOB_NODELIST": "tpnode1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": "tpnode1",
}


def _srun_task(
    *, procid: int, localid: int, nodeid: int, tasks: int, nodes: int, per_node: str, name: str
) -> dict[str, str]:
    """One task of `srun` (the step's variables and the job's, as srun sets them)."""
    nodelist = "tpnode1" if nodes == 1 else "tpnode[1-2]"
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": name,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_NODELIST": nodelist,
        "SLURM_NTASKS": str(tasks),
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_STEP_NODELIST": nodelist,
    }


def _verdict(variables: dict[str, str], **request: object) -> Plan | TrainplanError:
    try:
        return resolve_uncached(Request(**request), cpu(variables=variables))  # type: ignore[arg-type]
    except TrainplanError as error:
        return error


def _layout(plan: Plan | TrainplanError) -> tuple[object, ...]:
    assert isinstance(plan, Plan), plan
    cluster = plan.cluster
    return (cluster.kind, plan.launcher, plan.world_size, plan.num_nodes, cluster.global_rank, cluster.node_rank)


class TestSrunTasks:
    """An srun task carries SLURM_STEP_ID and SLURM_PROCID whatever the job is called: it is a SLURM task."""

    @pytest.mark.parametrize("name", ["probe.py", "bash", "interactive"])
    def test_every_task_of_srun_joins_the_steps_world(self, name: str) -> None:
        # srun -N1 -n2 python probe.py; srun -n2 bash -c '...' (job "bash"); salloc ... srun ... (job "interactive")
        for rank in range(2):
            task = _srun_task(procid=rank, localid=rank, nodeid=0, tasks=2, nodes=1, per_node="2", name=name)
            assert _layout(_verdict(task)) == ("slurm", "external", 2, 1, rank, 0)

    def test_two_nodes_with_tasks_per_node(self) -> None:
        # srun -N2 --ntasks-per-node=2: SLURM_STEP_TASKS_PER_NODE=2(x2)
        for rank in range(4):
            task = _srun_task(
                procid=rank, localid=rank % 2, nodeid=rank // 2, tasks=4, nodes=2, per_node="2(x2)", name="p"
            )
            plan = _verdict(task)
            assert _layout(plan) == ("slurm", "external", 4, 2, rank, rank // 2)
            assert isinstance(plan, Plan) and plan.cluster.main_address == "tpnode1"

    @pytest.mark.parametrize(
        ("tasks", "per_node", "placed", "fix"),
        [
            (4, "3,1", "SLURM put 3 tasks on tpnode1 and 1 task on tpnode2", "srun --nodes=2 --ntasks-per-node=2"),
            (3, "2,1", "SLURM put 2 tasks on tpnode1 and 1 task on tpnode2", "3 tasks do not split evenly"),
            (3, "2,1", "the step asked for 3 tasks on 2 nodes without --ntasks-per-node", "no plan fits this step"),
            (3, "2,1", "srun --nodes=2 --ntasks-per-node=2 (4 tasks)", "srun --nodes=1 --ntasks-per-node=3"),
        ],
    )
    def test_an_uneven_placement_is_refused_on_every_rank_with_the_nodes_named(
        self, tasks: int, per_node: str, placed: str, fix: str
    ) -> None:
        # srun -N2 -n4 (no --ntasks-per-node): this SLURM placed the tasks 3 + 1; -n3: 2 + 1.
        first = int(per_node.split(",", maxsplit=1)[0])
        verdicts = [
            _verdict(
                _srun_task(
                    procid=rank,
                    localid=rank if rank < first else rank - first,
                    nodeid=0 if rank < first else 1,
                    tasks=tasks,
                    nodes=2,
                    per_node=per_node,
                    name="p",
                )
            )
            for rank in range(tasks)
        ]
        assert all(isinstance(verdict, ClusterEnvironmentError) for verdict in verdicts)
        assert len({str(verdict) for verdict in verdicts}) == 1, "every rank gives the same refusal"
        error = verdicts[0]
        assert isinstance(error, ClusterEnvironmentError) and error.variable == "SLURM_STEP_TASKS_PER_NODE"
        assert placed in str(error) and fix in str(error)

    def test_steps_run_side_by_side_meet_on_their_own_ports(self) -> None:
        """`srun -n2 --exact` twice at once in one allocation (a sweep): two steps, two ports."""
        ports = set()
        for step in ("0", "1", "2"):
            task = _srun_task(procid=0, localid=0, nodeid=0, tasks=2, nodes=1, per_node="2", name="p")
            plan = _verdict({**task, "SLURM_STEP_ID": step, "SLURM_STEPID": step})
            assert isinstance(plan, Plan)
            ports.add(plan.cluster.main_port)
        assert ports == {15000 + 7, 15000 + 7 + 1009, 15000 + 7 + 2018}

    def test_a_tasks_per_node_list_of_other_nodes_is_refused(self) -> None:
        for garbage in ("2(x99999999999)", "2(x3)", "2(x0)"):
            task = _srun_task(procid=0, localid=0, nodeid=0, tasks=2, nodes=1, per_node=garbage, name="p")
            error = _verdict(task)
            assert isinstance(error, ClusterEnvironmentError) and "node(s), and the job has 1" in str(error)

    @pytest.mark.parametrize("loopback", ["localhost", "localhost.localdomain", "LocalHost", "127.0.0.2", "::1"])
    def test_a_loopback_address_across_nodes_is_a_warning(self, loopback: str) -> None:
        task = _srun_task(procid=0, localid=0, nodeid=0, tasks=4, nodes=2, per_node="2(x2)", name="p")
        plan = _verdict({**task, "MASTER_ADDR": loopback})
        assert isinstance(plan, Plan)
        (note,) = [note for note in plan.notes if note.code == "job-loopback-address"]
        assert note.level == "warning" and f"MASTER_ADDR={loopback}" in note.message
        plain = _verdict(task)
        assert isinstance(plain, Plan) and "job-loopback-address" not in [note.code for note in plain.notes]

    def test_a_step_on_part_of_the_jobs_nodes_is_the_steps_world(self) -> None:
        # srun -N1 -n2 -w tpnode2 inside sbatch -N2 --ntasks-per-node=2: the job's counts say 2 nodes and 4 tasks,
        # the step's 1 node (the job's second) and 2 tasks; the step meets on its own node.
        for rank in range(2):
            task = _srun_task(procid=rank, localid=rank, nodeid=0, tasks=2, nodes=1, per_node="2", name="p")
            task |= {"SLURM_JOB_NODELIST": "tpnode[1-2]", "SLURM_NODELIST": "tpnode[1-2]", "SLURM_NTASKS": "4"}
            task |= {"SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}
            task |= {"SLURM_STEP_NODELIST": "tpnode2"}
            plan = _verdict(task)
            assert _layout(plan) == ("slurm", "external", 2, 1, rank, 0)
            assert isinstance(plan, Plan) and plan.cluster.main_address == "tpnode2"

    def test_the_steps_own_count_wins_over_the_jobs(self) -> None:
        # srun -n1 inside a job of 2 tasks: the step has one task, the job's SLURM_NTASKS_PER_NODE says 2.
        task = _srun_task(procid=0, localid=0, nodeid=0, tasks=1, nodes=1, per_node="1", name="p")
        task |= {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
        assert _layout(_verdict(task)) == ("slurm", "none", 1, 1, 0, 0)  # one process: it runs here


class TestNotTasks:
    """salloc's shell, the batch script and `srun --pty` carry SLURM's variables but are not srun tasks."""

    def test_salloc_shell_plans_this_machine_with_a_warning(self) -> None:
        shell = {**_JOB_1N, "SLURM_JOB_NAME": "interactive", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
        shell |= {"SLURM_TASKS_PER_NODE": "2"}
        plan = _verdict(shell)
        assert isinstance(plan, Plan) and (plan.cluster.kind, plan.launcher) == ("local", "none")
        warnings = [note for note in plan.notes if note.code == "slurm-allocation-shell"]
        assert [note.level for note in warnings] == ["warning"]
        assert "salloc" in warnings[0].message and "2 task(s), start the script with srun" in warnings[0].message

    def test_a_batch_script_of_several_tasks_is_refused_asked_for_or_not(self) -> None:
        # sbatch -N1 --ntasks-per-node=2 --wrap 'python probe.py': SLURM_PROCID=0 but no SLURM_STEP_ID.
        batch = {**_JOB_1N, "SLURM_JOB_NAME": "wrap", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
        batch |= {"SLURM_TASKS_PER_NODE": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
        for cluster in ("auto", "slurm"):
            error = _verdict(batch, cluster=cluster)
            assert isinstance(error, Incompatible) and error.rule == "slurm-batch-step"
            assert error.values == {}  # the job's mistake, not a field the request wrote
            assert str(error).startswith("This process is the batch script of SLURM job 5")
            assert "srun --kill-on-bad-exit=1 python train.py" in str(error)

    def test_a_batch_script_of_one_task_plans_this_machine(self) -> None:
        batch = {**_JOB_1N, "SLURM_JOB_NAME": "wrap", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
        plan = _verdict(batch, accelerator="cpu", devices=2)
        assert isinstance(plan, Plan)
        assert (plan.cluster.kind, plan.launcher, plan.world_size) == ("local", "subprocess", 2)
        assert [note.code for note in plan.notes if note.code.startswith("slurm")] == ["slurm-batch-step"]

    def test_an_interactive_srun_shell_of_one_task_plans_this_machine(self) -> None:
        pty = _srun_task(procid=0, localid=0, nodeid=0, tasks=1, nodes=1, per_node="1", name="bash")
        plan = _verdict({**pty, "SLURM_PTY_PORT": "44275"})
        assert isinstance(plan, Plan) and plan.cluster.kind == "local"
        assert [note.code for note in plan.notes if note.code.startswith("slurm")] == ["slurm-interactive-step"]
        assert _layout(_verdict({**pty, "SLURM_PTY_PORT": "44275"}, cluster="slurm"))[0] == "slurm"

    def test_an_interactive_srun_shell_in_a_job_of_several_tasks_counts_the_steps_tasks(self) -> None:
        # srun --pty bash inside sbatch -n4: the job has 4 tasks, the interactive step one.
        pty = _srun_task(procid=0, localid=0, nodeid=0, tasks=1, nodes=1, per_node="1", name="bash")
        pty |= {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4"}
        plan = _verdict({**pty, "SLURM_PTY_PORT": "44275"})
        assert isinstance(plan, Plan) and plan.cluster.kind == "local"
        assert [note.code for note in plan.notes if note.code.startswith("slurm")] == ["slurm-interactive-step"]

    def test_an_interactive_srun_step_of_several_tasks_is_slurms_world(self) -> None:
        # srun -n2 --pty ...: SLURM_PTY_PORT is set, but the step has two tasks that meet: each is a SLURM task.
        for rank in range(2):
            pty = _srun_task(procid=rank, localid=rank, nodeid=0, tasks=2, nodes=1, per_node="2", name="bash")
            plan = _verdict({**pty, "SLURM_PTY_PORT": "44275"})
            assert _layout(plan) == ("slurm", "external", 2, 1, rank, 0)
            assert isinstance(plan, Plan) and not [note for note in plan.notes if note.code.startswith("slurm")]


# The daemons' srun step that mpirun (Open MPI) started inside `sbatch -N1 --ntasks-per-node=2`: one task.
_OMPI_DAEMON_STEP_1N = {
    **_JOB_1N,
    "SLURM_JOB_NAME": "wrap",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_STEP_NODELIST": "tpnode1",
}


def _open_mpi(rank: int, size: int, local: int, local_size: int, nodes: int, jobid: str) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(local),
        "OMPI_MCA_ess_base_jobid": jobid,
        "OMPI_MCA_orte_num_nodes": str(nodes),
    }


class TestMpi:
    """The innermost launcher wins: MPI's world over the srun step that started MPI's daemons."""

    def test_open_mpi_inside_sbatch_plans_mpis_world(self) -> None:
        for rank in range(2):
            plan = _verdict({**_OMPI_DAEMON_STEP_1N, **_open_mpi(rank, 2, rank, 2, 1, "1638334465")})
            assert _layout(plan) == ("mpi", "external", 2, 1, rank, None)  # MPI states no node index
            assert isinstance(plan, Plan) and plan.cluster.main_address == "127.0.0.1"

    def test_open_mpi_on_one_node_of_a_batch_script_plans_mpis_world(self) -> None:
        # sbatch -N1 --ntasks-per-node=2 --wrap 'mpirun -np 2 ...': mpirun starts its local ranks itself (no srun
        # step), so every rank carries the batch script's SLURM_PROCID=0; SLURM's world has MPI's size, but the batch
        # script is no task of SLURM's: the ranks are MPI's, each its own.
        batch = {**_JOB_1N, "SLURM_JOB_NAME": "wrap", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2"}
        batch |= {"SLURM_TASKS_PER_NODE": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
        for rank in range(2):
            plan = _verdict({**batch, **_open_mpi(rank, 2, rank, 2, 1, "1638334465")})
            assert _layout(plan) == ("mpi", "external", 2, 1, rank, None)
            assert isinstance(plan, Plan) and plan.cluster.local_rank == rank

    def test_an_mpi_world_unlike_the_srun_steps_is_mpis_when_mpi_states_no_ranks_per_node(self) -> None:
        # mpiexec -n 4 started by a daemon step of one task per node (2 nodes); this MPI states PMI_SIZE/PMI_RANK only.
        step = _srun_task(procid=0, localid=0, nodeid=0, tasks=2, nodes=2, per_node="1(x2)", name="wrap")
        mpi = {"PMI_SIZE": "4", "PMI_RANK": "2", "MASTER_ADDR": "tpnode1", "MASTER_PORT": "29611"}
        plan = _verdict({**step, **mpi}, devices=2, num_nodes=2)
        assert _layout(plan) == ("mpi", "external", 4, 2, 2, None)

    def test_two_open_mpi_jobs_get_two_ports(self) -> None:
        ports = set()
        for jobid in ("1638334465", "1656619009"):
            plan = _verdict(_open_mpi(0, 2, 0, 2, 1, jobid))
            assert isinstance(plan, Plan)
            ports.add(plan.cluster.main_port)
        # The job family (the id's high 16 bits) varies between mpiruns; the id itself only in 625 ports.
        assert ports == {20000 + (1638334465 >> 16) % 10000, 20000 + (1656619009 >> 16) % 10000}
        assert len({20000 + ((family << 16) + 1 >> 16) % 10000 for family in range(20000, 30000)}) == 10000

    def test_open_mpi_with_an_uneven_mapping_is_refused_on_every_rank(self) -> None:
        # -np 3 over 2 nodes: local sizes 2 and 1, OMPI_MCA_orte_num_nodes=2.
        verdicts = [_verdict(_open_mpi(rank, 3, rank % 2, 2 if rank < 2 else 1, 2, "9")) for rank in range(3)]
        assert all(isinstance(verdict, ClusterEnvironmentError) for verdict in verdicts)
        assert all("started 3 processes" in str(verdict) for verdict in verdicts)

    def _hydra_in_two_nodes(self, rank: int) -> dict[str, str]:
        # sbatch -N2 --ntasks-per-node=2 --wrap 'mpiexec.hydra -iface lo -n 4 ...': the proxies' step has one task
        # per node, and the job's SLURM_NTASKS=4 stays.
        node = rank // 2
        step = _srun_task(procid=node, localid=0, nodeid=node, tasks=2, nodes=2, per_node="1(x2)", name="wrap")
        step |= {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2"}
        return {**step, "PMI_RANK": str(rank), "PMI_SIZE": "4", "MPI_LOCALRANKID": str(rank % 2)} | {
            "MPI_LOCALNRANKS": "2"
        }

    def test_mpich_over_two_nodes_without_an_address_is_refused_on_every_rank(self) -> None:
        verdicts = [_verdict(self._hydra_in_two_nodes(rank)) for rank in range(4)]
        assert all(isinstance(verdict, Incompatible) for verdict in verdicts)
        assert len({str(verdict) for verdict in verdicts}) == 1
        error = verdicts[0]
        assert isinstance(error, Incompatible) and error.rule == "cluster-main-address" and error.values == {}
        assert str(error).startswith("MPI spans 2 nodes (PMI_SIZE=4, MPI_LOCALNRANKS=2)")
        assert "mpiexec -genv MASTER_ADDR" in str(error)

    def test_mpich_over_two_nodes_with_an_address_and_a_port_plans_mpis_world(self) -> None:
        for rank in range(4):
            plan = _verdict({**self._hydra_in_two_nodes(rank), "MASTER_ADDR": "tpnode1", "MASTER_PORT": "29611"})
            assert _layout(plan) == ("mpi", "external", 4, 2, rank, None)
            assert isinstance(plan, Plan) and (plan.cluster.main_address, plan.cluster.main_port) == ("tpnode1", 29611)

    def test_srun_with_its_own_pmi_plugin_and_an_uneven_placement_is_slurms_refusal(self) -> None:
        task = _srun_task(procid=0, localid=0, nodeid=0, tasks=3, nodes=2, per_node="2,1", name="p")
        error = _verdict({**task, "PMI_RANK": "0", "PMI_SIZE": "3"})
        assert isinstance(error, ClusterEnvironmentError) and "SLURM put 2 tasks on tpnode1" in str(error)

    def test_hydra_with_an_uneven_mapping_is_refused_where_a_node_can_tell(self) -> None:
        # mpiexec -n 3 over 2 nodes of 2 slots: ranks 0 and 1 share a node; MPICH states no node count.
        error = _verdict({"PMI_SIZE": "3", "PMI_RANK": "0", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"})
        assert isinstance(error, ClusterEnvironmentError) and error.variable == "MPI_LOCALNRANKS"
        assert "3 does not split into nodes of 2" in str(error) and "-ppn" in str(error)

    def test_hydra_on_one_node_meets_on_its_proxys_port(self) -> None:
        """Two MPICH jobs on one host have two hydra proxies (the probe names the one above each rank): two ports,
        never two jobs' ranks in one world."""
        ports = set()
        for proxy in ("123456780001234", "123456990004321"):
            for rank in range(2):
                hydra = {"PMI_SIZE": "2", "PMI_RANK": str(rank), "MPI_LOCALRANKID": str(rank), "MPI_LOCALNRANKS": "2"}
                plan = _verdict({**hydra, "TRAINPLAN_MPI_PROXY": proxy})
                assert isinstance(plan, Plan) and plan.notes and "mpi-default-port" not in [n.code for n in plan.notes]
                ports.add(plan.cluster.main_port)
        assert len(ports) == 2

    def test_hydra_over_two_nodes_needs_a_port_as_well_as_an_address(self) -> None:
        hydra = {**self._hydra_in_two_nodes(0), "MASTER_ADDR": "tpnode1", "TRAINPLAN_MPI_PROXY": "1234"}
        error = _verdict(hydra)
        assert isinstance(error, ClusterEnvironmentError) and error.variable == "MASTER_PORT"
        assert "another job may be meeting too" in str(error)
        plan = _verdict({**hydra, "MASTER_PORT": "29611"})
        assert isinstance(plan, Plan) and plan.cluster.main_port == 29611

    def test_srun_with_its_own_pmi_plugin_is_slurms_job(self) -> None:
        # srun --mpi=pmi2 -n2: PMI_RANK/PMI_SIZE state the same world as SLURM's, which also knows the nodes.
        for rank in range(2):
            task = _srun_task(procid=rank, localid=rank, nodeid=0, tasks=2, nodes=1, per_node="2", name="p")
            plan = _verdict({**task, "PMI_RANK": str(rank), "PMI_SIZE": "2", "PMI_JOBID": "12.0"})
            assert _layout(plan) == ("slurm", "external", 2, 1, rank, 0)


# Read off `sbatch -N2 --ntasks-per-node=1 --wrap 'mpirun --map-by seq --hostfile hf -np 2 ...'` (hf: tpnode2, then
# tpnode1; Open MPI 4.1.4): each rank's parent is orted, whose parent is slurmstepd (the daemons' srun step of one task
# per node). Rank 0 runs on tpnode2, the step's task 1: SLURM's step states the same world size, not the same ranks.
_OMPI_SEQ_STEP = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NAME": "wrap",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "tpnode[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "tpnode[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
_OMPI_SEQ = [
    {  # on tpnode2
        **_OMPI_SEQ_STEP,
        "SLURMD_NODENAME": "tpnode2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        **_open_mpi(0, 2, 0, 1, 4, "998965249"),  # orte_num_nodes=4: the hostfile's nodes beside the allocation's
    },
    {  # on tpnode1
        **_OMPI_SEQ_STEP,
        "SLURMD_NODENAME": "tpnode1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        **_open_mpi(1, 2, 0, 1, 4, "998965249"),
    },
]
# What the probe writes for those ranks from /proc (orted above each, slurmstepd above orted).
_UNDER_ORTED = {"TRAINPLAN_MPI_DAEMON": "orted", "TRAINPLAN_MPI_NODES": "2", "MASTER_ADDR": "127.0.0.1"}


class TestMpiRanksOverSlurmsStep:
    """The innermost launcher wins unless SLURM states the same world, rank for rank (D3 of issue 20's review)."""

    def test_mpirun_with_a_sequential_mapping_is_mpis_world_on_every_rank(self) -> None:
        for rank, variables in enumerate(_OMPI_SEQ):
            plan = _verdict({**variables, **_UNDER_ORTED})
            assert _layout(plan) == ("mpi", "external", 2, 2, rank, None)
            assert isinstance(plan, Plan) and plan.cluster.local_rank == 0
        plans = [_verdict({**variables, **_UNDER_ORTED}) for variables in _OMPI_SEQ]
        assert len({plan.cluster.main_port for plan in plans if isinstance(plan, Plan)}) == 1

    def test_without_the_process_tree_the_global_rank_still_tells_the_worlds_apart(self) -> None:
        # No probe of /proc (a what-if with the variables alone): SLURM's rank differs from MPI's, so MPI's world.
        for rank, variables in enumerate(_OMPI_SEQ):
            plan = _verdict({**variables, "TRAINPLAN_MPI_NODES": "2", "MASTER_ADDR": "127.0.0.1"})
            assert _layout(plan)[:5] == ("mpi", "external", 2, 2, rank)

    def test_srun_started_ranks_with_mpis_variables_stay_slurms(self) -> None:
        # srun --mpi=pmi2: no MPI daemon above the rank, and the same world rank for rank.
        for rank in range(2):
            task = _srun_task(procid=rank, localid=rank, nodeid=0, tasks=2, nodes=1, per_node="2", name="p")
            plan = _verdict({**task, "PMI_RANK": str(rank), "PMI_SIZE": "2"})
            assert _layout(plan) == ("slurm", "external", 2, 1, rank, 0)


# Read off `sbatch -N2 --ntasks-per-node=2 --wrap 'mpiexec.hydra -iface lo -n 3 -ppn 2 ...'` (MPICH 4.0): ranks 0
# and 1 on tpnode1, rank 2 alone on tpnode2; each rank's parent is hydra_pmi_proxy, whose parent is slurmstepd (the
# proxies' srun step of one task per node). Hydra passes mpiexec's environment on, so SLURMD_NODENAME is the batch
# node's on every rank.
def _hydra_two_plus_one(rank: int) -> dict[str, str]:
    node = 0 if rank < 2 else 1
    return {
        "SLURM_JOB_ID": "10",
        "SLURM_JOB_NAME": "wrap",
        "SLURMD_NODENAME": "tpnode1",
        "SLURM_NNODES": "2",
        "SLURM_NODELIST": "tpnode[1-2]",
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "tpnode[1-2]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "PMI_RANK": str(rank),
        "PMI_SIZE": "3",
        "MPI_LOCALRANKID": str(rank % 2 if rank < 2 else 0),
        "MPI_LOCALNRANKS": "2" if rank < 2 else "1",
        "PMI_FD": "5",
    }


class TestUnevenHydra:
    """D1 of issue 20's review: MPICH's environment has no node count, so the lone rank of a 2 + 1 job inferred
    3 nodes × 1 and waited for ranks that had refused."""

    def test_under_srun_every_rank_refuses_from_the_proxies_step(self) -> None:
        tree = {"TRAINPLAN_MPI_DAEMON": "hydra_pmi_proxy", "TRAINPLAN_MPI_NODES": "2"}
        verdicts = [_verdict({**_hydra_two_plus_one(rank), **tree, "TRAINPLAN_MPI_PROXY": "77"}) for rank in range(3)]
        assert all(isinstance(verdict, ClusterEnvironmentError) for verdict in verdicts), verdicts
        assert {getattr(verdict, "variable", None) for verdict in verdicts} == {"MPI_LOCALNRANKS"}
        # What was asked, why it cannot work, what to write instead: an even layout over the same nodes.
        for verdict in verdicts:
            assert "MPI started 3 processes (PMI_SIZE=3) on 2 nodes" in str(verdict)
            assert "a plan runs the same number on every node" in str(verdict)
            assert "mpiexec -n 4 -ppn 2" in str(verdict)

    def test_without_a_node_count_the_lone_rank_marks_its_layout_inferred(self) -> None:
        # Hydra over ssh (no srun step): rank 2 can tell nothing; its plan says the nodes were inferred, and join
        # bounds its wait (trainplan.join, INFERRED_JOIN_SECONDS).
        lone = {key: value for key, value in _hydra_two_plus_one(2).items() if not key.startswith("SLURM")}
        plan = _verdict({**lone, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611"})
        assert _layout(plan) == ("mpi", "external", 3, 3, 2, None)
        assert isinstance(plan, Plan) and "cluster-nodes-inferred" in {note.code for note in plan.notes}
        stated = _verdict({**_OMPI_SEQ[0], **_UNDER_ORTED})
        assert isinstance(stated, Plan) and "cluster-nodes-inferred" not in {note.code for note in stated.notes}


class TestTorchrun:
    def _worker(self, rank: int, local: int, group: int, local_size: int) -> dict[str, str]:
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "GROUP_RANK": str(group),
            "LOCAL_WORLD_SIZE": str(local_size),
            "WORLD_SIZE": "3",
            "GROUP_WORLD_SIZE": "2",
            "ROLE_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "hpc1",
        }

    def test_an_uneven_world_is_refused_on_every_rank_with_its_numbers(self) -> None:
        # --nproc-per-node 2 on one agent and 1 on the other (c10d): world 3 on 2 nodes.
        workers = [self._worker(0, 0, 0, 2), self._worker(1, 1, 0, 2), self._worker(2, 0, 1, 1)]
        verdicts = [_verdict(worker) for worker in workers]
        assert all(isinstance(verdict, ClusterEnvironmentError) for verdict in verdicts)
        for verdict in verdicts:
            assert isinstance(verdict, ClusterEnvironmentError) and verdict.variable == "LOCAL_WORLD_SIZE"
            assert "torchrun started 3 processes (WORLD_SIZE=3) on 2 nodes (GROUP_WORLD_SIZE=2)" in str(verdict)
            assert "the same --nproc-per-node" in str(verdict)


class TestWithoutNtasks:
    """`sbatch -N2 --wrap 'python train.py'` and salloc without --ntasks set no SLURM_NTASKS: still SLURM's job."""

    def test_a_batch_script_over_two_nodes_is_refused(self) -> None:
        batch = {"SLURM_JOB_ID": "8", "SLURM_JOB_NAME": "wrap", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"}
        batch |= {"SLURM_NODELIST": "tpnode[1-2]", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
        error = _verdict(batch)
        assert isinstance(error, Incompatible) and error.rule == "slurm-batch-step"
        assert "not one of the job's 2 tasks" in str(error)

    def test_a_batch_script_on_one_node_plans_this_machine_with_a_note(self) -> None:
        batch = {"SLURM_JOB_ID": "8", "SLURM_JOB_NAME": "wrap", "SLURM_NNODES": "1", "SLURM_PROCID": "0"}
        plan = _verdict(batch, accelerator="cpu", devices=2)
        assert isinstance(plan, Plan) and (plan.cluster.kind, plan.launcher) == ("local", "subprocess")
        assert [note.code for note in plan.notes if note.code.startswith("slurm")] == ["slurm-batch-step"]

    def test_the_shell_of_an_allocation_without_ntasks_says_so(self) -> None:
        plan = _verdict({"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "interactive", "SLURM_NNODES": "2"})
        assert isinstance(plan, Plan) and plan.cluster.kind == "local"
        assert plan.reasons["cluster"] == (
            "no cluster manager started this process: SLURM's variables are set, but it is not one of its tasks "
            "(note slurm-allocation-shell)"
        )
        notes = [note for note in plan.notes if note.code == "slurm-allocation-shell"]
        assert notes and "the allocation's 2 task(s)" in notes[0].message


def test_the_face_shows_warning_notes_as_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's warning notes reach the user through Python's warnings (category TrainplanWarning), so that salloc's
    shell running a script alone is never silent."""
    import trainplan

    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.warns(trainplan.TrainplanWarning, match="slurm-allocation-shell: this is the shell"):
        trainplan.resolve(Request(accelerator="cpu"))
