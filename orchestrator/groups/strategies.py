"""One strategy per kind of group: what the driver does with a group of that kind. A strategy
builds the members (`members`) in the group's order (`order`), says how the driver runs the
learners (`lockstep`: in rounds; `swaps_running`: a change is swapped in while learners run
instead of re-forming once they are between chunks), which learners start chunks together
(`dispatch_units`), their shards' weights and how to adapt to measured speeds (`rebalance`), and
who keeps a leaving learner's weights (`handover`). `strategy_for` picks one; nothing outside
`groups/` asks a group's kind.

Strategies see learners as the roster's slots (handles, nodes, speeds), never speech, and call
none of them: what they need to know of a learner (where a member group meets, on which backend)
the group answers through `Rendezvous`, and what they decide (`handover`) the group carries out.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.groups.allreduce import AllreduceMember
from orchestrator.groups.balance import batch_shares, ring_by_host, ring_by_speed
from orchestrator.groups.gossip import GossipMember, ring_partners
from orchestrator.groups.hierarchical import HierarchicalMember
from orchestrator.groups.host_reduce import hosts_of
from orchestrator.groups.rendezvous import Meeting
from orchestrator.groups.solo import SoloMember


class Rendezvous(Protocol):
    """What a strategy may ask of learners to build members, answered by the group."""

    def meeting(self, handles) -> Meeting:
        """Where a process group of these learners meets: a fresh board of the job's service and
        the learners' node addresses (`rendezvous.Meeting`)."""

    def backend(self, handles) -> str:
        """The collective backend of these learners: "nccl" when all are on CUDA, else "gloo"."""


REBALANCE_CHANGE = 0.1  # rebalance when a learner's share would move by more than this fraction
# (gossip: when a passive learner is more than twice this fraction faster than an active one)


class GroupStrategy:
    """What the driver does with a group of one (the base of every kind's strategy).

    A strategy decides from the roster's books and asks no learner anything: the group
    (`driver/group.py`) answers its questions of the learners (`Rendezvous`: where a member group
    meets, and on which backend) and carries out what it decides (`handover`).

    Args:
    spec: the job spec (`group.balance`, `seed`).
    """

    name = "solo"
    lockstep = True  # the driver runs every learner's chunks in rounds and decides when to stop
    swaps_running = False  # members are swapped in while learners run (no re-forming)
    replicas_equal = False  # every learner holds the same weights and optimizer state (one is the average)

    def __init__(self, spec):
        self.spec = spec
        self.balance = spec.group.balance
        self.compression, self.interface = spec.group.compression, spec.group.interface
        self.node_groups: list[list[int]] = []  # hierarchical: learner ids per node, as last formed
        self.planned: tuple[list[int] | None, list[float] | None] = (None, None)  # (ids, shard weights)

    def order(self, roster) -> list[int]:
        """The group's order of the live learners (ranks, ring positions)."""
        return [s.id for s in roster.slots()]

    def members(self, roster, rendezvous: Rendezvous) -> list:
        """One member per learner of `roster.order`."""
        return [SoloMember() for _ in roster.order]

    def dispatch_units(self, roster) -> list[list[int]]:
        """Learners whose chunks the driver starts together."""
        return [[s.id] for s in roster.slots()]

    def shard_weights(self, roster) -> list[float] | None:
        """Each member's weight in the epoch's split (None: equal)."""
        return None

    def rebalance(self, roster) -> str | None:
        """Adapt to measured speeds; returns what changed (for the event) or None."""
        return None

    def handover(self, roster, slot) -> int | None:
        """Before `slot` leaves cleanly: who takes its weights, by one last pairwise average (None:
        nobody needs to)."""
        return None

    def shares(self, roster) -> dict[int, float]:
        """Each learner's share of a step's batch, where the group has one."""
        return {}

    def state_writers(self, ids: list[int]) -> list[int]:
        """The learners whose states a checkpoint stores (one per distinct state; the others
        store only their counters)."""
        return ids[:1] if self.replicas_equal else list(ids)



class GossipStrategy(GroupStrategy):
    """AD-PSGD on a ring: the learners of a host next to each other (`group.topology_aware`), and
    by measured speed (fastest at active positions)."""

    name = "gossip"
    lockstep = False
    swaps_running = True

    def order(self, roster) -> list[int]:
        slots = roster.slots()
        speeds = {s.id: s.speed for s in slots} if self.balance and all(s.speed is not None for s in slots) \
            else None
        if self.spec.group.topology_aware:
            return ring_by_host({s.id: s.node or "" for s in slots}, speeds)
        return ring_by_speed(speeds) if speeds else [s.id for s in slots]

    def members(self, roster, rendezvous: Rendezvous) -> list:
        handles = [roster.live[i].handle for i in roster.order]
        if len(handles) == 1:
            return super().members(roster, rendezvous)
        return [GossipMember(i, [handles[q] for q in ring_partners(i, len(handles))], self.spec.seed,
                             self.compression, self.interface) for i in range(len(handles))]

    def rebalance(self, roster) -> str | None:
        speeds = {i: roster.live[i].speed for i in roster.order}
        if not self.balance or len(speeds) < 2 or any(v is None for v in speeds.values()):
            return None
        actives, passives = roster.order[0::2], roster.order[1::2]
        # only when a passive learner is clearly faster than an active one (not measurement noise),
        # and the order would change (hosts keep their learners together: it may not)
        if max(speeds[i] for i in passives) <= (1 + REBALANCE_CHANGE * 2) * min(speeds[i] for i in actives):
            return None
        return "ring" if self.order(roster) != roster.order else None

    def handover(self, roster, slot) -> int | None:
        """Its ring neighbour, so its progress stays in the group."""
        if len(roster.order) < 2 or slot.id not in roster.order:
            return None
        return roster.order[(roster.order.index(slot.id) + 1) % len(roster.order)]


class AllreduceStrategy(GroupStrategy):
    """Synchronous SGD: rounds; with `group.balance`, shards and batches by measured speed."""

    name = "allreduce"
    replicas_equal = True

    def members(self, roster, rendezvous: Rendezvous) -> list:
        handles = [roster.live[i].handle for i in roster.order]
        backend, meeting = rendezvous.backend(handles), rendezvous.meeting(handles)
        hosts = hosts_of([roster.live[i].node or "" for i in roster.order]) if self.spec.group.topology_aware \
            else None
        return [AllreduceMember(i, len(handles), meeting, backend, interface=self.interface, hosts=hosts,
                                compression=self.compression) for i in range(len(handles))]

    def shard_weights(self, roster) -> list[float] | None:
        """By measured speed, once every member has one (`balance.batch_shares`)."""
        if not (self.balance and len(roster.order) > 1):
            return None
        speeds = [roster.live[i].speed for i in roster.order]
        if any(s is None for s in speeds):
            return None
        planned_ids, planned = self.planned
        if planned is None or planned_ids != roster.order:  # planned afresh: by speed alone
            return batch_shares(speeds)
        return batch_shares(speeds, planned, [roster.live[i].step_compute_s or 0.0 for i in roster.order])

    def rebalance(self, roster) -> str | None:
        weights, old = self.shard_weights(roster), self.planned[1]
        if weights is None or (old is not None and len(old) == len(weights) and all(
                abs(a - b) <= REBALANCE_CHANGE * max(a, b) for a, b in zip(weights, old, strict=True))):
            return None
        return "shares"

    def shares(self, roster) -> dict[int, float]:
        ids, planned = self.planned
        if not roster.order:
            return {}
        if planned and ids == roster.order:
            return dict(zip(ids, planned, strict=True))
        return {i: 1 / len(roster.order) for i in roster.order}


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
            ring = GossipMember(k, [handles[leaders[q]] for q in ring_partners(k, len(nodes))], self.spec.seed,
                                self.compression, self.interface)
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


STRATEGIES = {s.name: s for s in (GossipStrategy, AllreduceStrategy, HierarchicalStrategy)}


def strategy_for(spec, distributed: bool) -> GroupStrategy:
    """The spec's `group.kind` on Ray (`distributed`); in this process, a group of one."""
    cls = STRATEGIES[spec.group.kind] if distributed else GroupStrategy
    return cls(spec)
