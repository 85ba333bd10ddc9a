"""A sweep's progress as metrics: a Ray Tune callback in the sweep's driver that keeps the gauges of
`orchestrator.driver.metrics.SweepMetrics` current (trials by state, the best metric so far), for the
Grafana dashboard's sweep panels."""

from __future__ import annotations

import math
import time
from collections import Counter

from ray.tune import Callback

from orchestrator.driver.metrics import SweepMetrics


class SweepGauges(Callback):
    """The sweep's gauges in Prometheus: trials by state and the best result so far.

    Args: sweep (its name), metric, mode ("min" or "max"), every_s (the least time between updates)."""

    def __init__(self, sweep: str, metric: str, mode: str, every_s: float = 1.0):
        self.sweep, self.metric, self.mode, self.every_s = sweep, metric, mode, every_s
        self._metrics: SweepMetrics | None = None
        self._last = 0.0

    def __getstate__(self):  # Tune saves its callbacks with the experiment; the instruments stay out
        return {**self.__dict__, "_metrics": None, "_last": 0.0}

    def update(self, trials) -> None:
        self._metrics = self._metrics or SweepMetrics(self.sweep, self.metric)
        self._metrics.trials(Counter(t.status for t in trials))
        pick = min if self.mode == "min" else max
        # Tune's per-trial metric analysis keeps each trial's best: a resumed sweep's earlier trials count too
        values = [t.metric_analysis.get(self.metric, {}).get(self.mode) for t in trials]
        values = [v for v in values if isinstance(v, int | float) and not math.isnan(v)]
        if values:
            self._metrics.best(pick(values))
        self._last = time.monotonic()

    def on_step_end(self, iteration, trials, **info):
        if time.monotonic() - self._last >= self.every_s:
            self.update(trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.update(trials)

    def on_experiment_end(self, trials, **info):
        self.update(trials)
