"""What the driver does with a group: `GroupStrategy`, the base of every kind's strategy (each
kind's is in its plug-in's module, `kind.py`), and a group of one. A strategy builds the members
(`members`) in the group's order (`order`), says how the driver runs the learners (`lockstep`: in
rounds; `swaps_running`: a change is swapped in while learners run instead of re-forming once
they are between chunks), which learners start chunks together (`dispatch_units`), their shards'
weights and how to adapt to measured speeds (`rebalance`), and who keeps a leaving learner's
weights (`handover`). `strategy_for` picks one; nothing outside `groups/` asks a group's kind.

Strategies see learners as the roster's slots (handles, nodes, speeds), never speech, and call
none of them: what they need to know of a learner (where a member group meets, on which backend)
the group answers through `Rendezvous`, and what they decide (`handover`) the group carries out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orchestrator.groups.registry import kind_of
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
# (a ring: when a passive learner is more than twice this fraction faster than an active one)


@dataclass(frozen=True)
class Rebalance:
    """What a strategy's `rebalance` asks the driver to do: form the group again at once (a new
    order), and/or plan the shards of the next unstarted epoch anew (new weights)."""

    regroup: bool = False
    replan: bool = False


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
        self.node_groups: list[list[int]] = []  # learner ids per node, as last formed (where a kind groups by node)
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

    def rebalance(self, roster) -> Rebalance | None:
        """Adapt to measured speeds: what the driver must do (None: nothing)."""
        return None

    def replan_if_moved(self, weights: list[float] | None) -> Rebalance | None:
        """A new shard plan (a kind's `rebalance`) when `weights` move a learner's share by more
        than REBALANCE_CHANGE of the planned one, or none was planned by weight."""
        old = self.planned[1]
        if weights is None or (old is not None and len(old) == len(weights) and all(
                abs(a - b) <= REBALANCE_CHANGE * max(a, b) for a, b in zip(weights, old, strict=True))):
            return None
        return Rebalance(replan=True)

    def rebalanced(self, roster) -> tuple[str, dict]:
        """Once a `rebalance` is carried out: its event's message and fields."""
        return "rebalanced by measured speed", {}

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


def strategy_for(spec, distributed: bool) -> GroupStrategy:
    """The strategy of the spec's `group.kind` (its plug-in's, `registry.py`) on Ray
    (`distributed`); in this process, a group of one."""
    return kind_of(spec.group.kind).strategy(spec) if distributed else GroupStrategy(spec)
