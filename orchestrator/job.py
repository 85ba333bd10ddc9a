"""TrainingJob: the driver loop. Runs the learners' group for the spec's budget while its
membership changes (`orchestrator/elastic.py` adds and drops learners; the loop re-forms the
group around them), evaluates the average of all live learners' weights on `dev` as it goes and
on `test`/`test_unseen` at the end, checkpoints the whole job (every learner's state, the shard
plan, the curve) into the output folder, resumes from it, and writes `summary.json`.

Jobs that may have more than one learner run on Ray (one actor and placement group per
learner); a one-learner job runs the same learner in this process.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from jobs.workload import AsrWorkload, WorkloadConfig
from orchestrator import strict_json
from orchestrator.checkpoint import KEEP, LATEST, finite, numbered, resume_from
from orchestrator.checkpoint import save as write_checkpoint
from orchestrator.config import JobSpec
from orchestrator.elastic import Membership
from orchestrator.events import EventLog
from orchestrator.metrics import JobMetrics
from orchestrator.placement import fetch, gone
from orchestrator.rundir import RunDir
from orchestrator.storage import RunStorage
from orchestrator.watchdog import HEARTBEAT_EVERY_S, Watchdog

Report = Callable[[dict], None]
SUPERSEDED = "evals.superseded.jsonl"  # evaluations past the checkpoint a resumed run went back to
CHUNK_STEPS = 8  # steps per `run` call: how often the driver looks at budget and evaluations


class TrainingDiverged(RuntimeError):
    """The training loss stayed non-finite after `optim.max_rollbacks` rollbacks."""


class TrainingJob:
    """Train `spec` and write its results into `out_dir`.

    Args:
        spec: a validated job spec.
        out_dir: where `checkpoint.pt`, `evals.jsonl`, `events.jsonl` and `summary.json` go: a
            folder, or a URI (`s3://...`, `orchestrator.storage`: the job works in a local staging
            folder, `out_dir` then, and mirrors it there after every checkpoint and at the end).
        report: called with each evaluation's record (the CLI prints a console line from it).
        resume: continue from the newest usable checkpoint in `out_dir` (its counters, weights,
            shard plan and curve).
        overwrite: replace the run `out_dir` holds (without `resume` or `overwrite`, a folder that
            holds files is refused: `orchestrator.rundir`).
        keep_checkpoints: how many checkpoints (`checkpoint-<step>.pt`) the folder keeps.
        use_ray: run the learners as Ray actors (default: when the spec allows more than one).
        pool: place the learners in these bundles (`placement.BundlePool`, e.g. a Tune trial's)
            rather than in a placement group per learner.
    """

    def __init__(self, spec: JobSpec, out_dir: str | Path, report: Report | None = None, resume: bool = False,
                 use_ray: bool | None = None, pool=None, overwrite: bool = False, keep_checkpoints: int = KEEP):
        self.use_ray = spec.learners.max > 1 if use_ray is None else use_ray
        self.storage = RunStorage(out_dir)
        self.spec, self.out_dir, self.resume, self.pool = spec, self.storage.local, resume, pool
        self.overwrite, self.keep_checkpoints = overwrite, keep_checkpoints
        self.run_dir = RunDir(self.out_dir)
        self.report = report or (lambda record: None)
        self.workload = AsrWorkload(spec, seed=spec.seed)  # the driver's copy, for evaluation
        self.job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        self.evals: list[dict] = []
        self.eval_model = self.workload.build_model()
        self.metrics: JobMetrics | None = None  # made once Ray is connected (or known not to be)
        self.membership: Membership | None = None
        self.events: EventLog | None = None
        self._stop = threading.Event()
        self._interrupted = threading.Event()
        self._last_states: dict[int, dict] = {}  # of the last checkpoint: what a rollback goes back to
        self.rollbacks = 0
        self._weights_diverged = False  # an evaluation read non-finite weights: roll back
        self._first_step_at: float | None = None
        self.recoveries: list[dict] = []  # membership changes: when, when re-formed, when stepping again
        self._newest_checkpoint: str | None = None  # its file name, once one is written

    @property
    def node_groups(self) -> list[list[int]]:
        """hierarchical: learner ids per node, as last formed."""
        return self.membership.node_groups if self.membership else []

    def stop(self) -> None:
        """Finish early but cleanly (from another thread): the learners end their current chunk,
        the job evaluates, writes its summary and returns."""
        self._stop.set()

    def interrupt(self) -> None:
        """Ctrl-C (from a signal handler): the training loop raises KeyboardInterrupt at its next
        turn, however the signal's own KeyboardInterrupt fared (one raised inside a callback or a
        finalizer is swallowed)."""
        self._interrupted.set()

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train, holding the output folder (`orchestrator.rundir`) for the whole run. A split of
        the spec without a usable utterance is a `jobs.data.DataError`, before anything is placed."""
        self.workload.check_data()
        self.claim()
        try:
            return self._run()
        finally:
            try:
                self.storage.push()  # however the run ends, what it wrote reaches its storage
            finally:
                self.run_dir.release()
                self.storage.close()

    def claim(self) -> None:
        """Check the output (a URI: what it holds, `RunStorage.check`; brought here for a
        resume) and lock the folder the job writes in (`RunDir.claim`): `run` does it; the CLI
        does it first, before it starts Ray."""
        if self.run_dir.held:
            return
        self.storage.check(resume=self.resume, overwrite=self.overwrite)
        if self.resume:
            self.storage.pull()
        self.run_dir.claim(resume=self.resume, overwrite=self.overwrite)

    def _run(self) -> dict:
        self.started_at = time.time()
        checkpoint = self._read_checkpoint() if self.resume else None
        for name in ("evals.jsonl", "events.jsonl"):
            if not self.resume or not (self.out_dir / name).exists():
                (self.out_dir / name).write_text("")
        if self.use_ray:
            import ray

            if not ray.is_initialized():
                ray.init()
        self.metrics = JobMetrics(self.job_id, self.spec.group.kind if self.use_ray else "solo", enabled=self.use_ray)
        self.events = EventLog(self.out_dir / "events.jsonl", self.metrics, self.started_at)
        config = WorkloadConfig.model_validate(self.spec.model_dump(include={"data", "features", "model", "optim"}))
        self.watchdog = Watchdog(self.spec.learners.stuck_after_s, self.spec.learners.stuck_step_multiple)
        self.membership = Membership(self.job_id, self.spec, config.model_dump(mode="json"), self.events,
                                     self.metrics, self.use_ray, fallback_state=self._fallback_state, pool=self.pool)
        try:
            slots = self.membership.start(checkpoint["learner_ids"] if checkpoint else [])
            wall_before = self._restore(checkpoint, slots) if checkpoint else 0.0
            self._simulate_divergence(slots)
            self._form_group()
            self._keep_initial_state()
            return self._train(wall_before)
        finally:
            self.membership.close_and_release()

    def _form_group(self) -> None:
        """(Re-)form the group; learners that die while joining are dropped and it is formed again."""
        m = self.membership
        while True:
            if m.below_min():
                m.wait_for_min()
            if not m.form_group():
                break
        self._note_changes()
        self.metrics.learners(len(m.live))

    def _train(self, wall_before: float) -> dict:
        b, m = self.spec.budget, self.membership
        start = time.time() - wall_before
        deadline = start + b.wall_seconds if b.wall_seconds is not None else None
        lockstep = m.collective or not self.use_ray  # drive in rounds: the driver decides when to stop
        reform = False  # a collective group changed: re-form it once every learner is between chunks
        first_loss = None
        for slot in m.live.values():
            slot.stats = fetch(slot.handle.counters.remote())
        last_epoch = min(self._epochs())
        next_eval_epoch = (last_epoch // b.eval_every_epochs + 1) * b.eval_every_epochs
        last_eval = time.time()
        losses: list[tuple[float, int]] = []  # (a chunk's mean loss, its steps) since the last evaluation
        pending: dict = {}  # run ref -> learner id

        def progress() -> float:
            fractions = []
            if b.epochs is not None:
                epochs = self._epochs()
                fractions.append(sum(epochs) / len(epochs) / b.epochs)
            if deadline is not None:
                fractions.append((time.time() - start) / b.wall_seconds)
            return min(1.0, max(fractions))

        def done(stats) -> bool:
            out_of_epochs = b.epochs is not None and stats.get("epoch", 0) >= b.epochs
            return out_of_epochs or (deadline is not None and time.time() >= deadline) or self._stop.is_set()

        def dispatch(slot, own_deadline: bool) -> None:
            # while a learner is starting, collective rounds are short, so it joins soon after it is ready
            steps = CHUNK_STEPS if not (lockstep and m.arriving) else 2
            ref = slot.handle.run.remote(steps, deadline if own_deadline else None, b.epochs, progress())
            pending[ref] = slot.id

        while True:
            if self._interrupted.is_set():
                raise KeyboardInterrupt
            m.poll()
            m.check_drains()
            m.retire_leaving(running=set(pending.values()))
            if m.below_min():
                self._drain(pending)
                m.wait_for_min()
            if self._note_changes():  # gossip swaps its ring in at once; the collectives re-form
                if m.kind == "gossip":
                    m.form_group()
                    self._recovery_regrouped()
                else:
                    reform = True
            if reform and not pending:
                self._form_group()
                self._recovery_regrouped()
                reform = False
            if lockstep:
                if not m.live or all(done(s.stats) for s in m.live.values()):
                    break
                for slot in m.slots():
                    dispatch(slot, own_deadline=False)
                results, failed = _gather_round(pending, m, self._drop_stuck) if self.use_ray else _gather(pending)
            else:
                if not reform:
                    running = set(pending.values())
                    # learners that share a collective (a hierarchical node) start their chunks
                    # together and stop together (same steps, no deadline of their own): one left
                    # out would keep its peers waiting inside an all-reduce
                    for unit in m.dispatch_units():
                        slots = [m.live[i] for i in unit]
                        if all(s.id not in running and s.in_group and not done(s.stats) for s in slots):
                            for slot in slots:
                                dispatch(slot, own_deadline=len(slots) == 1)
                if not pending:
                    if reform:
                        continue
                    break
                results, failed = _wait_any(pending, timeout=1.0, wake=m.watched())
                self._drop_stuck(pending)
            if self._diverged(results):  # a non-finite loss: back to the last checkpoint at half the rate
                reform = self._roll_back(results, failed, pending) or reform
                losses = []
                continue
            for learner_id, stats in results:
                if stats.get("leaving"):
                    m.leaving(learner_id, stats["leaving"])
                loss = self._observe(learner_id, stats)
                if loss is not None:
                    losses.append((loss, len(stats["step_seconds"])))
                    first_loss = loss if first_loss is None else first_loss
                if stats.get("broken"):
                    reform = True
            for learner_id, error in failed:
                m.drop(learner_id, error)
            if not m.live or reform or m.changes:
                continue
            epoch_now = min(self._epochs())
            if epoch_now > last_epoch:  # at every epoch boundary: adapt to the speeds measured
                last_epoch = epoch_now
                m.rebalance()
            due = epoch_now >= next_eval_epoch or (
                b.eval_every_seconds is not None and time.time() - last_eval >= b.eval_every_seconds)
            if due and losses:
                self._evaluate(_mean_loss(losses), start)
                losses, last_eval = [], time.time()
                next_eval_epoch = (epoch_now // b.eval_every_epochs + 1) * b.eval_every_epochs
        self._drain(pending)
        train_wall = time.time() - start
        if losses or not self.evals:
            self._evaluate(_mean_loss(losses) if losses else float("nan"), start)
        summary = self._summarize(train_wall, time.time() - start, first_loss)
        (self.out_dir / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
        return summary

    def _epochs(self) -> list[int]:
        return [s.stats.get("epoch", 0) for s in self.membership.live.values()] or [0]

    def _observe(self, learner_id: int, stats: dict) -> float | None:
        """One learner's chunk report: its slot, metrics, recoveries; returns its mean loss."""
        m = self.membership
        self.workload.add_skips(stats.get("skipped"))  # files its node could not read count in the summary
        if learner_id not in m.live:
            return None
        slot = m.live[learner_id]
        slot.observe(stats)
        self.watchdog.observe(learner_id, stats["step_seconds"])
        self.metrics.learner_chunk(learner_id, stats)
        if slot.speed is not None:
            self.metrics.speed(learner_id, slot.speed)
        if stats.get("first_step_at") is not None:
            self._first_step_at = min(self._first_step_at or stats["first_step_at"], stats["first_step_at"])
        self._recovery_stepped(learner_id, stats.get("step_began", []), stats["step_seconds"])
        return stats["loss"]

    def _drain(self, pending: dict) -> None:
        """Let every running chunk finish (the learners are then between chunks); a learner that
        is stuck meanwhile is dropped."""
        while pending:
            if self.use_ray:
                results, failed = _wait_any(pending, timeout=HEARTBEAT_EVERY_S, wake=[])
                self._drop_stuck(pending)
            else:
                results, failed = _gather(pending)
            for learner_id, stats in results:
                self._observe(learner_id, stats)
            for learner_id, error in failed:
                self.membership.drop(learner_id, error)

    def _drop_stuck(self, pending: dict) -> None:
        """Drop (kill, free, ask again for) the running learners the watchdog finds stuck; their
        chunks are forgotten."""
        m = self.membership
        running = {i: m.live[i].handle for i in pending.values() if i in m.live}
        for learner_id, why in self.watchdog.stuck(running):
            for ref in [ref for ref, i in pending.items() if i == learner_id]:
                del pending[ref]
            m.drop(learner_id, why)

    # -- recovery times (what bench/elastic.py reports) ------------------------------------------
    def _note_changes(self) -> bool:
        """Open a recovery for every join and failure the membership saw (in a round, an
        evaluation or while re-forming); returns whether there were any."""
        changes = self.membership.take_changes()
        for cause, learner_id, at in changes:
            self.recoveries.append({"cause": cause, "learner": learner_id, "at": round(at, 3),
                                    "regrouped_at": None, "stepping_at": None})
        return bool(changes)

    def _recovery_regrouped(self) -> None:
        now = round(time.time(), 3)
        for r in self.recoveries:
            if r["regrouped_at"] is None:
                r["regrouped_at"] = now

    def _recovery_stepped(self, learner_id: int, step_began: list[float], step_seconds: list[float]) -> None:
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

    # -- evaluation and checkpoints ---------------------------------------------------------------
    def _average_model(self, states: list[dict]) -> float:
        """Load the average of the learners' models into the evaluation model (floating-point
        parameters and buffers averaged, integer buffers taken from learner 0); returns the
        consensus distance (mean L2 distance of each learner's trainable weights to their mean)."""
        models = [s["model"] for s in states]
        mean = {k: torch.stack([m[k] for m in models]).mean(0) if v.is_floating_point() else v
                for k, v in models[0].items()}
        self.eval_model.load_state_dict(mean)
        trainable = [k for k, p in self.eval_model.named_parameters() if p.requires_grad]
        flat = torch.stack([torch.cat([m[k].reshape(-1) for k in trainable]) for m in models])
        flat_mean = torch.cat([mean[k].reshape(-1) for k in trainable])
        return float((flat - flat_mean).norm(dim=1).mean())

    def _evaluate(self, train_loss: float, start: float) -> None:
        """Average the live learners' models, evaluate on dev, checkpoint, report. A learner that
        cannot be read (it died) is dropped and the rest are evaluated."""
        m = self.membership
        refs = {s.handle.state.remote(): s.id for s in m.slots()}  # one read: the average and the checkpoint
        states, failed = _gather(refs)
        for learner_id, error in failed:
            m.drop(learner_id, error)
        if not states:
            return
        states.sort(key=lambda item: item[0])
        if not all(finite(state["model"]) for _, state in states):
            self._weights_diverged = True  # never checkpointed: the training loop rolls back
            return
        consensus = self._average_model([state for _, state in states])
        self._last_states = dict(states)
        stats = [m.live[i].stats for i, _ in states if i in m.live] or [st["counters"] for _, st in states]
        epoch = sum(s["epoch"] for s in stats) / len(stats)
        record = {"epoch": round(epoch, 3), "step": sum(s["step"] for s in stats) // len(stats),
                  "samples": self._samples(), "train_loss": round(train_loss, 4), "learners": len(states)}
        if len(states) > 1:
            record["consensus_distance"] = round(consensus, 6)
            self.metrics.consensus(consensus)
        if self.spec.data.dev is not None:
            dev = self.workload.evaluate(self.eval_model, self.spec.data.dev)
            record.update(dev_wer=_rounded(dev["wer"], 2), dev_loss=_rounded(dev["loss"], 4))
            if dev["wer"] is not None:  # None: no dev utterance could be read
                self.metrics.evaluation("dev", dev["wer"])
        record["wall_s"] = round(time.time() - start, 2)
        self.evals.append(record)
        with open(self.out_dir / "evals.jsonl", "a") as f:
            f.write(strict_json.dumps(record) + "\n")
        self.save_checkpoint(self._last_states, record["wall_s"], record["step"])
        self.report(record)

    def _samples(self) -> int:
        """Utterances trained on by all learners, those that left included."""
        m = self.membership
        return m.retired_samples + sum(s.stats.get("samples", 0) for s in m.live.values())

    def save_checkpoint(self, states: dict[int, dict], wall_s: float, step: int) -> Path:
        """Checkpoint the whole job as of `step` (files and format: `orchestrator.checkpoint`): spec,
        every learner's state (by learner id), the shard plan, the averaged model (what `chorus
        eval` reads) and the curve."""
        m = self.membership
        plan = fetch(m.planner.state.remote()) if self.use_ray else m.planner.state()
        state = {"spec": self.spec.model_dump(mode="json"), "learners": list(states.values()),
                 "learner_ids": list(states), "planner": plan, "model": self.eval_model.state_dict(),
                 "job": {"wall_s": wall_s, "evals": self.evals, "retired_samples": m.retired_samples}}
        path = write_checkpoint(self.out_dir, state, step, self.keep_checkpoints)
        self.storage.push()
        self._newest_checkpoint = path.name
        return path

    def checkpoint_location(self) -> str:
        """Where the run's newest checkpoint is kept: `checkpoint.pt` in a folder, the newest
        `checkpoint-<step>.pt` at a URI."""
        if self.storage.uri is None:
            return str(self.out_dir / LATEST)
        newest = numbered(self.out_dir) if self.out_dir.is_dir() else []
        if newest:
            self._newest_checkpoint = newest[0].name  # the staging folder goes when the run ends
        return self.storage.locate(self._newest_checkpoint or LATEST)

    def _read_checkpoint(self) -> dict:
        """The newest usable checkpoint (unusable newer ones are logged and set aside)."""
        return resume_from(self.out_dir).state

    def _restore(self, checkpoint: dict, slots) -> float:
        """Learners placed under a checkpointed id take their own state back (and their place in
        the epoch); any others start from the first checkpointed learner's model and counters."""
        by_id = dict(zip(checkpoint["learner_ids"], checkpoint["learners"], strict=True))
        first = checkpoint["learners"][0]
        fetch([s.handle.load_state.remote(by_id.get(s.id, first), s.id not in by_id) for s in slots])
        if checkpoint.get("planner"):
            plan = checkpoint["planner"]
            fetch(self.membership.planner.load.remote(plan) if self.use_ray else self.membership.planner.load(plan))
        self.membership.retired_samples = checkpoint["job"].get("retired_samples", 0)
        self.evals = list(checkpoint["job"]["evals"])
        self._last_states = by_id
        # the curve as of the checkpoint; evaluations a stopped run wrote after it (their checkpoint
        # was never written, or was unusable) are kept aside in evals.superseded.jsonl
        curve = self.out_dir / "evals.jsonl"
        kept = {strict_json.dumps(r) for r in self.evals}
        later = [line for line in (curve.read_text().splitlines() if curve.is_file() else []) if line.strip()
                 and strict_json.dumps(json.loads(line)) not in kept]
        if later:
            with open(self.out_dir / SUPERSEDED, "a") as f:
                f.write("".join(line + "\n" for line in later))
        curve.write_text("".join(strict_json.dumps(r) + "\n" for r in self.evals))
        return float(checkpoint["job"]["wall_s"])

    # -- non-finite loss: rollbacks --------------------------------------------------------------
    def _simulate_divergence(self, slots) -> None:
        """simulate.nan_loss_at_step (tests only): tell the learners placed at the start."""
        at = self.spec.simulate.nan_loss_at_step
        if at is not None:
            fetch([s.handle.simulate_nan_loss.remote(at) for s in slots])

    def _keep_initial_state(self) -> None:
        """Before the first checkpoint, a rollback goes back to the learners' starting states."""
        if not self._last_states:
            self._last_states = self._on_every_learner(lambda s: s.handle.state.remote())

    def _diverged(self, results: list[tuple[int, dict]]) -> bool:
        """Whether a chunk's loss, or the weights the last evaluation read, are not finite."""
        return self._weights_diverged or any(
            stats.get("loss") is not None and not math.isfinite(stats["loss"]) for _, stats in results)

    def _roll_back(self, results: list[tuple[int, dict]], failed: list, pending: dict) -> bool:
        """Every learner back to the last checkpointed states at half the learning rate, or
        `TrainingDiverged` once `optim.max_rollbacks` are spent. Returns whether a collective broke
        in this round (the group must then be re-formed)."""
        m, limit = self.membership, self.spec.optim.max_rollbacks
        at = min((s["nonfinite_at"] for _, s in results if s.get("nonfinite_at") is not None), default=None)
        where = f"at step {at}" if at is not None else "in the weights an evaluation read"
        for learner_id, error in failed:
            m.drop(learner_id, error)
        self._drain(pending)
        if self.rollbacks >= limit:
            kept = f"the last good checkpoint is {self.out_dir / LATEST}" if (self.out_dir / LATEST).is_file() \
                else "no checkpoint was written"
            raise TrainingDiverged(f"the training loss became non-finite {where} after {self.rollbacks} rollback(s) "
                                   f"(optim.max_rollbacks={limit}); {kept}; lower optim.lr or raise "
                                   "optim.max_rollbacks")
        scale = 0.5 * min((s.stats.get("lr_scale", 1.0) for s in m.live.values()), default=1.0)
        first = next(iter(self._last_states.values()))
        self._on_every_learner(lambda s: s.handle.load_state.remote(self._last_states.get(s.id, first),
                                                                    s.id not in self._last_states))
        self._on_every_learner(lambda s: s.handle.set_lr_scale.remote(scale))
        for learner_id, counters in self._on_every_learner(lambda s: s.handle.counters.remote()).items():
            m.live[learner_id].stats = counters
        self.rollbacks += 1
        self._weights_diverged = False
        to_step = first["counters"]["step"]
        self.events.emit("rollback", f"non-finite loss {where}: every learner back to step {to_step}, learning rate "
                         f"x{scale:g} (rollback {self.rollbacks} of at most {limit})",
                         at_step=at, to_step=to_step, lr_scale=scale)
        return any(stats.get("broken") for _, stats in results)

    def _on_every_learner(self, call: Callable) -> dict[int, object]:
        """`call(slot)` (a remote call) on every live learner: their answers by id; those that are
        gone are dropped."""
        results, failed = _gather({call(s): s.id for s in self.membership.slots()})
        for learner_id, error in failed:
            self.membership.drop(learner_id, error)
        return dict(results)

    def _fallback_state(self):
        """For a learner joining when no other is alive: the last checkpointed state."""
        return next(iter(self._last_states.values()), None)

    def _summarize(self, train_wall: float, wall: float, first_loss: float | None) -> dict:
        d, m = self.spec.data, self.membership
        finals = {}
        for key, source in (("test", d.test), ("test_unseen", d.test_unseen)):
            result = self.workload.evaluate(self.eval_model, source) if source is not None else None
            if result and result["wer"] is not None:
                self.metrics.evaluation(key, result["wer"])
            finals[f"wer_{key}"] = _rounded(result["wer"], 2) if result else None
            finals[f"utterances_{key}"] = result["utterances"] if result else 0
        last = self.evals[-1] if self.evals else {}
        samples = self._samples()
        events: dict[str, int] = {}
        for event in self.events.recorded:
            events[event["kind"]] = events.get(event["kind"], 0) + 1
        return strict_json.finite({  # what summary.json holds: null for a loss that diverged
            "name": self.spec.name,
            "job_id": self.job_id,
            **finals,
            "wer_dev": last.get("dev_wer"),
            "first_train_loss": round(first_loss, 4) if first_loss is not None else None,
            "final_train_loss": last.get("train_loss"),
            "steps": max((s.stats.get("step", 0) for s in m.live.values()), default=last.get("step", 0)),
            "samples": samples,
            "epochs": last.get("epoch", 0),
            "wall_s": round(wall, 2),
            "startup_s": round(self._first_step_at - self.started_at, 3) if self._first_step_at else None,
            "train_wall_s": round(train_wall, 2),
            "samples_per_s": round(samples / max(train_wall, 1e-9), 2),
            "learners": len(m.live),
            "group": self.spec.group.kind if self.use_ray else "solo",
            "consensus_distance": last.get("consensus_distance"),
            "events": events,
            "recoveries": self.recoveries,
            "nodes": m.nodes_used(),
            "accelerators": m.by_accelerator(),
            "skipped_utterances": dict(self.workload.train.skipped.counts) if self.evals else {},
            "checkpoint": self.checkpoint_location(),
        })


def _rounded(value: float | None, digits: int) -> float | None:
    """round(), passing None (a WER or loss over no utterances) through."""
    return None if value is None else round(value, digits)


def _mean_loss(losses: list[tuple[float, int]]) -> float:
    """The mean step loss of chunks of different lengths (an epoch's 1-step tail weighs 1 step)."""
    steps = sum(n for _, n in losses)
    return sum(loss * n for loss, n in losses) / steps if steps else sum(loss for loss, _ in losses) / len(losses)


def _gather(pending: dict) -> tuple[list[tuple[int, dict]], list[tuple[int, Exception]]]:
    """Every pending result: (learner id, value) for those that answered, (learner id, error)
    for those whose actor or node died. Empties `pending`."""
    results, failed = [], []
    for ref, learner_id in list(pending.items()):
        try:
            results.append((learner_id, fetch(ref)))
        except Exception as exc:  # noqa: BLE001 - only a learner that is gone; a bug in it propagates
            if not gone(exc):
                raise
            failed.append((learner_id, exc))
    pending.clear()
    return results, failed


UNRESPONSIVE_S = 5.0  # a round's member that neither finishes nor answers a ping this long after a
# collective broke is taken for dead (its node may be gone before Ray has declared it dead)


def _gather_round(pending: dict, membership, drop_stuck) -> tuple[list[tuple[int, dict]], list[tuple[int, Exception]]]:
    """A lockstep round's results. Once some members report their collective broken, the others
    get UNRESPONSIVE_S to finish; one that neither finishes nor answers a ping on its `mix`
    thread is reported as failed (its process or node is gone), without waiting for Ray's node
    failure detection. Until then `drop_stuck(pending)` looks for stuck members every few seconds."""
    import ray

    results, failed = [], []
    while pending:
        broken = failed or any(stats.get("broken") for _, stats in results)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=UNRESPONSIVE_S if broken else HEARTBEAT_EVERY_S)
        if not ready and not broken:
            drop_stuck(pending)
            continue
        if not ready:
            silent = {ref: i for ref, i in pending.items() if not _answers(membership.live.get(i))}
            for ref, learner_id in silent.items():
                del pending[ref]
                failed.append((learner_id, RuntimeError(
                    f"no answer {UNRESPONSIVE_S:g} s after its group's collective broke (node unreachable?)")))
            continue
        done_results, done_failed = _gather({ref: pending.pop(ref) for ref in ready})
        results += done_results
        failed += done_failed
    return results, failed


def _answers(slot) -> bool:
    import ray

    if slot is None:
        return False
    ready, _ = ray.wait([slot.handle.ping.remote()], timeout=2.0)
    return bool(ready)


def _wait_any(pending: dict, timeout: float, wake: list) -> tuple[list[tuple[int, dict]], list[tuple[int, Exception]]]:
    """The results that are ready within `timeout` (at least one, unless it passes or one of
    `wake` — e.g. a newcomer's answer — is ready first)."""
    import ray

    ready, _ = ray.wait(list(pending) + wake, num_returns=1, timeout=timeout)
    return _gather({ref: pending.pop(ref) for ref in ready if ref in pending})
