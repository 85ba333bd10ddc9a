"""Snapshot: one evaluation and checkpoint of a running job, taken without the driver holding a
model and without stopping the training loop for the dev set.

`Snapshot(run, ...)` starts it (`run`: what it asks of the running job, `RunningJob`): the
learners sum their models among themselves (`consensus.py`; allreduce: one replica), the job's
service loads the mean, writes it as the checkpoint's averaged model and scores dev
(`evaluator.py`, on its own thread), each learner measures its distance to the mean, and the
learners whose states differ write them to the run's store (`state_store.py`; allreduce: one,
with every learner's counters). A lockstep group waits
only for the learners' part (a copy of the weights: milliseconds) before its next round, so the
weights and counters belong to one step; free-running learners go on at once (each learner's
state is taken atomically under its weight lock). Replicas equal by construction are checked by a
digest of each learner's weights: equal ones are 0 from the mean without a model crossing a link
(a 40 MB model to each node took minutes at 5 Mbit/s); any that differ are measured.
`finish()` — once `ready()` — gives the evaluation record and the checkpoint's manifest
(`job_checkpoint.py`): file names, sizes and counters, no weights. The driver keeps them and the
job's curve (`driver/snapshots.py`).

What passes through the driver per snapshot is counted (`driver_bytes`): a few kilobytes,
whatever the model's size or the number of learners.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.checkpoint import consensus
from orchestrator.checkpoint.state_store import model_file, state_file

RETRY = "retry"  # finish(): a learner died during the snapshot; take a new one without it
MAX_RETRIES = 10  # more in a row is not learners dying (the job's service is gone): an error


@dataclass(frozen=True)
class RunningJob:
    """What a snapshot asks of the running job: its runtime, roster (the live learners), group (its
    strategy's `replicas_equal` and `state_writers`, `lockstep`), elastic membership (the job's
    service; `drop` for a learner that failed; `on_every_learner`), metrics, the run's state store,
    the arguments the evaluator builds its workload from."""

    runtime: Any
    roster: Any
    group: Any
    elastic: Any
    metrics: Any
    store: Any
    workload_args: tuple


class Snapshot:
    """One evaluation and checkpoint of the running job, in flight while the learners train on.

    Args:
    run: what it asks of the running job (`RunningJob`).
    train_loss: the mean training loss since the last evaluation; start: time.time() the training began.
    """

    def __init__(self, run: RunningJob, train_loss: float, start: float):
        self.run, runtime, self.train_loss, self.start = run, run.runtime, train_loss, start
        # by node (the group's order within it): the tree adds up each node's models before any
        # crosses between nodes
        slots = sorted(run.roster.slots(), key=lambda s: s.node or "")
        self.ids, handles = [s.id for s in slots], [s.handle for s in slots]
        stats = [s.stats for s in slots]
        self.record = {"epoch": round(sum(s["epoch"] for s in stats) / len(stats), 3),
                       "step": sum(s["step"] for s in stats) // len(stats), "samples": run.roster.samples(),
                       "train_loss": round(train_loss, 4), "learners": len(slots)}
        self.wall_s = round(time.time() - start, 2)
        self.step, root = self.record["step"], run.store.root
        if run.group.strategy.replicas_equal or len(handles) == 1:
            total = handles[0].model_vector.remote()
            self.count, leaves = 1, [total]
        else:
            (total, leaves), self.count = consensus.model_sum(handles), len(handles)
        self.evaluation = runtime.submit(run.elastic.service, "evaluate", run.workload_args, total, self.count,
                                         ["dev"], root, model_file(self.step))
        self.distances, self.equal = {}, len(handles) > 1 and run.group.strategy.replicas_equal and \
            consensus.digests_equal(runtime, handles)
        if len(handles) > 1 and not self.equal:
            self.distances = dict(zip(consensus.distances(handles, total, self.count), self.ids, strict=True))
        writers = set(run.group.strategy.state_writers(self.ids))
        self.entries = {(h.save_state.remote(run.store, state_file(self.step, i)) if i in writers
                         else h.counters.remote()): i for i, h in zip(self.ids, handles, strict=True)}
        # the plan from the earliest epoch these learners are in (they only move on from there)
        self.plan = runtime.submit(run.elastic.service, "state", min(s["epoch"] for s in stats))
        self.started_at = time.time()
        if run.group.lockstep:  # the weights, distances and counters of this round, before the next starts
            refs = [*leaves, *self.entries, *self.distances]
            runtime.wait(refs, num_returns=len(refs))

    def refs(self) -> list:
        return [self.evaluation, self.plan, *self.entries, *self.distances]

    def ready(self) -> bool:
        refs = self.refs()
        return len(self.run.runtime.wait(refs, num_returns=len(refs), timeout=0)) == len(refs)

    def finish(self) -> dict | str | None:
        """The evaluation's outcome once every part is done (waits for it): the record (and the
        checkpoint written), None when the averaged weights are not finite (nothing written; the
        job rolls back), or RETRY when a learner died meanwhile. A learner whose own part (its
        state or counters) failed is dropped; the sums and distances fail with any learner of
        the tree, so their failures name nobody."""
        run, runtime = self.run, self.run.runtime
        entries, failed = runtime.gather(dict(self.entries))
        for learner_id, error in failed:
            run.elastic.drop(learner_id, error)
        try:
            distances, lost = runtime.gather(dict(self.distances))
            distances += [(i, 0.0) for i in self.ids] if self.equal else []
            result, plan = runtime.get(self.evaluation), runtime.get(self.plan)
        except Exception as exc:  # noqa: BLE001 - the tree lost a learner: its sum failed
            if not (failed or runtime.failed_remotely(exc)):
                raise
            self.error = exc
            return RETRY
        if failed or lost:
            self.error = (failed or lost)[0][1]
            return RETRY
        self.driver_bytes = len(pickle.dumps((entries, distances, result, plan)))
        if not result["finite"]:
            return None
        record = dict(self.record)
        if distances:
            record["consensus_distance"] = round(sum(d for _, d in distances) / len(distances), 6)
            run.metrics.consensus(record["consensus_distance"])
        dev = result["scores"]["dev"]
        if dev is not None:
            if dev["wer"] is not None:
                run.metrics.evaluation("dev", dev["wer"])
            record.update({"dev_wer": rounded(dev["wer"], 2), "dev_loss": rounded(dev["loss"], 4)})
        record["wall_s"] = self.wall_s
        self.manifest = {"learners": self._learner_entries(dict(entries)), "model": result["model"], "planner": plan}
        return record

    def _learner_entries(self, answers: dict[int, dict]) -> dict[int, dict]:
        """Each learner's entry: its own file, or (its weights equal to a writer's) the writer's
        file with its own counters."""
        written = next(a for a in answers.values() if "file" in a)
        return {i: a if "file" in a else {"file": written["file"], "bytes": written["bytes"], "counters": a}
                for i, a in answers.items()}


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
