"""Learner actors outside a job, for tests and benchmarks of the groups themselves: `FixedLearners`
places a fixed set of them (one static shard plan, one secret, `capacity.place_learners`) and
gives their process groups meetings on a board host of its own (`rendezvous.BoardActor`), as a
job's driver and service would; `release` removes all of it.

Example:
    >>> learners = FixedLearners("test", 2, 1.0, "linear", config)          # doctest: +SKIP
    >>> meeting = learners.meeting()
    >>> ray.get([a.join.remote(AllreduceMember(i, 2, meeting)) for i, a in enumerate(learners.actors)])
    >>> learners.release()
"""

from __future__ import annotations

import secrets

from orchestrator.base.secret import JobSecret
from orchestrator.cluster.capacity import place_learners, release
from orchestrator.groups.rendezvous import BoardActor, Meeting


class FixedLearners:
    """`count` learner actors of `workload` (its config `config`), sharing a fresh secret.

    Args: name (their job's name), count, cpus_per_learner, workload, config, seed."""

    def __init__(self, name: str, count: int, cpus_per_learner: float, workload: str, config: dict, seed: int = 0):
        self.secret = JobSecret()
        self.slots, self.actors = place_learners(name, count, cpus_per_learner, workload, config, seed,
                                                 secret=self.secret)
        self._boards = None

    def meeting(self, actors: list | None = None) -> Meeting:
        """A fresh meeting for a process group of `actors` (default: all of them)."""
        import ray

        if self._boards is None:
            self._boards = BoardActor.options(num_cpus=0).remote(self.secret)
        actors = self.actors if actors is None else actors
        peers = ray.get([a.group_address.remote() for a in actors])
        return Meeting(self._boards, secrets.token_hex(8), peers, peers)

    def release(self) -> None:
        release(self.slots, self.actors + ([self._boards] if self._boards is not None else []))
        self._boards = None
