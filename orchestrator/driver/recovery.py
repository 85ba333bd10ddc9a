"""Recovery timing, an observer outside the training loop: for every membership change (a join,
a failure, a drain) when it happened, when the group took it in (re-formed, or swapped its ring)
and when the group stepped again with it. What `bench/elastic.py` reports and the summary's
`recoveries` lists."""

from __future__ import annotations

import time


class RecoveryLog:
    def __init__(self):
        self.recoveries: list[dict] = []

    def opened(self, changes: list[tuple[str, int, float]]) -> bool:
        """A recovery for every change (cause, learner, time); returns whether there were any."""
        for cause, learner_id, at in changes:
            self.recoveries.append({"cause": cause, "learner": learner_id, "at": round(at, 3),
                                    "regrouped_at": None, "stepping_at": None})
        return bool(changes)

    def regrouped(self) -> None:
        now = round(time.time(), 3)
        for r in self.recoveries:
            if r["regrouped_at"] is None:
                r["regrouped_at"] = now

    def stepped(self, learner_id: int, step_began: list[float], step_seconds: list[float]) -> None:
        """The group steps with its new membership once a learner in it completes a step that it
        started after the change took effect (for a join: the newcomer itself)."""
        for r in self.recoveries:
            if r["stepping_at"] is not None or r["regrouped_at"] is None:
                continue
            if r["cause"] == "join" and r["learner"] != learner_id:
                continue
            ends = [t + d for t, d in zip(step_began, step_seconds, strict=True) if t >= r["regrouped_at"]]
            if ends:
                r["stepping_at"] = round(min(ends), 3)
