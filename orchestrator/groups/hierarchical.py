"""H-ADPSGD (Zhang et al., INTERSPEECH 2019): learners on one node form a "super-learner" that
allreduces gradients among itself; the node leaders gossip in an AD-PSGD ring and hand the mix
to their node.

Per step, on every node: the leader (if active on the leaders' ring) starts averaging with a
passive leader, every member computes its gradient meanwhile, the node allreduces the
size-weighted gradients (one all-reduce after backward: see `overlap.py`), the leader takes the
mean from the exchange (on a link slower than the node's steps, from an exchange of an earlier
step once its bytes have arrived: `links.py`), broadcasts its weights to the node, and every
member applies the same gradient, so a node's replicas stay identical. Each node's process group is its own
torch.distributed world; nodes never wait for each other.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from orchestrator.groups.collectives import (
    apply_reduced_gradients,
    broadcast_counters,
    broadcast_weights,
    collective,
    device_settled,
    join_process_group,
    leave_process_group,
    reduce_gradients,
)
from orchestrator.groups.errors import GroupBroken
from orchestrator.groups.guard import STRANGERS
from orchestrator.groups.kind import GroupKind
from orchestrator.groups.passive_links import LINK_CALL_GROUPS, LINK_CALLS, PassiveLinks
from orchestrator.groups.ring import RingMember, ring_partners
from orchestrator.groups.strategies import GroupStrategy, Rendezvous


class HierarchicalMember:
    """One learner's part of a hierarchical group: allreduce in its node, gossip between nodes.

    Args:
    node_rank, node_size: this learner's place in its node's group (rank 0 leads).
    meeting: where the node's members meet (`rendezvous.Meeting`).
    leader: the leaders' gossip member (for node_rank 0; None otherwise).
    interface: the network interface of the node's group (`group.interface`; None: the node address's).
    """

    lockstep = False  # nodes run free; inside a node the collective keeps members in step
    stops_alone = False

    def __init__(self, node_rank: int, node_size: int, meeting, leader: RingMember | None,
                 backend: str = "gloo", timeout_s: float = 120, place: int | None = None,
                 interface: str | None = None):
        self.node_rank, self.node_size, self.meeting = node_rank, node_size, meeting
        self.leader, self.backend, self.timeout_s, self.place = leader, backend, timeout_s, place
        self.interface = interface

    def setup(self, learner) -> None:
        if self.node_size > 1:
            guard = join_process_group(self.backend, self.meeting, self.node_rank, self.node_size, self.timeout_s,
                                       learner, self.place, interface=self.interface)
            broadcast_weights(learner, self.node_rank)
            broadcast_counters(learner, self.node_rank)
            guard.apply()  # NCCL's listeners, made at the group's first collective
            STRANGERS.watch(port for _, port in guard.filtered)
        else:
            leave_process_group()

    def step(self, learner) -> None:
        exchange = self.leader.start_exchange(learner) if self.leader is not None else None
        computing = time.perf_counter()
        size = reduce_gradients(learner, learner.next_batch(), None)  # this member's, size-weighted
        device_settled(learner, compute_only=True)
        comm_before, started = learner.comm_s, time.perf_counter()
        with learner.waiting_on_group():
            if self.node_size > 1:
                collective(dist.all_reduce, learner.grad_buffer)
            if self.leader is not None:
                self.leader.finish_exchange(learner, exchange, started - computing)
            if self.node_size > 1:
                broadcast_weights(learner, self.node_rank)
            device_settled(learner)
        # the whole interval, exchange wait included (so what finish_exchange added is not counted twice)
        learner.comm_s = comm_before + time.perf_counter() - started
        apply_reduced_gradients(learner, learner.grad_buffer, size)

    def mix(self, learner) -> None:
        if self.leader is not None:
            self.leader.mix(learner)

    def settle_all(self, learner) -> None:
        """The leader's own exchanges in flight settled (the job's end, before `align`)."""
        if self.leader is not None:
            self.leader.settle_all(learner)

    def align(self, learner) -> None:
        """The node takes its leader's weights (every member of the node calls this: the broadcast
        is the node's collective), once every leader has settled its exchanges and this one has
        answered those it served, so no mean reaches a leader after its node took its weights."""
        if self.node_size > 1:
            try:
                with learner.waiting_on_group():
                    broadcast_weights(learner, self.node_rank)
            except GroupBroken:  # a node member is gone: the node's replicas stay one exchange apart
                pass

    def close(self) -> None:
        if self.leader is not None:
            self.leader.close()
        if self.node_size > 1:
            leave_process_group()


class HierarchicalStrategy(GroupStrategy):
    """H-ADPSGD: learners grouped by node; each node's first learner leads it on the leaders' ring."""

    name = "hierarchical"
    lockstep = False

    def members(self, roster, rendezvous: Rendezvous) -> list:
        handles = [roster.live[i].handle for i in roster.order]
        backend = rendezvous.backend(handles)
        by_node: dict[str, list[int]] = {}
        for i, learner_id in enumerate(roster.order):
            by_node.setdefault(roster.live[learner_id].node, []).append(i)
        nodes = list(by_node.values())
        leaders = [idxs[0] for idxs in nodes]
        members: list = [None] * len(handles)
        for k, idxs in enumerate(nodes):
            meeting = rendezvous.meeting([handles[i] for i in idxs]) if len(idxs) > 1 else None
            ring = RingMember(k, [handles[leaders[q]] for q in ring_partners(k, len(nodes))], self.spec.seed,
                                self.compression, self.interface, kind=self.name)
            for j, i in enumerate(idxs):
                members[i] = HierarchicalMember(j, len(idxs), meeting, ring if j == 0 else None, backend,
                                                place=i,  # every node's group joins at once: paced together
                                                interface=self.interface)
        self.node_groups = [[roster.order[i] for i in idxs] for idxs in nodes]
        return members

    def dispatch_units(self, roster) -> list[list[int]]:
        """The learners of one node (they all-reduce every step), every other learner on its own."""
        units = [[i for i in group if i in roster] for group in self.node_groups]
        grouped = {i for unit in units for i in unit}
        return [u for u in units if u] + [[s.id] for s in roster.slots() if s.id not in grouped]


def answered_then_align(learner, member, links: PassiveLinks) -> None:
    """The job's end, second half: the exchanges a leader serves settle on its side too, then its
    node takes its weights (`HierarchicalMember.align`)."""
    links.wait_answered()
    getattr(member, "align", lambda learner: None)(learner)


KIND = GroupKind("hierarchical", HierarchicalStrategy, process_state=PassiveLinks,
                 calls={**LINK_CALLS, "answered": answered_then_align}, call_groups=LINK_CALL_GROUPS,
                 before_last_evaluation=("settle", "answered"))
