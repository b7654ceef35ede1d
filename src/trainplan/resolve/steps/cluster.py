"""Step 4: the cluster this process runs in, read from the environment's variables, and the number of nodes."""

from __future__ import annotations

from trainplan.resolve.cluster import ClusterFacts, detect
from trainplan.resolve.draft import Draft
from trainplan.rules import LOCAL_CLUSTER
from trainplan.spec.request import NumNodes

_FALLBACK_CLUSTER = detect(LOCAL_CLUSTER, {})
"""What `check` goes on with after an error in the cluster's variables (resolve stops at the error)."""


def read_cluster(draft: Draft) -> None:
    _adopt(draft, detect(draft.fields.cluster, draft.env.variables, draft.rules))


def this_machine(draft: Draft) -> None:
    """`check`'s way on after the cluster's variables were refused: this machine alone."""
    _adopt(draft, _FALLBACK_CLUSTER)


def _adopt(draft: Draft, facts: ClusterFacts) -> None:
    draft.facts = facts
    draft.in_started_job = facts.creates_processes or facts.launched
    draft.notes.extend(facts.notes)
    draft.num_nodes, draft.nodes_reason = _choose_num_nodes(draft.fields.num_nodes, facts)


def _choose_num_nodes(asked: NumNodes, facts: ClusterFacts) -> tuple[int, str]:
    """`num_nodes`: as asked, or for 'auto' the nodes of the started job this process belongs to (else 1)."""
    if asked != "auto":
        return asked, f"asked for num_nodes={asked}"
    if facts.creates_processes or facts.launched:
        nodes = job_nodes(facts)
        if nodes is not None:
            return nodes, f"'auto': the {nodes} node(s) the job started ({facts.detail})"
    return 1, "'auto': this machine alone"


def job_nodes(facts: ClusterFacts) -> int | None:
    """The nodes a started job states, or that its world and processes per node make; None when it does not say."""
    if facts.num_nodes is not None:
        return facts.num_nodes
    world, per_node = facts.world_size, facts.processes_per_node
    if world is not None and per_node is not None and world % per_node == 0:
        return world // per_node
    return None
