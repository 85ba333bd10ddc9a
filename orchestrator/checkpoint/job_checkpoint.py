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
    def of(cls, spec: dict, manifest: dict, wall_s: float, evals: list[dict], retired_samples: int) -> JobCheckpoint:
        """A running job's checkpoint from a finished snapshot's `manifest` (learner entries by
        id, the averaged model's entry, the shard plan), with the job's counters and curve."""
        learners = manifest["learners"]
        return cls(spec=spec, learners=list(learners.values()), learner_ids=list(learners),
                   planner=manifest["planner"], model=manifest["model"],
                   job={"wall_s": wall_s, "evals": evals, "retired_samples": retired_samples})

    def save(self, folder: Path, step: int, keep: int) -> Path:
        return save(folder, asdict(self), step, keep)

    @property
    def states(self) -> dict[int, dict]:
        """Each checkpointed learner's entry, by id (what a rollback goes back to)."""
        return dict(zip(self.learner_ids, self.learners, strict=True))

    @property
    def wall_s(self) -> float:
        """The wall seconds the job had trained."""
        return float(self.job["wall_s"])

    @property
    def evals(self) -> list[dict]:
        return list(self.job["evals"])

    @property
    def retired_samples(self) -> int:
        return self.job.get("retired_samples", 0)

    def restore(self, runtime, store, service, slots) -> None:
        """Learners placed under a checkpointed id take their own state back from `store` (and
        their place in the epoch); any others start from the first checkpointed learner's model and
        counters. The job's `service` takes the shard plan back."""
        by_id, first = self.states, self.learners[0]
        runtime.get([load_entry(s.handle, store, by_id.get(s.id, first), s.id not in by_id) for s in slots])
        if self.planner:
            runtime.get(runtime.submit(service, "load", self.planner))


def restore_curve(out_dir: Path, evals: list[dict]) -> None:
    """The curve as of a checkpoint (its `evals`); evaluations a stopped run wrote after it (their
    checkpoint was never written, or was unusable) are kept aside in evals.superseded.jsonl."""
    curve = out_dir / "evals.jsonl"
    kept = {strict_json.dumps(r) for r in evals}
    later = [line for line in (curve.read_text().splitlines() if curve.is_file() else []) if line.strip()
             and strict_json.dumps(json.loads(line)) not in kept]
    if later:
        with open(out_dir / SUPERSEDED, "a") as f:
            f.write("".join(line + "\n" for line in later))
    curve.write_text("".join(strict_json.dumps(r) + "\n" for r in evals))


class CheckpointFiles:
    """Where a run's checkpoints go: into its folder `out_dir` (the newest `keep` kept), the
    learners' files that no kept checkpoint names pruned from its `store`, everything mirrored to
    its `storage`; and where the newest one is."""

    def __init__(self, out_dir: Path, store, storage, keep: int):
        self.out_dir, self.store, self.storage, self.keep = out_dir, store, storage, keep
        self.newest: str | None = None  # the newest checkpoint's file name, once one is written

    def save(self, checkpoint: JobCheckpoint, step: int) -> Path:
        path = checkpoint.save(self.out_dir, step, self.keep)
        self.store.prune({int(p.stem.split("-")[1]) for p in numbered(self.out_dir)}, step)
        self.storage.push()
        self.newest = path.name
        return path

    def location(self) -> str:
        """Where the run's newest checkpoint is kept: `checkpoint.pt` in a folder; at a URI the
        newest `checkpoint-<step>.pt` (looked up while the staging folder exists: it goes when the
        run ends, so the name is kept)."""
        if self.storage.uri is None:
            return str(self.out_dir / LATEST)
        found = numbered(self.out_dir) if self.out_dir.is_dir() else []
        self.newest = found[0].name if found else (self.newest or LATEST)
        return self.storage.locate(self.newest)


def load_entry(handle, store, entry: dict, adopt: bool):
    """Start a learner's loading of a checkpoint's entry (a ref): a file in `store` (the run's
    `StateStore`), or (format 1) the state itself."""
    if "file" in entry:
        return handle.load_state_file.remote(store, entry, adopt)
    return handle.load_state.remote(entry, adopt)
