"""JobCheckpoint: what a job's checkpoint holds — the spec, every learner's state by learner id,
the shard plan, the averaged model (what `chorus eval` reads) and the job's counters and curve —
and putting a job back to it on resume. The checkpoint file is the driver's small manifest: the
learners' states and the averaged model are files the learners and the evaluator wrote into the
run's store (`state_store.py`, `snapshot.py`), named there with their sizes and the learners'
counters; on resume each learner reads its own. The file format (versioned, atomic, verified on
load) is `files.py`'s."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.base import strict_json
from orchestrator.checkpoint.files import LATEST, numbered, save

SUPERSEDED = "evals.superseded.jsonl"  # evaluations past the checkpoint a resumed run went back to


@dataclass
class JobCheckpoint:
    spec: dict
    learners: list[dict]  # each learner's entry: {file, bytes, counters} (format 1: its whole state)
    learner_ids: list[int]
    planner: dict | None  # the ShardPlanner's state
    model: dict  # the averaged model's entry: {file, bytes} (format 1: its state_dict)
    job: dict  # wall_s, evals, retired_samples

    @classmethod
    def from_state(cls, state: dict) -> JobCheckpoint:
        return cls(**{k: state[k] for k in cls.__dataclass_fields__})

    @classmethod
    def of(cls, job, manifest: dict, wall_s: float) -> JobCheckpoint:
        """A running job's checkpoint from a finished snapshot's `manifest` (learner entries by
        id, the averaged model's entry, the shard plan)."""
        learners = manifest["learners"]
        return cls(spec=job.spec.model_dump(mode="json"), learners=list(learners.values()),
                   learner_ids=list(learners), planner=manifest["planner"], model=manifest["model"],
                   job={"wall_s": wall_s, "evals": job.evals, "retired_samples": job.roster.retired_samples})

    def save(self, folder: Path, step: int, keep: int) -> Path:
        return save(folder, asdict(self), step, keep)

    def restore(self, job, slots) -> float:
        """Learners placed under a checkpointed id take their own state back (and their place in
        the epoch); any others start from the first checkpointed learner's model and counters.
        Returns the wall seconds the job had trained."""
        by_id = dict(zip(self.learner_ids, self.learners, strict=True))
        first = self.learners[0]
        job.runtime.get([load_entry(s.handle, job.store, by_id.get(s.id, first), s.id not in by_id)
                         for s in slots])
        if self.planner:
            job.runtime.get(job.runtime.submit(job.elastic.service, "load", self.planner))
        job.roster.retired_samples = self.job.get("retired_samples", 0)
        job.evals = list(self.job["evals"])
        job.rollbacks.states = by_id
        self._restore_curve(job.out_dir, job.evals)
        return float(self.job["wall_s"])

    @staticmethod
    def _restore_curve(out_dir: Path, evals: list[dict]) -> None:
        """The curve as of the checkpoint; evaluations a stopped run wrote after it (their
        checkpoint was never written, or was unusable) are kept aside in evals.superseded.jsonl."""
        curve = out_dir / "evals.jsonl"
        kept = {strict_json.dumps(r) for r in evals}
        later = [line for line in (curve.read_text().splitlines() if curve.is_file() else []) if line.strip()
                 and strict_json.dumps(json.loads(line)) not in kept]
        if later:
            with open(out_dir / SUPERSEDED, "a") as f:
                f.write("".join(line + "\n" for line in later))
        curve.write_text("".join(strict_json.dumps(r) + "\n" for r in evals))


def load_entry(handle, store, entry: dict, adopt: bool):
    """Start a learner's loading of a checkpoint's entry (a ref): a file in `store` (the run's
    `StateStore`), or (format 1) the state itself."""
    if "file" in entry:
        return handle.load_state_file.remote(store, entry, adopt)
    return handle.load_state.remote(entry, adopt)


def location_of_newest(storage, out_dir: Path, newest: str | None) -> str:
    """The file name of a run's newest checkpoint: `checkpoint.pt` in a folder; at a URI the
    newest `checkpoint-<step>.pt` (looked up while the staging folder exists: it goes when the
    run ends)."""
    if storage.uri is None:
        return LATEST
    found = numbered(out_dir) if out_dir.is_dir() else []
    return found[0].name if found else (newest or LATEST)
