"""The group of one."""

from __future__ import annotations

from orchestrator.groups.gossip import GossipMember


class SoloMember(GossipMember):
    """A group of one: a gossip member with nobody to average with takes plain local steps."""

    def __init__(self):
        super().__init__(position=0, partners=[])
