"""Chorus's metrics: the one place where metric names live.

Everything is recorded by the job's driver through `ray.util.metrics` from what the learners
report after each chunk of steps, so one process owns the numbers and a learner killed at the end
of a job loses none of them. Ray exports them to Prometheus with a `ray_` prefix (counters also
get `_total`, histograms `_bucket`/`_sum`/`_count`), next to Ray's own `SessionName` tag; every
job series here also carries `chorus_job` (the job id; not `job`, which Prometheus's scrape sets
to its own job name), per-learner series carry `learner` (its index), and the sweep series
(recorded by the sweep's driver, `SweepMetrics`) carry `chorus_sweep` (the sweep's name).
`prometheus_names()` lists the series the Grafana dashboard (`dashboards/chorus.json`) may query.

Without a Ray connection (a one-learner job in-process) recording is a no-op.
"""

from __future__ import annotations

from functools import cache, partial

# name: (kind, description, tag keys)
METRICS = {
    "chorus_samples": ("counter", "Training utterances processed", ("chorus_job", "learner")),
    "chorus_steps": ("counter", "Optimizer steps taken", ("chorus_job", "learner")),
    "chorus_step_seconds": ("histogram", "Wall time of one training step, communication included",
                            ("chorus_job", "learner")),
    "chorus_comm_seconds": ("histogram", "Time of one step spent waiting on communication (a collective, "
                            "an exchange on a link, a broadcast)", ("chorus_job", "learner")),
    "chorus_samples_per_second": ("gauge", "Training utterances per second over the learner's last chunk",
                                  ("chorus_job", "learner")),
    "chorus_train_loss": ("gauge", "Mean training loss (CTC, per utterance) over the learner's last chunk",
                          ("chorus_job", "learner")),
    "chorus_epoch": ("gauge", "Epochs the learner has finished", ("chorus_job", "learner")),
    "chorus_wer": ("gauge", "Word error rate in percent of the average of all learners' weights",
                   ("chorus_job", "split")),
    "chorus_learners": ("gauge", "Learners in the job's group", ("chorus_job", "group")),
    "chorus_consensus_distance": ("gauge", "Mean L2 distance of each learner's weights to their average",
                                  ("chorus_job",)),
    "chorus_membership_events": ("counter", "Membership events: join, leave, failure, rebalance, waiting, "
                                 "rollback, regroup, refused",
                                 ("chorus_job", "kind")),
    "chorus_learner_speed": ("gauge", "A learner's measured speed: utterances per second of its own compute "
                             "(communication excluded), a rolling mean", ("chorus_job", "learner")),
    "chorus_sweep_trials": ("gauge", "A sweep's trials by Tune state (PENDING, RUNNING, PAUSED, TERMINATED, ERROR)",
                            ("chorus_sweep", "state")),
    "chorus_sweep_best": ("gauge", "The best value of the sweep's metric that any trial has reported so far",
                          ("chorus_sweep", "metric")),
}
SWEEP_STATES = ("PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR")
STEP_SECONDS_BOUNDARIES = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]


def prometheus_names(tag: str | None = None) -> set[str]:
    """The series names Prometheus sees for METRICS (only those tagged `tag`, e.g. "chorus_job" for a
    job's, when given)."""
    names = set()
    for name, (kind, _, tags) in METRICS.items():
        if tag is not None and tag not in tags:
            continue
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(kind, [""])
        names |= {f"ray_{name}{suffix}" for suffix in suffixes}
    return names


def _instruments() -> dict:
    """The instruments of the current Ray connection (made again after a reconnect: instruments
    of an earlier connection would report twice)."""
    import ray

    return _instruments_for(ray.get_runtime_context().get_job_id())


@cache
def _instruments_for(ray_job: str) -> dict:
    from ray.util.metrics import Counter, Gauge, Histogram

    made = {}
    for name, (kind, description, tags) in METRICS.items():
        make = {"counter": Counter, "gauge": Gauge,
                "histogram": partial(Histogram, boundaries=STEP_SECONDS_BOUNDARIES)}[kind]
        made[name] = make(name, description, tag_keys=tags)
    return made


def _ray_connected() -> bool:
    import ray

    return ray.is_initialized()


class JobMetrics:
    """Records one job's metrics. Args: job_id, group (the group's kind), enabled (default: when
    this process is connected to Ray)."""

    def __init__(self, job_id: str, group: str, enabled: bool | None = None):
        self.job_id, self.group = job_id, group
        self.enabled = _ray_connected() if enabled is None else enabled
        self._m = _instruments() if self.enabled else {}

    def learners(self, count: int) -> None:
        if self.enabled:
            self._m["chorus_learners"].set(count, tags={"chorus_job": self.job_id, "group": self.group})

    def learner_chunk(self, learner: int, stats: dict) -> None:
        """One learner's report after a chunk of steps (`Learner.take_stats`)."""
        if not self.enabled or not stats["step_seconds"]:
            return
        tags = {"chorus_job": self.job_id, "learner": str(learner)}
        m = self._m
        if stats["chunk_samples"] > 0:  # an allreduce member with a used-up shard steps without samples
            m["chorus_samples"].inc(stats["chunk_samples"], tags=tags)
        m["chorus_steps"].inc(len(stats["step_seconds"]), tags=tags)
        for seconds in stats["step_seconds"]:
            m["chorus_step_seconds"].observe(seconds, tags=tags)
        for seconds in stats["comm_seconds"]:
            m["chorus_comm_seconds"].observe(seconds, tags=tags)
        busy = sum(stats["step_seconds"])
        if busy > 0:
            m["chorus_samples_per_second"].set(stats["chunk_samples"] / busy, tags=tags)
        if stats["loss"] is not None:
            m["chorus_train_loss"].set(stats["loss"], tags=tags)
        m["chorus_epoch"].set(stats["epoch"], tags=tags)

    def evaluation(self, split: str, wer: float) -> None:
        if self.enabled:
            self._m["chorus_wer"].set(wer, tags={"chorus_job": self.job_id, "split": split})

    def event(self, kind: str) -> None:
        if self.enabled:
            self._m["chorus_membership_events"].inc(1, tags={"chorus_job": self.job_id, "kind": kind})

    def speed(self, learner: int, samples_per_s: float) -> None:
        if self.enabled:
            tags = {"chorus_job": self.job_id, "learner": str(learner)}
            self._m["chorus_learner_speed"].set(samples_per_s, tags=tags)

    def consensus(self, distance: float) -> None:
        if self.enabled:
            self._m["chorus_consensus_distance"].set(distance, tags={"chorus_job": self.job_id})


class SweepMetrics:
    """Records one sweep's trial counts by state and its best metric so far (in the sweep's driver).
    Args: sweep (its name), metric (the metric's name), enabled (default: when connected to Ray)."""

    def __init__(self, sweep: str, metric: str, enabled: bool | None = None):
        self.sweep, self.metric = sweep, metric
        self.enabled = _ray_connected() if enabled is None else enabled
        self._m = _instruments() if self.enabled else {}

    def trials(self, by_state: dict[str, int]) -> None:
        """Every state is set, 0 included, so a state a trial has left reads 0 rather than its last count."""
        if self.enabled:
            for state in SWEEP_STATES:
                self._m["chorus_sweep_trials"].set(by_state.get(state, 0), tags={"chorus_sweep": self.sweep,
                                                                                  "state": state})

    def best(self, value: float) -> None:
        if self.enabled:
            self._m["chorus_sweep_best"].set(value, tags={"chorus_sweep": self.sweep, "metric": self.metric})
