"""Rollbacks of a non-finite loss: the learner entries of the last checkpoint (or of the starting
state, before the first; files in the run's store, `state_store.py`), and the decision to put
every learner back to them at half the learning rate, at most the workload's `max_rollbacks`
times; then `TrainingDiverged`. The training loop carries a decision out (`loop.py`); each learner
reads its state itself, and the driver holds only the entries."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.checkpoint.job_checkpoint import load_entry


class TrainingDiverged(RuntimeError):
    """The training loss stayed non-finite after `optim.max_rollbacks` rollbacks."""


@dataclass(frozen=True)
class RollBack:
    """The rollbacks' decision: every learner back to its entry (`Rollbacks.entry_for`) at `scale`
    times the scheduled learning rate. `broken`: a collective broke in the same round (the group
    must be re-formed)."""

    scale: float
    where: str  # "at step N", or "in the weights an evaluation read"
    at: int | None
    broken: bool


class Rollbacks:
    """The rollback policy: which states a non-finite loss goes back to, at what learning rate, and
    when to give up. It decides (`decide`); the training loop carries the decision out.

    Args:
    store: the run's `StateStore` (a newcomer with nobody to start from reads its state there).
    max_rollbacks: the workload's `max_rollbacks`.
    emit: the job's `EventLog.emit`.
    """

    def __init__(self, store, max_rollbacks: int, emit):
        self.store, self.max_rollbacks, self.emit = store, max_rollbacks, emit
        self.states: dict[int, dict] = {}  # learner id -> its entry in the last checkpoint
        self.count = 0
        self.weights_diverged = False  # an evaluation read non-finite weights: roll back

    def first_state(self) -> dict | None:
        return next(iter(self.states.values()), None)

    def adopt(self, handle) -> None:
        """A newcomer with no live learner to start from takes the last checkpoint's first state."""
        first = self.first_state()
        if first is not None:
            load_entry(handle, self.store, first, True)

    def diverged(self, results: list[tuple[int, dict]]) -> bool:
        """Whether a chunk's loss, or the weights the last evaluation read, are not finite."""
        return self.weights_diverged or any(
            stats.get("loss") is not None and not math.isfinite(stats["loss"]) for _, stats in results)

    def decide(self, results: list[tuple[int, dict]], lr_scales: list[float], latest: Path) -> RollBack:
        """After a diverged round (`results`; the live learners' `lr_scales`): back to the last
        checkpointed states at half the lowest learning rate, or `TrainingDiverged` (naming
        `latest`, the last good checkpoint file) once the rollbacks are spent."""
        at = min((s["nonfinite_at"] for _, s in results if s.get("nonfinite_at") is not None), default=None)
        where = f"at step {at}" if at is not None else "in the weights an evaluation read"
        if self.count >= self.max_rollbacks:
            kept = f"the last good checkpoint is {latest}" if latest.is_file() else "no checkpoint was written"
            raise TrainingDiverged(f"the training loss became non-finite {where} after {self.count} rollback(s) "
                                   f"(optim.max_rollbacks={self.max_rollbacks}); {kept}; lower optim.lr or raise "
                                   "optim.max_rollbacks")
        return RollBack(scale=0.5 * min(lr_scales, default=1.0), where=where, at=at,
                        broken=any(stats.get("broken") for _, stats in results))

    def entry_for(self, learner_id: int) -> tuple[dict, bool]:
        """A learner's state to go back to, and whether it adopts it (a learner that joined after
        the checkpoint takes the first learner's)."""
        return self.states.get(learner_id, self.first_state()), learner_id not in self.states

    def rolled_back(self, decision: RollBack) -> None:
        """The loop carried `decision` out: counted, and its event."""
        self.count += 1
        self.weights_diverged = False
        to_step = self.first_state()["counters"]["step"]
        self.emit("rollback", f"non-finite loss {decision.where}: every learner back to step {to_step}, learning "
                  f"rate x{decision.scale:g} (rollback {self.count} of at most {self.max_rollbacks})",
                  at_step=decision.at, to_step=to_step, lr_scale=decision.scale)


def simulate_divergence(job, slots) -> None:
    """simulate.nan_loss_at_step (tests only): tell the learners placed at the start."""
    at = job.spec.simulate.nan_loss_at_step
    if at is not None:
        job.runtime.get([s.handle.simulate_nan_loss.remote(at) for s in slots])
