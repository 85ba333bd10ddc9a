"""The `gossip` kind: AD-PSGD on a ring of all learners (`ring.py`: each active learner averages
with a passive neighbour over a direct link with every local step; no global barrier). Members
are swapped in while learners run; a leaving learner hands its weights to its ring neighbour.
"""

from __future__ import annotations

from orchestrator.groups.balance import ring_by_host, ring_by_speed
from orchestrator.groups.kind import GroupKind
from orchestrator.groups.passive_links import LINK_CALL_GROUPS, LINK_CALLS, PassiveLinks
from orchestrator.groups.ring import RingMember, ring_partners
from orchestrator.groups.strategies import REBALANCE_CHANGE, GroupStrategy, Rebalance, Rendezvous

NAME = "gossip"


class GossipMember(RingMember):
    """A learner's place on this kind's ring: its links are served by this kind's learners."""

    def __init__(self, position: int, partners: list, seed: int = 0, compression: str = "none",
                 interface: str | None = None):
        super().__init__(position, partners, seed, compression, interface, kind=NAME)


class GossipStrategy(GroupStrategy):
    """AD-PSGD on a ring: the learners of a host next to each other (`group.topology_aware`), and
    by measured speed (fastest at active positions)."""

    name = NAME
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

    def rebalance(self, roster) -> Rebalance | None:
        """A new ring, swapped in at once, when a passive learner is clearly faster than an active
        one (not measurement noise) and the order would change (hosts keep their learners
        together: it may not)."""
        speeds = {i: roster.live[i].speed for i in roster.order}
        if not self.balance or len(speeds) < 2 or any(v is None for v in speeds.values()):
            return None
        actives, passives = roster.order[0::2], roster.order[1::2]
        if max(speeds[i] for i in passives) <= (1 + REBALANCE_CHANGE * 2) * min(speeds[i] for i in actives):
            return None
        return Rebalance(regroup=True) if self.order(roster) != roster.order else None

    def rebalanced(self, roster) -> tuple[str, dict]:
        return ("gossip ring by measured speed (passive: " + ", ".join(str(i) for i in roster.order[1::2]) + ")",
                {"ring": roster.order, "speeds": {str(i): round(roster.live[i].speed, 2) for i in roster.order}})

    def handover(self, roster, slot) -> int | None:
        """Its ring neighbour, so its progress stays in the group."""
        if len(roster.order) < 2 or slot.id not in roster.order:
            return None
        return roster.order[(roster.order.index(slot.id) + 1) % len(roster.order)]


KIND = GroupKind(NAME, GossipStrategy, process_state=PassiveLinks, calls=LINK_CALLS,
                 call_groups=LINK_CALL_GROUPS, before_last_evaluation=("settle", "answered"))
