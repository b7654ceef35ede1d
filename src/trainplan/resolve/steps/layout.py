"""Steps 9, 11 and 15: the world's layout: processes per node (one per device for a multi-process family, else one)
and the world size, within torch's limit; where this process sits in the cluster (main address and port, node,
global and local rank), checked against the layout (a started job's world must be the planned one; `check` goes on
as rank 0 on loopback); and `sync_batchnorm`, refused on an accelerator that cannot synchronise batch statistics,
noted where there is one process."""

from __future__ import annotations

from collections.abc import Mapping

from trainplan.resolve.cluster import ClusterFacts, is_loopback_host
from trainplan.resolve.draft import Draft
from trainplan.resolve.refusal import incompatible
from trainplan.rules import MAX_WORLD_SIZE, ClusterRule, lookup
from trainplan.spec.errors import InvalidRequest
from trainplan.spec.plan import ClusterInfo


def lay_out(draft: Draft) -> None:
    num_nodes = draft.num_nodes
    draft.processes_per_node = per_node = len(draft.devices) if draft.family.multi_process else 1
    draft.world_size = num_nodes * per_node
    if draft.world_size > MAX_WORLD_SIZE:
        draft.refuse(
            InvalidRequest(
                field="num_nodes",
                value=num_nodes,
                reason=f"{num_nodes} × {per_node} processes is beyond torch's {MAX_WORLD_SIZE} ranks",
                fix="Ask for fewer nodes or processes per node",
            )
        )
    draft.reasons["layout"] = f"{draft.family.description}; nodes: {draft.nodes_reason}"


def place_in_cluster(draft: Draft) -> None:
    _adopt(draft, _place_in_cluster(draft))


def rank_zero(draft: Draft) -> None:
    """`check`'s way on after the placement was refused."""
    facts = draft.facts
    _adopt(
        draft,
        ClusterInfo(
            kind=facts.kind,
            creates_processes=facts.creates_processes,
            main_address=facts.main_address or "127.0.0.1",
            main_port=facts.main_port,
            node_rank=0,
            global_rank=None,
            local_rank=None,
        ),
    )


def _adopt(draft: Draft, cluster: ClusterInfo) -> None:
    facts, num_nodes = draft.facts, draft.num_nodes
    draft.cluster = cluster
    draft.reasons["cluster"] = facts.reason
    if draft.in_started_job and num_nodes > 1 and is_loopback_host(cluster.main_address):
        given = f"{facts.address_from}={cluster.main_address}" if facts.address_from else cluster.main_address
        draft.note(
            "job-loopback-address",
            "warning",
            f"the main address {given} is this machine's loopback, but the job spans {num_nodes} nodes: each node "
            "would meet on its own, unless every node is this one host. Unset it, or set it to the address of node 0",
        )
    cluster_rule = lookup(draft.rules.clusters, facts.kind, name="CLUSTERS")
    if not cluster_rule.creates_processes and num_nodes > 1 and facts.address_from is None:
        draft.note(
            "multi-node-local",
            "warning",
            f"num_nodes={num_nodes} without a cluster manager: set MASTER_ADDR (the host of node 0), MASTER_PORT and "
            "NODE_RANK on every node, or the nodes meet on 127.0.0.1",
        )


def _place_in_cluster(draft: Draft) -> ClusterInfo:
    facts, num_nodes, world_size, fields = draft.facts, draft.num_nodes, draft.world_size, draft.fields
    processes_per_node = draft.processes_per_node
    # The layout the request wrote: a refusal of the job itself names no field nobody set.
    asked = (("devices", fields.devices), ("num_nodes", fields.num_nodes))
    values = {name: value for name, value in asked if value != "auto"}
    cluster_rule = lookup(draft.rules.clusters, facts.kind, name="CLUSTERS")
    limit = cluster_rule.max_processes_per_node
    if limit is not None and processes_per_node > limit:
        raise incompatible(
            "cluster-one-process-per-node", values, cluster=facts.kind, processes_per_node=processes_per_node
        )
    if draft.in_started_job:
        _check_job_world(facts, values, num_nodes, processes_per_node, world_size)
    node_rank = _node_rank(facts, cluster_rule, values, num_nodes, processes_per_node)
    if facts.local_rank is not None and facts.local_rank >= processes_per_node:
        raise incompatible(
            "cluster-rank-range",
            values,
            what="local rank",
            value=facts.local_rank,
            limit_name="processes per node",
            limit=processes_per_node,
            fix=f"Ask for devices={facts.local_rank + 1} or more per node, or start fewer processes per node",
        )
    address = facts.main_address
    if address is None:
        if num_nodes > 1:
            raise incompatible(
                "cluster-main-address",
                values,
                cluster=facts.started_by,
                nodes=num_nodes,
                detail=facts.detail,
                fix=facts.main_address_fix,
            )
        address = "127.0.0.1"
    global_rank, local_rank = facts.global_rank, facts.local_rank
    launcher_rule = lookup(draft.rules.launchers, draft.launcher, name="LAUNCHERS")
    in_this_process = not launcher_rule.starts_processes and not launcher_rule.joins
    if in_this_process and world_size == 1 and global_rank is None:
        global_rank, local_rank = 0, 0
    return ClusterInfo(
        kind=facts.kind,
        creates_processes=facts.creates_processes,
        main_address=address,
        main_port=facts.main_port,
        node_rank=node_rank,
        global_rank=global_rank,
        local_rank=local_rank,
    )


def _check_job_world(
    facts: ClusterFacts, values: Mapping[str, object], num_nodes: int, processes_per_node: int, world_size: int
) -> None:
    """A started job's world, as far as it states it, is the planned one (else the launch line that fits)."""
    stated = (
        (facts.world_size is not None and facts.world_size != world_size)
        or (facts.processes_per_node is not None and facts.processes_per_node != processes_per_node)
        or (facts.num_nodes is not None and facts.num_nodes != num_nodes)
    )
    if not stated:
        return
    suggestion = ""
    if facts.processes_per_node is not None and facts.num_nodes is not None:
        suggestion = f", or ask for the layout it gave: devices={facts.processes_per_node}, num_nodes={facts.num_nodes}"
    elif facts.world_size is not None and facts.world_size % num_nodes == 0:
        suggestion = f", or ask for devices={facts.world_size // num_nodes} per node"
    layout = {"num_nodes": num_nodes, "processes_per_node": processes_per_node, "world_size": world_size}
    hint = facts.launch_hint.format(**layout)
    started = f"{facts.world_size if facts.world_size is not None else '?'} processes"
    if facts.num_nodes is not None and facts.processes_per_node is not None:
        started += f" as {facts.num_nodes} node(s) × {facts.processes_per_node}"
    raise incompatible(
        "cluster-world-size",
        values,
        cluster=facts.started_by,
        started=started,
        detail=facts.detail,
        nodes=num_nodes,
        processes_per_node=processes_per_node,
        world_size=world_size,
        fix=f"Start the job with {hint}{suggestion}",
    )


def _node_rank(
    facts: ClusterFacts,
    cluster_rule: ClusterRule,
    values: Mapping[str, object],
    num_nodes: int,
    processes_per_node: int,
) -> int | None:
    """This node's rank: stated, or in blocks of the global rank, or 0 outside a job; None inside a job that states
    none (MPI, which may map ranks round-robin)."""
    node_rank = facts.node_rank
    if node_rank is None and cluster_rule.node_rank_in_blocks and facts.global_rank is not None:
        node_rank = facts.global_rank // processes_per_node
    elif node_rank is None and not (facts.creates_processes or facts.launched):
        node_rank = 0
    if node_rank is not None and node_rank >= num_nodes:
        variable = cluster_rule.node_rank_variable
        raise incompatible(
            "cluster-rank-range",
            values,
            what=variable,
            value=node_rank,
            limit_name="num_nodes",
            limit=num_nodes,
            fix=f"Set num_nodes to the number of machines (more than {node_rank}), or fix {variable}",
        )
    return node_rank


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
