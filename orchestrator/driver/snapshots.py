"""Snapshots: the job's keeper of its evaluations and checkpoints (`checkpoint/snapshot.py`'s
`Snapshot`, one at a time) and of its curve: at most one in flight, one that fell due meanwhile
started once it is done, its record appended to `evals.jsonl` (and drawn: `pictures.py`) and its
manifest saved (`CheckpointFiles`), the rollbacks told the newest states (or that the weights diverged), the
record reported; the splits scored at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator.base import strict_json
from orchestrator.checkpoint.job_checkpoint import CheckpointFiles, JobCheckpoint
from orchestrator.checkpoint.snapshot import MAX_RETRIES, RETRY, RunningJob, Snapshot, rounded
from orchestrator.checkpoint.state_store import START
from orchestrator.driver.pictures import RunPictures


class Snapshots:
    """The job's evaluations and checkpoints, and its curve (`evals`).

    Args:
    files: where checkpoints go (`CheckpointFiles`); spec: the job's spec (as JSON, for the checkpoint).
    rollbacks: the job's `Rollbacks` (told the newest states, and of weights that diverged).
    report: called with each evaluation's record; final_splits: the splits scored at the end.
    """

    def __init__(self, files: CheckpointFiles, spec: dict, rollbacks, report: Callable[[dict], None],
                 final_splits: tuple[str, ...]):
        self.files, self.spec, self.rollbacks, self.report, self.final_splits = files, spec, rollbacks, report, \
            final_splits
        self.run: RunningJob | None = None  # what snapshots ask of the job, once it runs (`attach`)
        self.evals: list[dict] = []  # the curve: each evaluation's record
        self.current: Snapshot | None = None  # the one in flight
        self.due: tuple[float, float] | None = None  # (train_loss, start) of one due while `current` runs
        self.retries = 0  # snapshots in a row that a dying learner spoiled
        self.driver_bytes: list[int] = []  # what the driver received for each finished snapshot
        self.pictures, self.events = None, None  # the curve drawn (`pictures.RunPictures`), once the job runs

    def draw_into(self, folder: Path, name: str, events) -> None:
        """Draw the curve (the run `name`'s) into `folder` at every evaluation (`RunPictures`), with the
        membership changes `events` (an EventLog) records; a resumed run's from where its checkpoint was."""
        self.pictures = RunPictures(folder, name, self.evals[-1]["samples"] if self.evals else None)
        self.events = events

    def close(self) -> None:
        """The last picture drawn, the event file flushed."""
        if self.pictures is not None:
            self.pictures.close()

    def attach(self, run: RunningJob) -> None:
        self.run = run

    def begin(self, train_loss: float, start: float, wait: bool = False) -> None:
        """Start an evaluation and checkpoint of the live learners. While the one in flight is not
        done, this one is started by `poll` once it is, so the training loop does not wait (a
        snapshot that a death spoiled is taken again, which took 1.4-1.6 s at 32 learners); one
        more falling due meanwhile waits for both. `wait` (an epoch's evaluation): wait for the
        one in flight and start this one now, so its record is of this epoch's weights, not of a
        later epoch's (a sweep's scheduler counts one report per epoch)."""
        if not wait and self.current is not None and self.due is None and not self.current.ready():
            self.due = (train_loss, start)
            return
        self.poll(wait=True)
        self._start(train_loss, start)

    def _start(self, train_loss: float, start: float) -> None:
        if self.run.roster.slots():
            self.current = Snapshot(self.run, train_loss, start)

    def poll(self, wait: bool = False) -> None:
        """Finish the snapshot in flight once it is done (`wait`: now, and the one due after it):
        write its record and checkpoint and report it; non-finite weights: no record, the loop
        rolls back; a learner died meanwhile: a new snapshot of the others. Then start the one
        that fell due meanwhile."""
        while True:
            if self.current is None and self.due is not None:
                due, self.due = self.due, None
                self._start(*due)
            if self.current is None or not (wait or self.current.ready()):
                return
            snapshot, self.current = self.current, None
            record = snapshot.finish()
            self.retries = self.retries + 1 if record == RETRY else 0
            if self.retries > MAX_RETRIES:
                raise RuntimeError(f"{self.retries} evaluations in a row failed; the last: {snapshot.error}")
            if record == RETRY:
                if self.run.roster.slots():
                    self.current = Snapshot(self.run, snapshot.train_loss, snapshot.start)
                continue
            self.driver_bytes.append(snapshot.driver_bytes)
            if record is None:
                self.rollbacks.weights_diverged = True  # never checkpointed: the training loop rolls back
                self.due = None  # of the same diverged weights
                continue
            self.evals.append(record)
            with open(self.files.out_dir / "evals.jsonl", "a") as f:
                f.write(strict_json.dumps(record) + "\n")
            if self.pictures is not None:
                self.pictures.add(record, self.evals, self.events.recorded)
            self.rollbacks.states = snapshot.manifest["learners"]
            self.files.save(JobCheckpoint.of(self.spec, snapshot.manifest, record["wall_s"], self.evals,
                                             self.run.roster.retired_samples), record["step"])
            self.report(record)

    def save_start(self) -> None:
        """The starting state, written once by one learner (all start from the same weights): what
        a rollback before the first checkpoint goes back to."""
        run = self.run
        for slot in run.roster.slots():
            answers = run.elastic.on_every_learner(lambda s: s.handle.save_state.remote(run.store, START), [slot])
            if answers:
                self.rollbacks.states = {s.id: answers[slot.id] for s in run.roster.slots()}
                return

    def finals(self) -> dict:
        """`wer_<split>` and `utterances_<split>` of the splits scored at the end, on the model
        evaluated last (scored by the job's service)."""
        run = self.run
        scores = run.runtime.get(run.runtime.submit(run.elastic.service, "score", run.workload_args,
                                                    list(self.final_splits)))
        out = {}
        for split, result in scores.items():
            if result is not None and result["wer"] is not None:
                run.metrics.evaluation(split, result["wer"])
            out[f"wer_{split}"] = rounded(result["wer"], 2) if result else None
            out[f"utterances_{split}"] = result["utterances"] if result else 0
        return out
