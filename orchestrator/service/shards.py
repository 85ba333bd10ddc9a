"""ShardPlanner: which shard of the training data each learner trains on in each epoch, while
the job's membership changes. The driver sets the members; learners ask at every epoch start.
What a learner leaving mid-epoch had not read yet waits here for another to take it over.
"""

from __future__ import annotations


class ShardPlanner:
    """Which shard each learner trains on in each epoch.

    The driver sets the members (ordered learner ids, optionally a weight each); an epoch's split
    is fixed the first time any learner asks for that epoch, so learners that reach an epoch at
    different times split it the same way. A learner not in an epoch's split (it joined later)
    gets None for that epoch.

    `remainders` are the unread rests of parts whose learners left mid-epoch, each
    [epoch, rank, world_size, weights, position]: the first learner done with its own part of that
    epoch (or a later one) takes the oldest over (`adopt`).
    """

    def __init__(self, members: list[int] = (), weights: list[float] | None = None,
                 frozen: dict[int, tuple[list[int], list[float] | None]] | None = None):
        self.members, self.weights = list(members), (list(weights) if weights else None)
        self.frozen = dict(frozen or {})
        self.remainders: list[list] = []

    def set_members(self, members: list[int], weights: list[float] | None = None) -> int:
        """Members from the next epoch nobody has started; returns that epoch."""
        self.members, self.weights = list(members), (list(weights) if weights else None)
        return max(self.frozen, default=-1) + 1

    def assignment(self, learner_id: int, epoch: int) -> tuple[int, int, list[float] | None] | None:
        """(rank, world size, weights) of `learner_id` in `epoch`, or None if it has no shard then.
        A learner that is not a member (a newcomer asking before the driver's new members arrive)
        splits nothing: before, each of its idle steps fixed one more epoch ahead of everyone, and
        in a gossip-32 run with 20 newcomers the newest epoch ran 250 epochs ahead of the others."""
        if epoch not in self.frozen:
            if learner_id not in self.members:
                return None
            self.frozen[epoch] = (list(self.members), self.weights)
        members, weights = self.frozen[epoch]
        if learner_id not in members:
            return None
        return members.index(learner_id), len(members), weights

    def first_epoch_with(self, learner_id: int, epoch: int) -> int | None:
        """The first epoch from `epoch` on in which `learner_id` has a shard (a learner that joined
        after those epochs were split moves straight there), or None if it is not a member."""
        later = [e for e in self.frozen if e >= epoch and learner_id in self.frozen[e][0]]
        if later:
            return min(later)
        if learner_id not in self.members:
            return None
        return max(epoch, max(self.frozen, default=-1) + 1)  # the next epoch nobody has started

    def hand_over(self, learner_id: int, cursor: dict) -> bool:
        """A learner left; `cursor` is its place in the data (`DataCursor.state`): the rest of the
        part it was reading waits for another learner. Returns whether anything was left."""
        if cursor.get("left") == 0:
            return False
        if cursor.get("part") is not None:
            epoch, rank, world_size, weights = cursor["part"]
        elif cursor["epoch"] in self.frozen and learner_id in self.frozen[cursor["epoch"]][0]:
            epoch, (members, weights) = cursor["epoch"], self.frozen[cursor["epoch"]]
            rank, world_size = members.index(learner_id), len(members)
        else:
            return False  # it had no part of its epoch
        self.remainders.append([epoch, rank, world_size, weights, cursor["position"]])
        return True

    def adopt(self, learner_id: int, epoch: int) -> list | None:
        """The oldest remainder of `epoch` or an earlier one, now `learner_id`'s to read; None if none."""
        del learner_id  # any learner may take any remainder
        for k, remainder in enumerate(self.remainders):
            if remainder[0] <= epoch:
                return self.remainders.pop(k)
        return None

    def state(self, from_epoch: int = 0) -> dict:
        """What `load` takes: the members, and the splits of the epochs from `from_epoch` on (a
        checkpoint's: the earliest epoch its learners are in; no learner asks for an earlier one
        again) as runs of consecutive epochs split the same way, [first, last, members, weights]:
        its size follows the membership's changes, not the epochs (free-running learners may be
        hundreds of epochs apart)."""
        runs: list[list] = []
        for epoch in sorted(e for e in self.frozen if e >= from_epoch):
            members, weights = self.frozen[epoch]
            if runs and runs[-1][1] == epoch - 1 and runs[-1][2] == members and runs[-1][3] == weights:
                runs[-1][1] = epoch
            else:
                runs.append([epoch, epoch, members, weights])
        return {"members": self.members, "weights": self.weights, "splits": runs, "remainders": self.remainders}

    def load(self, state: dict) -> None:
        """A `state()`; or a checkpoint's from before 2026-11-25, with every epoch's split under `frozen`."""
        self.members, self.weights = list(state["members"]), state["weights"]
        self.remainders = [list(r) for r in state.get("remainders", [])]
        if "splits" in state:
            self.frozen = {e: (list(members), weights) for first, last, members, weights in state["splits"]
                           for e in range(first, last + 1)}
        else:
            self.frozen = {int(k): (list(v[0]), v[1]) for k, v in state["frozen"].items()}
