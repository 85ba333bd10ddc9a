"""How a learner calls its job's services, wherever they live: on a plain object in this process
(a one-learner job) or on a Ray actor."""

from __future__ import annotations


def call(target, method: str, *args):
    """Call `method` on a plain object or on a Ray actor (and wait for its result): how a learner
    asks its job's `ShardPlanner`, wherever that lives."""
    import ray

    if isinstance(target, ray.actor.ActorHandle):
        return ray.get(getattr(target, method).remote(*args))
    return getattr(target, method)(*args)
