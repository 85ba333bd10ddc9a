"""Benchmark: the fault matrix. Short Chorus jobs, each hit by one injected fault after its first
evaluation, against `gossip` and `allreduce` (and `hierarchical` where the fault is about learners,
nodes or re-forming); per row: what happened, how long the group took to step again, what was lost
and what was left on the cluster.

One `ray.cluster_utils.Cluster` for the whole run (fast failure detection, as tests/conftest.py's
SYSTEM_CONFIG): a head without learner slots (1 CPU: drivers, a sweep trial's driver bundle), node
A (2 CPUs, 2 `learner_slot`s) and node B (1 CPU, 1 slot); rows that remove or add a node restore
this shape after. One 160-utterance synthetic corpus (jobs/synth/corpus.py) in bench/work/faults/. Jobs
are small (a narrow BiLSTM, 2 to 3 learners holding a `learner_slot` each, 10 s batches, a dev
evaluation every few seconds) and are stopped once the row has its figures. Jobs of in-job faults
run as a `TrainingJob` in a thread of this process; faults around the driver run `chorus train`
(or `chorus sweep`) as a subprocess with `--address` to the cluster.

Faults (`FAULTS`, one table drives the run): learner SIGKILL, learner stuck (`simulate_stall`,
`learners.stuck_after_s` 6 s), node removed, node added (a waiting slot is placed there), driver
SIGKILL / Ctrl-C / SIGTERM then `--resume`, newest checkpoint truncated then `--resume`, disk full
during a checkpoint (the output folder on a tmpfs shrunk below what the next checkpoint needs), NaN
loss (`simulate.nan_loss_at_step`: rollback), a corrupt FLAC appearing mid-run and a training file
vanishing (each a file that the learner which will read it later in its epoch has not read yet;
these jobs run slowed down by `simulate.slowdown`, as learners keep what they read and would
otherwise have read everything before the first evaluation), a passive gossip partner dying
inside an averaging request (`simulate_exit_in_average`), rank 0 dying as the group re-forms after
another learner was killed (`simulate_exit_in_join`), two runs into one `--out` (plain and with
`--overwrite`), a sweep driver SIGKILLed inside its second trial then `chorus sweep --resume`, a
stranger flooding every port of the learners, a gossip peer sending NaN weights and a bucket shard of
bad members (bench/hostile_faults.py), and,
on two hosts with links of their own (bench/network_faults.py, after the others), a host cut off
for 20 s, a link flapping, and a link slowed to 5 Mbit/s.

Each row records:
- `outcome`: a short phrase;
- `recover_s`: fault -> the group stepping again (the job's `recoveries`: stepping_at - fault;
  for a resume: the restart -> its first new step; for a sweep: -> its first new trial report);
  null where nothing had to recover;
- `steps_lost`: group steps done before the fault that the continued run does not build on
  (resume: the step at the fault - the step of the checkpoint resumed from, as the checkpoint's
  step the learners' mean; sweep: the same for the trial it interrupted; rollback: the steps since
  the restored state; otherwise how far a surviving learner's step count went back, normally 0);
- `data_lost`: evaluation records of evals.jsonl written before the fault and missing after, +1 if
  no checkpoint of the run loads at the end, + the first run's output files damaged (two runs);
- `leftovers`: actors and placement groups made during the row still there 30 s after its job
  ended, +1 for a non-empty autoscaler resource request;
- `hung`: the row ran past its time limit (its job is then stopped or killed, its processes and
  actors removed, so the next row runs);
- `traceback`: "Traceback" in the output of a `chorus` run or in this process's log while the
  job ran, or an exception escaping the job thread other than the ones `chorus train` reports in
  one line (a data, checkpoint, run-folder, divergence or capacity error);
- `wall_s`: the row's own wall time; `bench_error`, only when the bench itself failed.
Every figure is one measurement on a shared 2-core machine: read recover_s as an order of
magnitude, not a benchmark of speed (bench/elastic.py measures that, repeated).

Passing: every row has data_lost 0, leftovers 0, hung false and traceback false (and no
bench_error). Writes
`bench/results/faults.json` ({"rows", "passed", "commit", "measured_at", "machine"}) and
`faults.png` (recover_s per fault and group, failed rows marked), and prints a Markdown table.

Usage (as root: the disk-full row mounts a tmpfs; run nothing else heavy beside it):
    .venv/bin/python bench/faults.py                              # the whole matrix (~35 rows, ~40 min)
    .venv/bin/python bench/faults.py --only learner-sigkill --groups gossip --out /tmp/f.json
    .venv/bin/python bench/faults.py --only nan-loss --merge     # replace those rows in faults.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hostile_faults  # noqa: E402, I001  (bench/ is on the path: this script's folder)
import network_faults  # noqa: E402, I001
from harness.results import commit  # noqa: E402

from jobs.data.manifests import DataError, shard_batches  # noqa: E402
from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.cluster.capacity import CapacityTimeout  # noqa: E402
from orchestrator.checkpoint.files import CheckpointError, load_latest, numbered  # noqa: E402
from orchestrator.checkpoint.files import load as load_checkpoint  # noqa: E402
from orchestrator.driver.config import parse_spec  # noqa: E402
from orchestrator.driver.job import TrainingDiverged, TrainingJob  # noqa: E402
from orchestrator.checkpoint.rundir import RunDirError  # noqa: E402
from orchestrator.testing.cluster import (  # noqa: E402
    added_since,
    holdings,
    resource_request,
    settled_since,
    take_away,
)

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "faults"
GROUPS = ("gossip", "allreduce", "hierarchical", "diloco")
KIND_OPTIONS = {"diloco": {"diloco": {"inner_steps": 8, "streaming": {"fragments": 2}}}}  # a group's own section
# as tests/conftest.py: metrics every second, a lost node declared dead within ~3 s
SYSTEM_CONFIG = {"metrics_report_interval_ms": 1000, "health_check_period_ms": 1000,
                 "health_check_failure_threshold": 3}
LEFTOVER_GRACE_S = 30.0
ONE_LINE_ERRORS = (DataError, CheckpointError, RunDirError, TrainingDiverged, CapacityTimeout)  # as the CLI
MORE_STEPS = 8  # group steps a row waits for after recovering, to see the job going on
log = logging.getLogger("bench.faults")


class RowHung(Exception):
    """The row's time limit passed while waiting for something."""


class RowFailed(Exception):
    """What the row waits for can no longer happen (the job ended, a run exited)."""


# -- the cluster ---------------------------------------------------------------------------------
def make_corpus() -> Path:
    """The rows' corpus, made afresh: rows damage files (and put them back)."""
    corpus = WORK / "corpus-160-7"
    synthesize(corpus, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False)
    return corpus


class Bench:
    """The cluster (head, node A, node B), the corpus and what every row shares."""

    def __init__(self, corpus: Path):
        self.corpus = corpus
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
        self.node_a = self.cluster.add_node(num_cpus=2, resources={"learner_slot": 2})
        self.node_b = self.add_node_b()
        self.extra: list = []  # nodes rows added
        ray.init(address=self.cluster.address, log_to_driver=False)

    def add_node_b(self):
        node = self.cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
        self.cluster.wait_for_nodes()
        return node

    def restore_nodes(self) -> None:
        """Back to head + A + B: nodes rows added go, a removed node B comes back."""
        for node in self.extra:
            with contextlib.suppress(Exception):
                self.cluster.remove_node(node, allow_graceful=False)
        self.extra = []
        if self.node_b is None:
            self.node_b = self.add_node_b()

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


# -- one row -------------------------------------------------------------------------------------
class LogCapture(logging.Handler):
    """This process's log records while a row runs (the in-thread job's events and errors)."""

    def __init__(self, echo: bool):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage() + ("\n" + "".join(traceback.format_exception(*record.exc_info))
                                      if record.exc_info else "")
        self.lines.append(f"{record.name}: {text}")
        if self.echo:
            print(f"    | {record.name}: {text}", flush=True)


@dataclass
class Running:
    """A TrainingJob in a thread."""

    job: TrainingJob
    thread: threading.Thread
    outcome: dict


class Proc:
    """A `chorus` subprocess with its stdout and stderr in files."""

    def __init__(self, args: list[str], folder: Path, tag: str):
        self.out, self.err = folder / f"{tag}.stdout", folder / f"{tag}.stderr"
        self.started = time.time()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.popen = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, stdout=out,
                                          stderr=err, start_new_session=True)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def evals(self) -> int:
        return sum(1 for line in self.stdout().splitlines() if line.startswith("epoch "))

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


class Row:
    """One (fault, group) row: its record, its deadline, and the helpers rows are written with."""

    def __init__(self, bench: Bench, fault: str, group: str, limit_s: float, token: str, echo: bool):
        self.bench, self.fault_name, self.group = bench, fault, group
        self.deadline = time.time() + limit_s
        self.name = f"f{token}-{fault}-{group}"  # job names are unique in a run: actor names start with them
        self.dir = WORK / "rows" / f"{fault}-{group}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.out = self.dir / "run"
        self.record = {"fault": fault, "group": group, "outcome": "", "recover_s": None, "steps_lost": 0,
                       "data_lost": 0, "leftovers": 0, "hung": False, "traceback": False}
        self.running: Running | None = None
        self.procs: list[Proc] = []
        self.cleanups: list[Callable] = []
        self.fault_at: float | None = None
        self.steps_at_fault: dict[int, int] = {}  # in-job faults: each live learner's step at the fault
        self.lowest_after: dict[int, int] = {}
        self.evals_at_fault: list[str] = []
        self.capture = LogCapture(echo)
        self.before = holdings()  # what the row's leftovers are counted against
        self.notes: list[str] = []  # what happened, in a few words
        self.problems: list[str] = []  # what went wrong (after the notes in `outcome`)

    # -- waiting -----------------------------------------------------------------------------
    def wait(self, what: str, condition: Callable, timeout: float | None = None, poll: float = 0.2,
             proc: Proc | None = None):
        """Poll `condition` until it returns something truthy. RowHung at the row's deadline (or
        after `timeout`); RowFailed when the row's job, or `proc`, ended first."""
        until = self.deadline if timeout is None else min(self.deadline, time.time() + timeout)
        while True:
            found = condition()
            if found:
                return found
            self._track_steps()
            ended = self._ended(proc)
            if ended:
                raise RowFailed(f"{ended} while waiting for {what}")
            if time.time() >= until:
                raise RowHung(f"waiting for {what}")
            time.sleep(poll)

    def _ended(self, proc: Proc | None = None) -> str | None:
        r = self.running
        if r is not None and not r.thread.is_alive():
            return f"the job ended ({short(r.outcome.get('error', 'finished').splitlines()[0])})"
        if proc is not None and proc.popen.poll() is not None:
            return f"{proc.out.stem} exited {proc.popen.returncode} ({short(last_line(proc.stderr()))})"
        return None

    def left_s(self) -> float:
        return max(0.0, self.deadline - time.time())

    # -- an in-thread job ----------------------------------------------------------------------
    def spec(self, **changes) -> dict:
        """The row's job spec (a dict), with `changes` merged into its sections."""
        c = self.bench.corpus
        spec = {"name": self.name, "seed": 0, "group": {"kind": self.group, **KIND_OPTIONS.get(self.group, {})},
                "learners": {"min": 2, "max": 3, "wait_timeout_s": 90}, "cpus_per_learner": 1,
                "learner_resources": {"learner_slot": 1},
                "data": {"train": str(c / "train.jsonl"), "dev": str(c / "dev.jsonl"), "max_batch_seconds": 10},
                "model": {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1},
                "optim": {"lr": 3e-3, "warmup_steps": 10, "schedule": "constant"},
                "budget": {"epochs": 10_000, "eval_every_epochs": 10_000, "wall_seconds": 150,
                           "eval_every_seconds": 5}}
        for section, value in changes.items():
            spec[section] = {**spec[section], **value} if isinstance(value, dict) and section in spec else value
        return spec

    def start_job(self, **changes) -> TrainingJob:
        job = TrainingJob(parse_spec(self.spec(**changes)), self.out, overwrite=True)
        outcome: dict = {}

        def run():
            try:
                outcome["summary"] = job.run()
            except BaseException as exc:  # noqa: BLE001 - recorded in the row
                outcome["exception"] = exc
                outcome["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"

        thread = threading.Thread(target=run, daemon=True, name=self.name)
        self.running = Running(job, thread, outcome)
        thread.start()
        return job

    def events(self, kind: str, **match) -> list[dict]:
        job = self.running.job
        return [e for e in list(job.events.recorded if job.events else [])
                if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def live(self) -> dict:
        m = self.running.job.roster
        for _ in range(5):
            try:
                return dict(m.live) if m else {}
            except RuntimeError:  # changed size while copied
                time.sleep(0.01)
        return {}

    def group_step(self) -> int:
        return max((s.stats.get("step", 0) for s in self.live().values()), default=0)

    def first_evaluation(self, learners: int = 3) -> TrainingJob:
        """Wait until `learners` have joined and the job evaluated once."""
        job = self.running.job
        self.wait(f"{learners} learners and a first evaluation",
                  lambda: len(self.events("join")) >= learners and job.evals and len(self.live()) >= learners)
        return job

    def recovered(self, cause: str, learner: int) -> float:
        """Wait for the job's recovery of (cause, learner) to step again; sets recover_s from it."""
        job = self.running.job
        r = self.wait(f"the group stepping again after the {cause} of learner {learner}", lambda: [
            r for r in list(job.recoveries) if r["cause"] == cause and r["learner"] == learner and r["stepping_at"]])
        self.record["recover_s"] = round(r[0]["stepping_at"] - self.fault_at, 3)
        return self.record["recover_s"]

    def replaced(self, count: int = 3) -> int:
        """Wait for a learner that joined after the fault to step with the group; returns its id."""
        joined = self.wait("a replacement joining", lambda: [e for e in self.events("join")
                                                             if e["time"] >= self.fault_at])
        newcomer = joined[0]["learner"]
        job = self.running.job
        self.wait(f"the group stepping with learner {newcomer}", lambda: [
            r for r in list(job.recoveries) if r["cause"] == "join" and r["learner"] == newcomer and r["stepping_at"]])
        self.wait(f"{count} learners", lambda: len(self.live()) >= count)
        return newcomer

    def more_steps(self, n: int = MORE_STEPS) -> None:
        then = self.group_step()
        self.wait(f"{n} more steps", lambda: self.group_step() >= then + n)

    def handle_call(self, handle, fn: Callable):
        """`fn(service)` inside a learner actor, on its `mix` thread (answered mid-step)."""
        return ray.get(handle.__ray_call__.options(concurrency_group="mix").remote(fn), timeout=30)

    def fault(self) -> None:
        """Mark the moment of the fault: what was written and the group's step by then."""
        self.fault_at = time.time()
        evals = self.out / "evals.jsonl"
        self.evals_at_fault = evals.read_text().splitlines() if evals.is_file() else []
        if self.running is not None:
            self.steps_at_fault = {i: s.stats.get("step", 0) for i, s in self.live().items()}
            self.lowest_after = dict(self.steps_at_fault)

    def _track_steps(self) -> None:
        """The lowest step each learner that was live at the fault has shown since (a learner
        that went back to an earlier state lost the steps in between)."""
        if self.running is not None and self.fault_at is not None:
            for i, slot in self.live().items():
                if i in self.lowest_after:
                    self.lowest_after[i] = min(self.lowest_after[i], slot.stats.get("step", 0))

    def end_job(self) -> dict | None:
        """Stop the job (it evaluates, writes its summary and returns); check what it left in its
        folder. Returns its summary (None when it ended in an error)."""
        r = self.running
        self._track_steps()
        r.job.stop()
        r.thread.join(timeout=min(120.0, self.left_s() + 30))
        if r.thread.is_alive():
            raise RowHung("the job to stop")
        if self.steps_at_fault and not self.record["steps_lost"]:
            self.record["steps_lost"] = max(0, max(self.steps_at_fault[i] - self.lowest_after[i]
                                                   for i in self.steps_at_fault))
        self.check_outputs()
        exc = r.outcome.get("exception")
        if exc is not None:
            raise RowFailed(f"the job ended with {type(exc).__name__}: {short(str(exc))}")
        return r.outcome["summary"]

    def check_outputs(self) -> None:
        """data_lost: evaluation records there at the fault and gone now; +1 when no checkpoint loads."""
        now = set()  # the curve, and the records a resume set aside (their checkpoint was lost)
        for name in ("evals.jsonl", "evals.superseded.jsonl"):
            if (self.out / name).is_file():
                now |= set((self.out / name).read_text().splitlines())
        missing = [line for line in self.evals_at_fault if line not in now]
        try:
            load_latest(self.out)
            loads = True
        except CheckpointError:
            loads = False
        self.record["data_lost"] += len(missing) + (0 if loads else 1)
        if missing:
            self.problem(f"{len(missing)} evaluation record(s) written before the fault gone from evals.jsonl")
        if not loads:
            self.problem("no checkpoint loads")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    # -- `chorus` runs -------------------------------------------------------------------------
    def write_spec(self, **changes) -> Path:
        path = self.dir / "job.yaml"
        path.write_text(json.dumps(self.spec(**changes)))
        return path

    def chorus(self, *args: str, tag: str) -> Proc:
        proc = Proc([*args, "--address", self.bench.cluster.address], self.dir, tag)
        self.procs.append(proc)
        return proc

    def train(self, spec: Path, *flags: str, tag: str, out: Path | None = None) -> Proc:
        return self.chorus("train", str(spec), "--out", str(out or self.out), *flags, tag=tag)

    def exited(self, proc: Proc, timeout: float | None = None) -> int:
        """Wait for `proc` to exit; its exit code. Any 'Traceback' in its output is recorded."""
        self.wait(f"{proc.out.stem} to exit", lambda: proc.popen.poll() is not None, timeout)
        if "Traceback" in proc.stdout() + proc.stderr():
            self.record["traceback"] = True
        return proc.popen.returncode

    def evaluated(self, proc: Proc, n: int = 1) -> None:
        self.wait(f"evaluation {n} of {proc.out.stem}", lambda: proc.evals() >= n, proc=proc)

    def learner_steps(self, known: set[str] | None = None) -> dict[str, int]:
        """Step counts of the learners of this row's jobs (named `<job>/learner-<id>`) now, by actor
        name; only names not in `known` when given (a resumed run's own)."""
        named = [a for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith(f"{self.name}-") and "/learner-" in a["name"]
                 and (known is None or a["name"] not in known)]
        refs = {}
        for a in named:
            with contextlib.suppress(Exception):
                refs[ray.get_actor(a["name"], namespace=a["namespace"]).heartbeat.remote()] = a["name"]
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=2.0) if refs else ([], [])
        steps = {}
        for ref in ready:
            with contextlib.suppress(Exception):
                steps[refs[ref]] = ray.get(ref)["step"]
        return steps

    def run_step(self) -> int:
        steps = self.learner_steps()
        return sum(steps.values()) // len(steps) if steps else 0  # as a checkpoint's step: the mean

    # -- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop whatever still runs (a hung row's job or processes), then undo the row's changes."""
        if self.running is not None and self.running.thread.is_alive():
            self.running.job.stop()
            self.running.thread.join(timeout=60)
            if self.running.thread.is_alive():  # a job that does not stop: take its learners away
                take_away(added_since(self.before))
                self.running.thread.join(timeout=30)
        for proc in self.procs:
            proc.kill()
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                cleanup()


def short(text: str, limit: int = 140) -> str:
    """A message without folders in its paths, cut to `limit` characters (PyTorch's run long)."""
    text = re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+", "", " ".join(text.split()))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# -- the faults: in-job ---------------------------------------------------------------------------
def learner_sigkill(row: Row) -> None:
    row.start_job()
    row.first_evaluation()
    victim = next(s for s in row.live().values() if s.node == row.bench.node_a.node_id)
    pid = row.handle_call(victim.handle, lambda service: os.getpid())
    row.fault()
    os.kill(pid, signal.SIGKILL)
    row.recovered("failure", victim.id)
    row.replaced()
    row.more_steps()
    learners = len(row.live())
    row.end_job()
    row.note(f"recovered: learner {victim.id} dropped, replaced, {learners} learners")


def learner_stuck(row: Row) -> None:
    row.start_job(learners={"stuck_after_s": 6, "stuck_step_multiple": 5})
    row.first_evaluation()
    victim = row.live()[row.running.job.roster.order[-1]]
    row.fault()
    victim.handle.simulate_stall.remote(3600)
    failure = row.wait("the stuck learner's failure", lambda: row.events("failure", learner=victim.id))[0]
    if not failure["error"].startswith("stuck"):
        row.problem(f"dropped for another reason: {short(failure['error'])}")
    row.recovered("failure", victim.id)
    row.replaced()
    row.more_steps()
    learners = len(row.live())
    row.end_job()
    row.note(f"recovered: declared stuck after {failure['time'] - row.fault_at:.0f} s, killed, replaced, "
             f"{learners} learners")


def node_removed(row: Row) -> None:
    bench = row.bench
    row.start_job()
    row.first_evaluation()
    on_b = [s.id for s in row.live().values() if s.node == bench.node_b.node_id]
    row.fault()
    bench.cluster.remove_node(bench.node_b, allow_graceful=False)
    bench.node_b = None
    for learner in on_b:
        row.recovered("failure", learner)
    row.more_steps()
    learners = len(row.live())
    row.end_job()
    row.note(f"recovered: node B's learner dropped, its slot waiting, {learners} learners")


def node_added(row: Row) -> None:
    bench = row.bench
    row.start_job(learners={"max": 4})
    row.first_evaluation()
    row.fault()
    node = bench.cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    bench.extra.append(node)
    joined = row.wait("a learner joining on the new node", lambda: row.events("join", node=node.node_id))[0]
    row.recovered("join", joined["learner"])
    row.more_steps()
    learners = len(row.live())
    row.end_job()
    row.note(f"recovered: the waiting slot placed on the new node, {learners} learners")


def nan_loss(row: Row) -> None:
    at = 3 * steps_per_epoch(row.bench.corpus, 10.0, 3) + 4  # past the first evaluation (after epoch 1)
    row.start_job(simulate={"nan_loss_at_step": at}, budget={"eval_every_epochs": 1, "eval_every_seconds": None})
    job = row.first_evaluation()
    handles = {i: s.handle for i, s in row.live().items()}

    def steps_now() -> list[int]:
        ready, _ = ray.wait([h.heartbeat.remote() for h in handles.values()], num_returns=len(handles), timeout=2.0)
        out = []
        for ref in ready:
            with contextlib.suppress(Exception):
                out.append(ray.get(ref)["step"])
        return out

    if min(e["step"] for e in job.evals) >= at:
        row.note(f"(the first evaluation came after step {at})")
    row.wait(f"a learner at step {at} (its loss NaN)", lambda: any(s >= at for s in steps_now()), poll=0.02)
    row.fault()
    rollback = row.wait("a rollback", lambda: row.events("rollback"))[0]
    row.wait("the group stepping again from the restored state", lambda: any(
        rollback["to_step"] < s < at for s in steps_now()), poll=0.02)
    row.record["recover_s"] = round(time.time() - row.fault_at, 3)
    row.wait(f"every learner past step {at + MORE_STEPS}", lambda: len(steps_now()) >= 2 and min(
        steps_now()) > at + MORE_STEPS)
    row.end_job()
    rollbacks = row.events("rollback")
    row.record["steps_lost"] = sum((r.get("at_step") or at) - r["to_step"] for r in rollbacks)
    row.note(f"rolled back {len(rollbacks)}x to step {rollbacks[0]['to_step']}, lr x{rollbacks[-1]['lr_scale']:g}, "
             "went on")


def unread_training_file(row: Row) -> Path:
    """A training file that a live learner will read later in its current epoch and has not read
    (or tried to) yet: from the far end of the rest of its shard."""
    def pick(service):
        learner = service.learner
        corpus, batches = learner.workload.train, learner._batches
        if batches is None:
            return None
        rest = [i for b in batches.plan[batches.position + 2:] for i in b
                if not corpus.tried(i)]
        return str(corpus.utterances[rest[-1]].path) if rest else None

    def any_learner():
        for slot in row.live().values():
            with contextlib.suppress(Exception):
                found = row.handle_call(slot.handle, pick)
                if found:
                    return found
        return None
    return Path(row.wait("a training file not read yet", any_learner, poll=0.5))


def damaged_file(row: Row, damage: Callable[[Path], None], what: str) -> None:
    # learners read (and keep) every file they are given in their first epochs, which these small
    # jobs finish in seconds: slowed down (simulate.slowdown), they evaluate first while files are
    # still unread
    row.start_job(simulate={"slowdown": {0: 10, 1: 10, 2: 10}}, budget={"eval_every_seconds": 2})
    row.first_evaluation()
    path = unread_training_file(row)
    backup = row.dir / "original.flac"
    shutil.copy2(path, backup)
    row.cleanups.append(lambda: shutil.copy2(backup, path))
    row.fault()
    damage(path)
    skipped = row.running.job.workload.train.skipped
    row.wait(f"{path.name} skipped", lambda: str(path) in skipped.keys, timeout=90)
    row.more_steps()
    summary = row.end_job()
    reasons = summary.get("skipped_utterances") or {}
    row.note(f"{what}: skipped {sum(reasons.values())} utterance(s) ({', '.join(reasons)}), training went on")


def corrupt_flac(row: Row) -> None:
    damaged_file(row, lambda p: p.write_bytes(os.urandom(p.stat().st_size)), "overwritten with garbage")


def file_vanished(row: Row) -> None:
    damaged_file(row, lambda p: p.unlink(), "deleted")


def partner_dies_mid_exchange(row: Row) -> None:
    row.start_job()
    job = row.first_evaluation()
    m = job.roster
    passive = m.order[1] if row.group == "gossip" else job.node_groups[1][0]  # a passive (leader) on the ring
    row.fault()
    ray.get(row.live()[passive].handle.simulate_exit_in_average.remote(), timeout=30)
    row.recovered("failure", passive)
    row.replaced()
    row.more_steps()
    failed = sum(s.stats.get("failed_exchanges", 0) for s in row.live().values())
    row.end_job()
    row.note(f"recovered: passive partner {passive} dropped, replaced ({failed} exchange(s) lost)")


def rank0_dies_in_reform(row: Row) -> None:
    row.start_job()
    job = row.first_evaluation()
    order = list(job.roster.order)
    rank0, victim = order[0], order[-1]
    healthy = [i for i in order if i not in (rank0, victim)]
    ray.get(row.live()[rank0].handle.simulate_exit_in_join.remote(), timeout=30)
    row.fault()
    ray.kill(row.live()[victim].handle)
    row.wait("both failures", lambda: {e["learner"] for e in row.events("failure")} >= {rank0, victim})
    row.recovered("failure", rank0)
    row.wait("two newcomers stepping", lambda: len([r for r in list(job.recoveries) if r["cause"] == "join"
                                                     and r["stepping_at"]]) >= 2)
    row.more_steps()
    row.end_job()
    lost = {e["learner"] for e in row.events("failure")} - {rank0, victim}
    row.note(f"recovered: rank 0 and the killed learner dropped, {len(healthy) - len(lost)} healthy kept, "
             f"2 replaced" + (f"; also dropped: {sorted(lost)}" if lost else ""))


def steps_per_epoch(corpus: Path, max_batch_seconds: float, learners: int) -> int:
    durations = [json.loads(line)["duration"] for line in (corpus / "train.jsonl").read_text().splitlines()]
    return max(len(shard_batches(durations, max_batch_seconds, 0, 0, r, learners)) for r in range(learners))


# -- the faults: around the driver ----------------------------------------------------------------
def interrupted_then_resumed(row: Row, how: signal.Signals) -> None:
    spec = row.write_spec(budget={"wall_seconds": 40})
    first = row.train(spec, tag="train-1")
    row.evaluated(first)
    row.wait("a few steps past the checkpoint", lambda: row.run_step() >= checkpoint_step(row.out) + MORE_STEPS,
             proc=first)
    step = row.run_step()
    row.fault()
    first.popen.send_signal(how)
    code = row.exited(first, timeout=90)
    expected = -signal.SIGKILL if how == signal.SIGKILL else 128 + how
    said = last_line(first.stderr())
    if code != expected:
        row.problem(f"the first run exited {code}, expected {expected}: {short(said)}")
    if how != signal.SIGKILL and "learners released" not in said:
        row.problem(f"no one-line goodbye: {short(said)!r}")
    resume_and_finish(row, spec, step)


def resume_and_finish(row: Row, spec: Path, step_at_fault: int, expect_fallback: bool = False) -> None:
    """`chorus train --resume` into the row's folder: time to its first new step, steps lost, the
    curve kept, a clean end."""
    known = set(row.learner_steps())
    loaded = load_latest(row.out)
    from_step = checkpoint_step(row.out, loaded.path)
    row.record["steps_lost"] = max(0, step_at_fault - from_step)
    # each learner starts at its own checkpointed step (a new id: at the first one's)
    restored = {i: st["counters"]["step"] for i, st in zip(loaded.state["learner_ids"], loaded.state["learners"],
                                                           strict=True)}

    def start(name: str) -> int:  # `<job>/learner-<id>`
        return restored.get(int(name.rsplit("-", 1)[1]), loaded.state["learners"][0]["counters"]["step"])

    resumed = row.train(spec, "--resume", tag="train-2")
    stepped = row.wait("the resumed run's first new step", lambda: "stepped" if any(
        step > start(name) for name, step in row.learner_steps(known).items()) else
        "exited" if resumed.popen.poll() is not None else None, poll=0.1)
    if stepped == "stepped":
        row.record["recover_s"] = round(time.time() - resumed.started, 3)
    else:
        row.problem("the resumed run never stepped")
    code = row.exited(resumed)
    row.check_outputs()
    fallback = [line for line in resumed.stderr().splitlines() if "falling back to" in line]
    if code != 0:
        row.problem(f"the resumed run exited {code}: {short(last_line(resumed.stderr()))}")
    if expect_fallback and len(fallback) != 1:
        row.problem(f"expected one 'falling back' line, saw {len(fallback)}")
    said = f", said: {short(fallback[0].split(': ', 1)[-1])!r}" if fallback else ""
    row.note(f"resumed from step {from_step} ({loaded.path.name}){said}, exit {code}")


def checkpoint_step(out: Path, path: Path | None = None) -> int:
    """The step of a checkpoint file (its name), or of the newest one; 0 when there is none."""
    paths = [path] if path is not None else numbered(out)
    if not paths:
        return 0
    name = paths[0].name
    if name.startswith("checkpoint-"):
        return int(name.removeprefix("checkpoint-").removesuffix(".pt"))
    return load_latest(out).state["job"]["evals"][-1]["step"]


def driver_sigkill(row: Row) -> None:
    interrupted_then_resumed(row, signal.SIGKILL)


def ctrl_c(row: Row) -> None:
    interrupted_then_resumed(row, signal.SIGINT)


def sigterm(row: Row) -> None:
    interrupted_then_resumed(row, signal.SIGTERM)


def checkpoint_truncated(row: Row) -> None:
    spec = row.write_spec(budget={"wall_seconds": 24})
    first = row.train(spec, tag="train-1")
    code = row.exited(first)
    if code != 0:
        raise RowFailed(f"the first run exited {code}: {last_line(first.stderr())}")
    newest = numbered(row.out)
    if len(newest) < 2:
        raise RowFailed(f"the first run left {len(newest)} checkpoint(s), need 2")
    step = checkpoint_step(row.out, newest[0])
    row.fault()
    with open(newest[0], "r+b") as f:
        f.truncate(newest[0].stat().st_size // 2)
    resume_and_finish(row, spec, step, expect_fallback=True)


def disk_full(row: Row) -> None:
    mount = row.dir / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    row.cleanups.append(lambda: subprocess.run(["umount", "-l", str(mount)], check=False))
    row.out = mount / "run"
    spec = row.write_spec(budget={"wall_seconds": 60})
    run = row.train(spec, tag="train-1")
    row.evaluated(run)
    row.wait("the first checkpoint", lambda: numbered(row.out), proc=run)
    size = numbered(row.out)[0].stat().st_size
    used = shutil.disk_usage(mount).used
    row.fault()
    subprocess.run(["mount", "-o", f"remount,size={(used + size // 2) // 1024 + 1}k", str(mount)], check=True)
    evals = run.evals()
    row.wait("the next checkpoint to fail or the run to go on",
             lambda: run.popen.poll() is not None or run.evals() > evals + 1)
    went_on = run.popen.poll() is None
    if went_on:
        run.popen.send_signal(signal.SIGINT)
    code = row.exited(run, timeout=90)
    said = last_line(run.stderr())
    row.check_outputs()
    temp = [p.name for p in row.out.glob(".*.tmp")]
    if temp:
        row.problem(f"temp files left: {temp}")
    if not went_on and not any(w in said.lower() for w in ("space", "disk full", "enospc")):
        row.problem("its line does not say the disk is full")
    row.note(("went on past the full disk" if went_on else f"stopped, exit {code}: {short(said)!r}") +
             ("; the previous checkpoint loads" if row.record["data_lost"] == 0 else ""))


def two_runs_one_out(row: Row) -> None:
    spec = row.write_spec(budget={"wall_seconds": 30})
    first = row.train(spec, tag="train-1")
    row.evaluated(first)
    files = ("evals.jsonl", "events.jsonl")
    before = {f: (row.out / f).read_text() for f in files}
    row.fault()
    refusals = []
    for flags in ((), ("--overwrite",)):
        second = row.train(spec, *flags, tag=f"second{''.join(flags)}")
        code = row.exited(second, timeout=120)
        lines = [line for line in second.stderr().splitlines() if line.strip()]
        refusals.append(code != 0 and len(lines) == 1)
        if not refusals[-1]:
            row.problem(f"second run {' '.join(flags) or '(plain)'}: exit {code}, {len(lines)} stderr line(s): "
                        f"{short(last_line(second.stderr()))!r}")
    code = row.exited(first)
    damaged = [f for f in files if not (row.out / f).read_text().startswith(before[f])]
    if not (row.out / "summary.json").is_file():
        damaged.append("summary.json")
    row.record["data_lost"] += len(damaged)
    row.check_outputs()
    if damaged:
        row.problem(f"first run's files damaged: {damaged}")
    row.note(("refused: one line" if all(refusals) else "not refused cleanly") +
             f" ({short(last_line(row.procs[1].stderr()))!r}); the first run exit {code}" +
             ("" if damaged else ", unharmed"))


def sweep_driver_sigkill(row: Row) -> None:
    """3 trials of 2 learners, one at a time, 4 epochs each; the sweep's driver is killed once a
    trial has finished and the next has reported (and checkpointed) an epoch."""
    import yaml

    epochs = 4
    c = row.bench.corpus
    job = {k: v for k, v in row.spec().items() if k in ("seed", "group", "data", "model", "optim", "learner_resources")}
    job["name"] = row.name
    job["simulate"] = {"slowdown": {0: 3, 1: 3}}  # longer epochs: time to kill the sweep inside a trial
    job["learners"] = 2  # (what the trials get; the job spec checks slowdown's indices against it)
    sweep = {"name": row.name, "job": job, "method": "random", "trials": 3, "max_concurrent": 1, "learners": 2,
             "driver_cpus": 0.5, "cpus_per_learner": 0.5, "budget": {"max": epochs, "min": 1},
             "space": {"optim.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}
    job["data"] = {**job["data"], "test": str(c / "test.jsonl"), "max_batch_seconds": 20}
    path = row.dir / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    experiment = row.out / "tune"
    first = row.chorus("sweep", str(path), "--out", str(row.out), tag="sweep-1")

    def one_finished_one_midway() -> dict | None:
        states, reports = trial_states(experiment), trial_reports(experiment)
        midway = [t for t, s in states.items() if s == "RUNNING" and 1 <= len(reports.get(t, [])) < epochs]
        return states if len(states) == 3 and "TERMINATED" in states.values() and midway else None

    states = row.wait("a finished trial and one past its first epoch", one_finished_one_midway, poll=0.1,
                      proc=first)
    if first.popen.poll() is not None:
        raise RowFailed("the sweep ended before it could be killed")
    steps = row.learner_steps()
    reports = trial_reports(experiment)
    row.fault()
    os.killpg(first.popen.pid, signal.SIGKILL)
    first.popen.wait()
    running = [t for t, s in states.items() if s == "RUNNING"]
    at_kill = max(steps.values(), default=0)
    reported = max((r["step"] for t in running for r in reports.get(t, [])), default=0)
    row.record["steps_lost"] = max(0, at_kill - reported) if running else 0
    resumed = row.chorus("sweep", str(path), "--out", str(row.out), "--resume", tag="sweep-2")
    counts = {t: len(r) for t, r in reports.items()}
    first_report = row.wait("the resumed sweep's first new report", lambda: "reported" if any(
        len(r) > counts.get(t, 0) for t, r in trial_reports(experiment).items()) else
        "exited" if resumed.popen.poll() is not None else None)
    if first_report == "reported":
        row.record["recover_s"] = round(time.time() - resumed.started, 3)
    code = row.exited(resumed)
    after = trial_reports(experiment)
    finished = [t for t, s in states.items() if s == "TERMINATED"]
    lost = sum(1 for t in finished for r in reports[t] if r not in after.get(t, []))
    rerun = [t for t in finished if len(after.get(t, [])) != len(reports[t])]
    row.record["data_lost"] += lost
    summary = json.loads(last_line(resumed.stdout()) or "{}") if code == 0 else {}
    best = (summary.get("best_job_summary") or {}).get("checkpoint")
    try:
        load_checkpoint(best)
    except (CheckpointError, TypeError):
        row.record["data_lost"] += 1
        row.problem(f"the best trial's checkpoint does not load ({best})")
    if rerun:
        row.problem(f"finished trials run again: {len(rerun)}")
    if code != 0:
        row.problem(f"the resumed sweep exited {code}: {short(last_line(resumed.stderr()))}")
    row.note(f"resumed: trials {summary.get('trials_by_outcome')}, {summary.get('trials_resumed')} from a "
             "checkpoint" + (", none of the finished run again" if not rerun else ""))


def trial_states(experiment: Path) -> dict[str, str]:
    """Trial id -> status, from Tune's newest experiment state."""
    states = sorted(experiment.glob("experiment_state-*.json"))
    try:
        data = json.loads(states[-1].read_text()) if states else {}
    except (json.JSONDecodeError, OSError):
        return {}
    return {json.loads(t)["trial_id"]: json.loads(t)["status"] for t, _ in data.get("trial_data", [])}


def trial_reports(experiment: Path) -> dict[str, list[dict]]:
    """Trial id -> its reports (Tune's result.json), without Tune's timing fields."""
    out = {}
    for result in experiment.glob("*/result.json") if experiment.is_dir() else []:
        rows = []
        for line in result.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                r = json.loads(line)
                rows.append({k: r.get(k) for k in ("trial_id", "training_iteration", "step", "dev_wer", "epoch")})
        if rows:
            out[rows[0]["trial_id"]] = rows
    return out


# -- the table that drives the run ----------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    name: str
    groups: tuple[str, ...]
    run: Callable[[Row], None]
    limit_s: float = 300.0
    network: bool = False  # on two hosts with links of their own (bench/network_faults.py), as root


ALL, BOTH = GROUPS[:3], ("gossip", "allreduce")
EVERY = GROUPS  # the rows every kind, diloco too, is held to (issue 57)
FAULTS = [
    Fault("learner-sigkill", EVERY, learner_sigkill),
    Fault("learner-stuck", EVERY, learner_stuck),
    Fault("node-removed", EVERY, node_removed),
    Fault("node-added", EVERY, node_added),
    Fault("driver-sigkill", BOTH, driver_sigkill, 420),
    Fault("ctrl-c", BOTH, ctrl_c, 420),
    Fault("sigterm", BOTH, sigterm, 420),
    Fault("checkpoint-truncated", BOTH, checkpoint_truncated, 420),
    Fault("disk-full", BOTH, disk_full, 300),
    Fault("nan-loss", BOTH, nan_loss),
    Fault("corrupt-flac", BOTH, corrupt_flac),
    Fault("file-vanished", BOTH, file_vanished),
    Fault("partner-dies-mid-exchange", ("gossip", "hierarchical"), partner_dies_mid_exchange),
    Fault("rank0-dies-in-reform", ("allreduce", "hierarchical"), rank0_dies_in_reform),
    Fault("two-runs-one-out", BOTH, two_runs_one_out, 300),
    Fault("sweep-driver-sigkill", ("gossip",), sweep_driver_sigkill, 900),
    Fault("stranger-flood", ALL, hostile_faults.stranger_flood),
    Fault("nan-peer", ("gossip", "hierarchical"), hostile_faults.nan_peer),
    Fault("hostile-bucket-shard", BOTH, hostile_faults.hostile_bucket_shard),
    Fault("host-cut-off", EVERY, network_faults.host_cut_off, 420, network=True),
    Fault("link-flapping", ALL, network_faults.link_flapping, 420, network=True),
    Fault("link-slow", ALL, network_faults.link_slow, 300, network=True),
]


def run_row(bench: Bench, fault: Fault, group: str, token: str, echo: bool) -> dict:
    row = Row(bench, fault.name, group, fault.limit_s, token, echo)
    before = row.before
    started = time.time()
    logging.getLogger().addHandler(row.capture)
    try:
        fault.run(row)
    except RowHung as exc:
        row.record["hung"] = True
        row.problem(f"hung: {exc}")
    except RowFailed as exc:
        row.problem(f"failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - the bench's own error, recorded in the row
        row.record["bench_error"] = f"{type(exc).__name__}: {exc}"
        row.problem(f"bench error: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    finally:
        try:
            row.close()
        finally:
            logging.getLogger().removeHandler(row.capture)
    escaped = row.running.outcome.get("exception") if row.running else None
    if escaped is not None and not isinstance(escaped, ONE_LINE_ERRORS):
        row.record["traceback"] = True  # `chorus train` would have shown a traceback
    if any("Traceback" in line for line in row.capture.lines):
        row.record["traceback"] = True
    left = settled_since(before, LEFTOVER_GRACE_S)
    request = resource_request()
    row.record["leftovers"] = sum(len(v) for v in left.values()) + (1 if request else 0)
    if left or request:
        row.problem(f"left: {({k: len(v) for k, v in left.items()})}" + (f", autoscaler request {request}"
                                                                          if request else ""))
        take_away(left)
    bench.restore_nodes()
    row.record["outcome"] = "; ".join(row.notes + row.problems)
    row.record["wall_s"] = round(time.time() - started, 1)
    return row.record


def row_passed(r: dict) -> bool:
    return r["data_lost"] == 0 and r["leftovers"] == 0 and not r["hung"] and not r["traceback"] \
        and "bench_error" not in r


# -- output ---------------------------------------------------------------------------------------
def markdown(rows: list[dict]) -> str:
    lines = ["| fault | group | outcome | recover s | steps lost | data lost | leftovers | hung | traceback |",
             "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        rec = "–" if r["recover_s"] is None else f"{r['recover_s']:.1f}"
        outcome = r["outcome"].replace("|", "/")
        lines.append(f"| {r['fault']} | {r['group']} | {outcome} | {rec} | {r['steps_lost']} | {r['data_lost']} | "
                     f"{r['leftovers']} | {'**yes**' if r['hung'] else 'no'} | "
                     f"{'**yes**' if r['traceback'] else 'no'} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.patches import Patch

    faults = list(dict.fromkeys(r["fault"] for r in rows))
    colors = {"gossip": "tab:green", "allreduce": "tab:blue", "hierarchical": "tab:orange", "diloco": "tab:purple"}
    width = 0.2
    fig, ax = plt.subplots(figsize=(max(8.0, 0.7 * len(faults) + 3), 5.2))
    for r in rows:
        x = faults.index(r["fault"]) + (GROUPS.index(r["group"]) - (len(GROUPS) - 1) / 2) * width
        failed = not row_passed(r)
        if r["recover_s"] is not None:
            value = max(r["recover_s"], 0.01)
            ax.bar(x, value, width, color=colors[r["group"]], alpha=0.85, edgecolor="red" if failed else None,
                   hatch="//" if failed else None)
            ax.text(x, value * 1.1, f"{r['recover_s']:.1f}", ha="center", va="bottom", fontsize=6, rotation=90)
        else:
            ax.text(x, 0.012, "n/a", ha="center", va="bottom", fontsize=6, rotation=90, color=colors[r["group"]])
        if failed:
            ax.text(x, 0.03, "x", ha="center", va="bottom", fontsize=12, color="red", fontweight="bold")
    handles = [Patch(color=c, label=g) for g, c in colors.items()] + [
        Patch(facecolor="white", edgecolor="red", hatch="//", label="row failed (x): data lost, leftovers, hang "
                                                                   "or traceback")]
    ax.set_yscale("log")
    ax.set_ylim(0.01, 1000)
    ax.set_xticks(range(len(faults)), faults, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("fault -> the group stepping again (s)")
    ax.set_title("Chorus fault matrix: time to recover (n/a: nothing had to recover)", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    fig.subplots_adjust(bottom=0.28, left=0.08, right=0.98, top=0.93)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import torch

    return (f"{platform.node()}: {os.cpu_count()} CPU cores, {mem:.0f} GiB RAM, {platform.platform()}; "
            f"Python {platform.python_version()}, Ray {ray.__version__}, torch {torch.__version__}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="faults to run, comma-separated (default: all): "
                        + ", ".join(f.name for f in FAULTS))
    parser.add_argument("--groups", default=",".join(GROUPS), help="groups to run them against")
    parser.add_argument("--out", type=Path, default=RESULTS / "faults.json", help="the JSON (the PNG goes beside it)")
    parser.add_argument("--merge", action="store_true", help="keep the other rows of an existing --out")
    parser.add_argument("--verbose", action="store_true", help="echo the jobs' log lines")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or [f.name for f in FAULTS]
    unknown = sorted(set(names) - {f.name for f in FAULTS})
    groups = [g for g in args.groups.split(",") if g]
    if unknown or set(groups) - set(GROUPS):
        parser.error(f"unknown fault(s) {unknown} or group(s) {sorted(set(groups) - set(GROUPS))}")
    if os.geteuid() != 0 and ("disk-full" in names or any(f.network for f in FAULTS if f.name in names)):
        parser.error("the disk-full row mounts a tmpfs and the network rows make hosts: run as root, or leave "
                     "them out with --only")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().handlers[0].setLevel(logging.WARNING)  # the jobs' INFO lines: --verbose
    logging.getLogger("chorus").setLevel(logging.INFO)
    plan = [(f, g) for f in FAULTS if f.name in names for g in f.groups if g in groups]
    token = datetime.datetime.now().strftime("%H%M%S")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # clean up as on Ctrl-C
    corpus = make_corpus()
    rows = []
    for network, make in ((False, Bench), (True, network_faults.NetBench)):  # one cluster at a time
        part = [(f, g) for f, g in plan if f.network == network]
        if not part:
            continue
        bench = make(corpus)
        try:
            for fault, group in part:
                print(f"[{fault.name} / {group}] ...", flush=True)
                record = run_row(bench, fault, group, token, args.verbose)
                rows.append(record)
                print(f"[{fault.name} / {group}] {json.dumps(record)}", flush=True)
        finally:
            bench.shutdown()
    at, now = commit(), datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    for row in rows:
        row.update(commit=at, measured_at=now)
    if args.merge and args.out.is_file():  # the rows kept say when and at which commit they were measured
        done, earlier = {(r["fault"], r["group"]) for r in rows}, json.loads(args.out.read_text())
        rows = [{"commit": earlier["commit"], "measured_at": earlier["measured_at"], **r} for r in earlier["rows"]
                if (r["fault"], r["group"]) not in done] + rows
        order = {(f.name, g): i for i, (f, g) in enumerate((f, g) for f in FAULTS for g in f.groups)}
        rows.sort(key=lambda r: order.get((r["fault"], r["group"]), math.inf))
    passed = bool(rows) and all(row_passed(r) for r in rows)
    result = {"rows": rows, "passed": passed, "commit": at, "measured_at": now, "machine": machine()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    print(markdown(rows))
    print(f"passed: {passed} ({sum(map(row_passed, rows))} of {len(rows)} rows)")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
