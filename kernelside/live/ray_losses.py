"""A Ray world's lost ranks in words, and where their replacements stand among the ranks that stayed.

A rank is lost when its actor's process ends under it (killed, out of memory) or its node leaves the cluster
(``cluster.remove_node``, a machine gone). The kernel sees either at once on the rank's connections
(``live.ray_channel``); Ray's GCS says which of the two it was (``nodes_gone``). A replacement goes into the
bundle its rank left, which is on the same node (a killed process) or on a node Ray placed the bundle on again
(a lost node): ``slot_on`` gives it its local rank and node rank there without moving any rank that stayed.

Example::

    >>> lost_line([SimpleNamespace(rank=2, pid=11, node="127.0.0.1 (ab12cd34)")], node_left=True)
    'rank 2 (pid 11) was lost with node 127.0.0.1 (ab12cd34), which left the Ray cluster'
"""

from __future__ import annotations

import collections
import time

NODE_DEATH_WAIT_S = 2.0  # the GCS marks a removed node dead a moment after its processes' connections end


def nodes_gone(ray, node_ids: set[str], wait_s: float = NODE_DEATH_WAIT_S) -> set[str]:
    """Which of these Ray nodes left the cluster (dead or unknown to the GCS); waits up to ``wait_s`` for them."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            alive = {nd["NodeID"] for nd in ray.nodes() if nd.get("Alive")}
        except Exception:  # noqa: BLE001 - the GCS unreachable: say nothing of the nodes
            return set()
        gone = {n for n in node_ids if n not in alive}
        if gone == node_ids or time.monotonic() >= deadline:
            return gone
        time.sleep(0.2)  # (the GCS has no event for this that a driver can wait on)


def by_node(lost: list) -> list[list]:
    """The lost ranks grouped by their node, in rank order."""
    groups: dict[str, list] = collections.defaultdict(list)
    for w in sorted(lost, key=lambda w: w.rank):
        groups[w.node_id].append(w)
    return list(groups.values())


def lost_line(ranks: list, node_left: bool) -> str:
    """One node's lost ranks, and whether the node left the cluster or only the processes ended."""
    many = len(ranks) > 1
    who = (
        f"rank{'s' if many else ''} {', '.join(str(w.rank) for w in ranks)} "
        f"(pid{'s' if many else ''} {', '.join(str(w.pid) for w in ranks)}) {'were' if many else 'was'} lost"
    )
    node = ranks[0].node
    if node_left:
        return f"{who} with node {node}, which left the Ray cluster"
    return f"{who} on node {node}: the process ended (killed? out of memory?), the node is still up"


def slot_on(node_id: str, others: list) -> tuple[int, int, int]:
    """(local rank, node rank, ranks on that node) for a new rank on ``node_id`` among ``others`` (the ranks that
    stayed, and replacements placed before it): the lowest local rank free on that node, the node's rank where a
    rank is there already, else the lowest node rank no node holds now.

    Example::

        >>> at = lambda local: SimpleNamespace(node_id="n0", local_rank=local, node_rank=0)
        >>> slot_on("n2", [at(0), at(1)])
        (0, 1, 1)
    """
    here = [w for w in others if w.node_id == node_id]
    local_rank = min(set(range(len(here) + 1)) - {w.local_rank for w in here})
    if here:
        node_rank = here[0].node_rank
    else:
        taken = {w.node_rank for w in others}
        node_rank = min(set(range(len(taken) + 1)) - taken)
    return local_rank, node_rank, len(here) + 1
