"""DataCursor: a learner's place in the training data — its epoch, which part of that epoch's
split it reads, and how far its recorded steps got — and the remainders learners hand over.

A learner reads its own part of each epoch's split (`ShardPlanner.assignment`). A learner that
leaves mid-epoch hands the rest of the part it was reading to the planner (`ShardPlanner.hand_over`,
by the driver, from the learner's last counters); a learner whose own part is used up takes over
such a remainder (`ShardPlanner.adopt`) before it counts itself done with the epoch, so the
epoch's data is still trained once over the learners that stay. The cursor's `state` (epoch,
part, position) goes into the learner's counters and checkpoints: a resumed learner reads the
same part from the same place.
"""

from __future__ import annotations

from orchestrator.learner.calls import call


class DataCursor:
    """A learner's place in its data: its epoch, the part it reads and its position there.

    Args:
    workload: the learner's workload (`batches(rank, world_size, epoch, start, weights)`).
    planner: the job's `ShardPlanner` (or its actor).
    learner_id: the learner's id in its job.

    `part` is None while the learner reads its own part of `epoch`'s split, else the adopted
    remainder's [epoch, rank, world_size, weights] (that rank's part of that epoch); `position`
    counts the planned units (the workload's: batches, or a shard stream's utterances) of the
    part used by recorded steps, from the part's beginning.
    """

    def __init__(self, workload, planner, learner_id: int):
        self.workload, self.planner, self.learner_id = workload, planner, learner_id
        self.epoch = self.position = 0
        self.part: list | None = None
        self.batches = self._iter = None  # the part's batches (None: no part this epoch) and their iterator
        self.opened = False
        self._drawn = 0  # position after the batch handed out last

    def next_batch(self):
        """The next batch of this epoch, or None when the epoch's own part and every remainder
        left to adopt are used up (or the learner has no part in this epoch)."""
        if not self.opened:
            self._open()
        batch = next(self._iter, None)
        while batch is None and self._adopt():
            batch = next(self._iter, None)
        self._drawn = self.batches.position if self.batches is not None else 0
        return batch

    def left(self) -> int:
        """Planned units not handed out yet; a learner whose part is used up first takes over a
        remainder if one is waiting (so a collective does not end the epoch without it)."""
        if not self.opened:
            self._open()
        left = len(self.batches) - self._drawn if self.batches is not None else 0
        if left == 0 and self._adopt():
            left = len(self.batches) - self._drawn
        return left

    def commit(self) -> None:
        """A recorded step used the batch handed out last."""
        self.position = self._drawn

    def move_to(self, epoch: int) -> None:
        """Start `epoch` at its beginning, in the learner's own part."""
        self.epoch, self.position, self.part, self.opened = epoch, 0, None, False

    def had_part(self) -> bool:
        """Whether the learner had a part of this epoch's split (a newcomer may have none)."""
        return self.batches is not None or self.part is not None

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "part": self.part, "left": self.left_now()}

    def left_now(self) -> int | None:
        """Planned units of the part not used by recorded steps (None before the part is opened)."""
        return len(self.batches) - self.position if self.opened and self.batches is not None else None

    def load(self, counters: dict, adopt: bool = False) -> None:
        """Take a state's epoch; with `adopt` (a newcomer taking over another learner's state) it
        starts at that epoch's beginning in its own part, else where the state was."""
        self.move_to(counters["epoch"])
        if not adopt:
            self.position, self.part = counters.get("position", 0), counters.get("part")

    def _open(self) -> None:
        self.opened = True
        if self.part is not None:
            epoch, rank, world_size, weights = self.part
        else:
            epoch, assignment = self.epoch, call(self.planner, "assignment", self.learner_id, self.epoch)
            rank, world_size, weights = assignment if assignment is not None else (None, None, None)
        self.batches = None if rank is None else self.workload.batches(
            rank, world_size, epoch, start=self.position, weights=weights)
        self._iter = iter(self.batches) if self.batches is not None else iter(())
        self._drawn = self.batches.position if self.batches is not None else 0

    def _adopt(self) -> bool:
        """Take over a remainder another learner left (of this epoch or an earlier one)."""
        remainder = call(self.planner, "adopt", self.learner_id, self.epoch)
        if remainder is None:
            return False
        *self.part, self.position = remainder
        self._open()
        return True
