"""The group of one: a learner alone takes plain local steps (a one-learner job, in this process)."""

from __future__ import annotations

from orchestrator.groups.replica import next_batch_or_new_epoch


class SoloMember:
    """A group of one: nobody to wait for or to average with, so it may stop after any step."""

    lockstep = False
    stops_alone = True

    def setup(self, learner) -> None:
        pass

    def step(self, learner) -> None:
        batch = next_batch_or_new_epoch(learner)
        if batch is None:
            return
        learner.apply_step(learner.forward_backward(batch), batch.size)

    def mix(self, learner) -> None:
        pass

    def close(self) -> None:
        pass
