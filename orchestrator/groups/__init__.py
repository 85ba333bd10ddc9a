"""Learner groups: how learners keep their models in agreement.

A group is a set of members, one per learner, built by the driver and sent to the learner actors.
Each member implements one small protocol (`GroupMember`, `replica.py`), called inside its learner:

    setup(learner)   once, before the first step (e.g. join a process group)
    step(learner)    one training step, including whatever communication the group does
    close()          leave the group

A collective that fails because a member died raises `GroupBroken`; the learner ends its chunk
and the driver forms a new group from the members left (`orchestrator/driver/elastic.py`).

`lockstep` says whether every member must take the same number of steps (a collective inside
`step`), in which case the driver, not the learners, decides when to stop. `stops_alone` says
whether a member may stop after any step without keeping a peer waiting (gossip: yes; a member
of a collective: no), which is how a learner that must leave (a drained node, SIGTERM) ends the
chunk it is in. Groups know nothing
about speech: they see a learner's batches, gradients and weights only, through `Replica`
(`replica.py`).

This file imports nothing: importing one member's module does not load the others.
"""
