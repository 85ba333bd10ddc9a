"""Rollbacks of a non-finite loss: the learner entries of the last checkpoint (or of the starting
state, before the first; files in the run's store, `state_store.py`), and putting every learner
back to them at half the learning rate, at most the workload's `max_rollbacks` times; then
`TrainingDiverged`. Each learner reads its state itself; the driver holds only the entries."""

from __future__ import annotations

import math

from orchestrator.checkpoint.job_checkpoint import load_entry


class TrainingDiverged(RuntimeError):
    """The training loss stayed non-finite after `optim.max_rollbacks` rollbacks."""


class Rollbacks:
    """Args:
    job: the `TrainingJob` (its roster, elastic, events, runtime, workload, and `on_every_learner`).
    """

    def __init__(self, job):
        self.job = job
        self.states: dict[int, dict] = {}  # learner id -> its entry in the last checkpoint
        self.count = 0
        self.weights_diverged = False  # an evaluation read non-finite weights: roll back

    def first_state(self) -> dict | None:
        return next(iter(self.states.values()), None)

    def adopt(self, handle) -> None:
        """A newcomer with no live learner to start from takes the last checkpoint's first state."""
        first = self.first_state()
        if first is not None:
            load_entry(handle, self.job.store, first, True)

    def diverged(self, results: list[tuple[int, dict]]) -> bool:
        """Whether a chunk's loss, or the weights the last evaluation read, are not finite."""
        return self.weights_diverged or any(
            stats.get("loss") is not None and not math.isfinite(stats["loss"]) for _, stats in results)

    def roll_back(self, results: list[tuple[int, dict]], failed: list, loop, latest) -> bool:
        """Every learner back to the last checkpointed states at half the learning rate, or
        `TrainingDiverged` (naming `latest`, the last good checkpoint file) once the rollbacks are
        spent. Returns whether a collective broke in this round (the group must be re-formed)."""
        job, limit = self.job, self.job.workload.max_rollbacks
        at = min((s["nonfinite_at"] for _, s in results if s.get("nonfinite_at") is not None), default=None)
        where = f"at step {at}" if at is not None else "in the weights an evaluation read"
        for learner_id, error in failed:
            job.elastic.drop(learner_id, error)
        loop.drain()
        if self.count >= limit:
            kept = f"the last good checkpoint is {latest}" if latest.is_file() else "no checkpoint was written"
            raise TrainingDiverged(f"the training loss became non-finite {where} after {self.count} rollback(s) "
                                   f"(optim.max_rollbacks={limit}); {kept}; lower optim.lr or raise "
                                   "optim.max_rollbacks")
        scale = 0.5 * min((s.stats.get("lr_scale", 1.0) for s in job.roster.live.values()), default=1.0)
        first = self.first_state()
        job.on_every_learner(lambda s: load_entry(s.handle, job.store, self.states.get(s.id, first),
                                                  s.id not in self.states))
        job.on_every_learner(lambda s: s.handle.set_lr_scale.remote(scale))
        for learner_id, counters in job.on_every_learner(lambda s: s.handle.counters.remote()).items():
            job.roster.live[learner_id].stats = counters
        self.count += 1
        self.weights_diverged = False
        to_step = first["counters"]["step"]
        job.events.emit("rollback", f"non-finite loss {where}: every learner back to step {to_step}, learning rate "
                        f"x{scale:g} (rollback {self.count} of at most {limit})",
                        at_step=at, to_step=to_step, lr_scale=scale)
        return any(stats.get("broken") for _, stats in results)


def simulate_divergence(job, slots) -> None:
    """simulate.nan_loss_at_step (tests only): tell the learners placed at the start."""
    at = job.spec.simulate.nan_loss_at_step
    if at is not None:
        job.runtime.get([s.handle.simulate_nan_loss.remote(at) for s in slots])
