"""Learner groups: how learners keep their models in agreement.

A group is a set of members, one per learner, built by the driver and sent to the learner actors.
Each member implements one small protocol, called inside its learner:

    setup(learner)   once, before the first step (e.g. join a process group)
    step(learner)    one training step, including whatever communication the group does
    close()          leave the group

A collective that fails because a member died raises `GroupBroken`; the learner ends its chunk
and the driver forms a new group from the members left (`orchestrator/elastic.py`).

`lockstep` says whether every member must take the same number of steps (a collective inside
`step`), in which case the driver, not the learners, decides when to stop. `stops_alone` says
whether a member may stop after any step without keeping a peer waiting (gossip: yes; a member
of a collective: no), which is how a learner that must leave (a drained node, SIGTERM) ends the
chunk it is in. Groups know nothing
about speech: they see a learner's batches, gradients and weights only.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.groups.allreduce import AllreduceMember
from orchestrator.groups.errors import GroupBroken
from orchestrator.groups.gossip import GossipMember, ring_partners
from orchestrator.groups.hierarchical import HierarchicalMember


class GroupMember(Protocol):
    lockstep: bool
    stops_alone: bool

    def setup(self, learner) -> None: ...

    def step(self, learner) -> None: ...

    def close(self) -> None: ...


class SoloMember(GossipMember):
    """A group of one: a gossip member with nobody to average with takes plain local steps."""

    def __init__(self):
        super().__init__(position=0, partners=[])


def next_batch_or_new_epoch(learner):
    """Free-running learners (solo, gossip) move to their next epoch on their own: at the end of a
    shard this starts the next epoch and returns None (that step does nothing), so the driver's
    epoch limit is checked before any batch of the new epoch is taken. A learner with no shard in
    its epoch (it joined after the split) moves on to its first epoch with one."""
    batch = learner.next_batch()
    if batch is None:
        learner.start_next_epoch(move_on=True)
    return batch


__all__ = ["AllreduceMember", "GossipMember", "GroupBroken", "GroupMember", "HierarchicalMember", "SoloMember",
           "next_batch_or_new_epoch", "ring_partners"]
