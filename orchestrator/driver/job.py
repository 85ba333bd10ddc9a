"""TrainingJob: one training job, start to summary. It wires the parts — runtime, capacity,
roster, elastic, group, training loop, evaluator, rollbacks, recovery log, checkpoints — runs
them for the spec's budget and writes the run folder (`evals.jsonl`, `events.jsonl`, checkpoints,
`summary.json`, and the pictures: `curves.png`, `tensorboard/`). Each part owns one concern (see
docs/architecture.md); the job holds no policy of its own beyond when to evaluate and checkpoint.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from orchestrator.base import strict_json
from orchestrator.base.secret import JobSecret
from orchestrator.checkpoint.files import KEEP, LATEST, resume_from
from orchestrator.checkpoint.job_checkpoint import CheckpointFiles, JobCheckpoint, restore_curve
from orchestrator.checkpoint.output import RunOutput
from orchestrator.checkpoint.snapshot import RunningJob
from orchestrator.checkpoint.state_store import StateStore
from orchestrator.cluster.capacity import Capacity
from orchestrator.cluster.runtime import runtime_for
from orchestrator.driver.config import JobSpec
from orchestrator.driver.elastic import Elastic
from orchestrator.driver.events import EventLog
from orchestrator.driver.group import Group
from orchestrator.driver.loop import LoopParts, TrainLoop, mean_loss
from orchestrator.driver.metrics import JobMetrics
from orchestrator.driver.recovery import RecoveryLog
from orchestrator.driver.rollback import Rollbacks, TrainingDiverged, simulate_divergence
from orchestrator.driver.roster import Roster
from orchestrator.driver.snapshots import Snapshots
from orchestrator.driver.summary import summarize
from orchestrator.driver.watchdog import Watchdog
from orchestrator.workload import build_workload

Report = Callable[[dict], None]
__all__ = ["TrainingDiverged", "TrainingJob"]


class TrainingJob:
    """Train `spec` and write its results into `out_dir`.

    Args:
        spec: a validated job spec.
        out_dir: where `checkpoint.pt`, `evals.jsonl`, `events.jsonl` and `summary.json` go: a
            folder, or a URI (`s3://...`, `orchestrator.checkpoint.storage`: the job works in a local staging
            folder, `out_dir` then, and mirrors it there after every checkpoint and at the end).
        report: called with each evaluation's record (the CLI prints a console line from it).
        resume: continue from the newest usable checkpoint in `out_dir` (its counters, weights,
            shard plan and curve).
        runtime: where learners run (`orchestrator.cluster.runtime`; default: Ray when the spec allows
            more than one learner, else this process).
        pool: place the learners in these bundles (`capacity.BundlePool`, e.g. a Tune trial's).
        overwrite: replace the run `out_dir` holds (without `resume` or `overwrite`, a folder that
            holds files is refused: `orchestrator.checkpoint.rundir`).
        keep_checkpoints: how many checkpoints (`checkpoint-<step>.pt`) the folder keeps.
        clock: what the watchdog times learners by (time.time; a test's own).
        staging: with a URI `out_dir`, the local folder the job works in (default: a fresh one);
            with `resume`, a folder a failed upload kept is resumed from and uploaded.
        pictures_dir: where `curves.png` and `tensorboard/` go (`pictures.py`; default: the run's folder)."""

    def __init__(self, spec: JobSpec, out_dir: str | Path, report: Report | None = None, resume: bool = False,
                 runtime=None, pool=None, overwrite: bool = False, keep_checkpoints: int = KEEP,
                 clock: Callable[[], float] = time.time, staging: Path | None = None, pictures_dir: Path | None = None):
        self.runtime = runtime or runtime_for(spec)
        self.output = RunOutput(out_dir, staging, resume, overwrite)  # its folder or URI, and their locks
        self.storage = self.output.storage
        self.spec, self.out_dir, self.resume, self.pool, self.clock = spec, self.output.local, resume, pool, clock
        self.report = report or (lambda record: None)
        self.workload = build_workload(spec.workload, spec.workload_config, spec.seed)  # the driver's: data checks
        # what the job's evaluator builds its workload from (it runs in the job's service, not here)
        self.workload_args = (spec.workload, spec.workload_config.model_dump(mode="json"), spec.seed)
        # where learners and the evaluator write checkpoint files: the run's URI, or its folder
        self.store = StateStore(self.storage.uri or self.out_dir.resolve())
        self.checkpoints = CheckpointFiles(self.out_dir, self.store, self.storage, keep_checkpoints)
        self.job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        self.secret = JobSecret()  # fresh per job; it reaches learners and service only through Ray's calls
        self.recovery = RecoveryLog()
        self.rollbacks = Rollbacks(self.store, self.workload.max_rollbacks, self._emit)
        self.snapshots = Snapshots(self.checkpoints, spec.model_dump(mode="json"), self.rollbacks,
                                   lambda record: self.report(record),  # (a caller may replace `report`)
                                   spec.workload_config.final_splits)  # evaluations and checkpoints, and the curve
        self.roster: Roster | None = None
        self.events: EventLog | None = None
        self._stop, self._interrupted = threading.Event(), threading.Event()
        self.first_step_at: float | None = None
        self.pictures_dir = pictures_dir or self.out_dir

    def _emit(self, *args, **fields) -> None:
        self.events.emit(*args, **fields)  # the event log is made once the run starts (`_assemble`)

    @property
    def evals(self) -> list[dict]:
        """Each evaluation's record, in order (with a resumed run's from before)."""
        return self.snapshots.evals

    @property
    def recoveries(self) -> list[dict]:
        return self.recovery.recoveries

    @property
    def node_groups(self) -> list[list[int]]:
        """Learner ids per node, as last formed (where the group's kind groups learners by node)."""
        return self.group.node_groups if getattr(self, "group", None) else []

    def stop(self) -> None:
        """Finish early but cleanly (from another thread): the learners end their current chunk,
        the job evaluates, writes its summary and returns."""
        self._stop.set()

    def interrupt(self) -> None:
        """Ctrl-C (from a signal handler): the training loop raises KeyboardInterrupt at its next
        turn, however the signal's own KeyboardInterrupt fared."""
        self._interrupted.set()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train, holding the output folder (`orchestrator.checkpoint.rundir`) for the whole run. A split of
        the spec without usable data is the workload's `input_error`, before anything is placed."""
        self.workload.check_data()
        self.claim()
        try:
            return self._run()
        finally:
            self.output.finish()  # however the run ends, what it wrote reaches its storage; locks given back

    def claim(self) -> None:
        """Lock the output and the folder the job writes in (`RunOutput.claim`): `run` does it; the
        CLI does it first, before Ray (and `release`s it if Ray does not start)."""
        self.output.claim(self.job_id)

    def release(self) -> None:
        self.output.release()

    def _run(self) -> dict:
        self.started_at = time.time()
        checkpoint = JobCheckpoint.from_state(resume_from(self.out_dir, self.store).state) if self.resume else None
        for name in ("evals.jsonl", "events.jsonl"):
            if not self.resume or not (self.out_dir / name).exists():
                (self.out_dir / name).write_text("")
        self._assemble()
        try:
            slots = self.elastic.start(checkpoint.learner_ids if checkpoint else [])
            wall_before = self._restore(checkpoint, slots) if checkpoint else 0.0
            self.snapshots.draw_into(self.pictures_dir, self.spec.name, self.events)
            simulate_divergence(self, slots)
            self.form_group()
            if not self.rollbacks.states:  # before the first checkpoint, a rollback goes back to the start
                self.snapshots.save_start()
            loop = TrainLoop(self.loop_parts(), self.spec.budget, time.time() - wall_before)
            train_wall = loop.run()
            # what the group's kind settles before the last evaluation (exchanges in flight, on both
            # sides, in order), on every learner; a kind whose settling leaves replicas equal (every
            # learner's last call answered True) has one model evaluated and one state stored
            answers = [self.elastic.on_every_learner(lambda slot, name=name: self.group.call(slot.handle, name))
                       for name in self.group.before_last_evaluation()]
            if answers and self.group.kind.settles_equal and all(a is True for a in answers[-1].values()):
                self.group.strategy.replicas_equal = True
            self.snapshots.poll(wait=True)
            if loop.losses or not self.evals:  # the end-of-run evaluation (`snapshots.Snapshots`)
                self.snapshots.begin(mean_loss(loop.losses) if loop.losses else float("nan"), loop.start)
                self.snapshots.poll(wait=True)
            summary = summarize(self, train_wall, time.time() - loop.start, loop.first_loss)
            (self.out_dir / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
            return summary
        finally:
            self.snapshots.close()  # (never raises: the learners are released next, whatever happened)
            self.elastic.close_and_release()

    def _restore(self, checkpoint: JobCheckpoint, slots) -> float:
        """Back to `checkpoint`: the learners' states, the shard plan, the counters and the curve;
        the wall seconds it had trained."""
        checkpoint.restore(self.runtime, self.store, self.elastic.service, slots)
        self.roster.retired_samples, self.rollbacks.states = checkpoint.retired_samples, checkpoint.states
        self.snapshots.evals = checkpoint.evals
        restore_curve(self.out_dir, self.evals)
        return checkpoint.wall_s

    def _assemble(self) -> None:
        """The parts, once the runtime is connected."""
        self.runtime.connect()
        spec, distributed = self.spec, self.runtime.distributed
        # recorded when this process is connected to Ray (which a distributed runtime's `connect` makes it)
        self.metrics = JobMetrics(self.job_id, spec.group.kind if distributed else "solo",
                                  enabled=None if distributed else False)
        self.events = EventLog(self.out_dir / "events.jsonl", self.metrics, self.started_at)
        self.watchdog = Watchdog(spec.learners.stuck_after_s, spec.learners.stuck_step_multiple, self.runtime,
                                 self.clock)
        self.roster = Roster(self.events, self.metrics)
        capacity = Capacity(self.job_id, spec, self.runtime, self.pool)
        self.elastic = Elastic(self.job_id, spec, spec.workload_config.model_dump(mode="json"), self.runtime,
                               capacity, self.roster, self.events, adopt_checkpoint=self.rollbacks.adopt,
                               clock=self.clock, secret=self.secret)
        self.group = Group(self.job_id, spec, self.runtime, self.roster, self.elastic, self.events, self.clock)
        self.snapshots.attach(RunningJob(self.runtime, self.roster, self.group, self.elastic, self.metrics,
                                         self.store, self.workload_args))

    def loop_parts(self) -> LoopParts:
        """What the training loop drives (`loop.py`), once the parts are assembled."""
        return LoopParts(self.runtime, self.roster, self.elastic, self.group, self.watchdog, self.recovery,
                         self.rollbacks, self.snapshots, self.out_dir / LATEST, observe=self.observe,
                         form_group=self.form_group, stop_requested=self.stop_requested, interrupted=self.interrupted)

    def form_group(self) -> None:
        """(Re-)form the group; learners that die while joining are dropped and it is formed again."""
        while True:
            if self.elastic.below_min():
                self.elastic.wait_for_min()
            if not self.group.form():
                break
        self.recovery.opened(self.roster.take_changes())
        self.metrics.learners(len(self.roster))

    def observe(self, learner_id: int, stats: dict) -> float | None:
        """One learner's chunk report: its slot, metrics, recoveries; returns its mean loss."""
        self.workload.add_skips(stats.get("skipped"))  # files its node could not read count in the summary
        slot = self.roster.get(learner_id)
        if slot is None:
            return None
        slot.observe(stats)
        self.events.refusals(learner_id, stats.get("refused"))
        self.watchdog.observe(learner_id, stats["step_seconds"])
        self.metrics.learner_chunk(learner_id, stats)
        if slot.speed is not None:
            self.metrics.speed(learner_id, slot.speed)
        if stats.get("first_step_at") is not None:
            self.first_step_at = min(self.first_step_at or stats["first_step_at"], stats["first_step_at"])
        self.recovery.stepped(learner_id, stats.get("step_began", []), stats["step_seconds"])
        return stats["loss"]

    def checkpoint_location(self) -> str:
        """Where the run's newest checkpoint is kept (`CheckpointFiles.location`)."""
        return self.checkpoints.location()
