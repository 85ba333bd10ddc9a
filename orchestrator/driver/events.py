"""Events of a job — a learner joining, leaving or failing, the group rebalanced or formed again,
the job waiting for capacity, a rollback after a non-finite loss, what a learner refused of
another process (a stranger's connection, a partner's non-finite weights) — written to three
places at once: one JSON line each in the run's `events.jsonl`, a console line (the
`chorus.events` logger, which `chorus train` shows on stderr) and the `chorus_membership_events`
counter (by kind).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from orchestrator.base import strict_json

log = logging.getLogger("chorus.events")

KINDS = ("join", "leave", "failure", "drain", "rebalance", "waiting", "rollback", "regroup", "refused")


class EventLog:
    """The job's events: a JSON line each, a console line and a counter.

    Args: path (the run's events.jsonl, appended to), metrics (a JobMetrics), started_at (the
    job's time.time() at start, for each event's `wall_s`)."""

    def __init__(self, path: Path, metrics, started_at: float):
        self.path, self.metrics, self.started_at = Path(path), metrics, started_at
        self.recorded: list[dict] = []
        self.refused: dict[str, int] = {}  # what the learners refused of other processes, by reason, in all

    def emit(self, kind: str, message: str, **fields) -> dict:
        """Record one event; `message` is the console line, `fields` go into the JSON record."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        now = time.time()
        line = strict_json.dumps({"time": round(now, 3), "wall_s": round(now - self.started_at, 3), "kind": kind,
                                  **fields, "message": message})
        with open(self.path, "a") as f:
            f.write(line + "\n")
        record = json.loads(line)  # a copy: later changes to the fields' objects do not reach it
        self.recorded.append(record)
        self.metrics.event(kind)
        log.info("%s: %s", kind, message)
        return record

    def refusals(self, learner_id: int, counts: dict[str, int] | None) -> None:
        """What a learner refused since its last report (strangers' connections, tensors that were
        not finite), as one `refused` event; the counts add up in `refused` (the summary's)."""
        if not counts:
            return
        for what, count in counts.items():
            self.refused[what] = self.refused.get(what, 0) + count
        self.emit("refused", f"learner {learner_id} refused " + "; ".join(
            f"{count} x {what}" for what, count in sorted(counts.items())), learner=learner_id, counts=counts)
