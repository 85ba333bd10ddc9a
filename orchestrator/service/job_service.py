"""JobService: the job's one helper process beside its driver, on the driver's node. It hosts the
shard planner (asked by the learners at every epoch, `shards.py`), the evaluator (asked by
the driver, `evaluator.py`) and the boards its learners' process groups meet on
(`groups/rendezvous.py`) on separate threads, so a dev evaluation never delays a learner's
next shard nor a group's formation. One process per job rather than two: a Ray worker's start-up (importing torch) is
the costliest thing a small job does.

The evaluator is built on first use (from the arguments of that call), so a job that never
evaluates never builds its model here.
"""

from __future__ import annotations

import ray

from orchestrator.base import pieces
from orchestrator.groups.rendezvous import BoardHost
from orchestrator.service.evaluator import Evaluator
from orchestrator.service.shards import ShardPlanner


class JobService(ShardPlanner, BoardHost):
    """The `ShardPlanner` (its methods as they are) plus `evaluate` and `score` on the `eval` thread
    and the rendezvous boards (`BoardHost`) on the `rendezvous` threads; the evaluator's model is
    on a GPU only with `use_gpu` (the spec's `service_gpus`); `secret` is the job's `JobSecret`."""

    def __init__(self, members: list[int] = (), use_gpu: bool = False, secret=None):
        ShardPlanner.__init__(self, members)
        BoardHost.__init__(self, secret)
        self._evaluator: Evaluator | None = None
        self.use_gpu = use_gpu

    def _evaluator_for(self, workload: tuple) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = Evaluator(*workload, use_gpu=self.use_gpu)
        return self._evaluator

    @ray.method(concurrency_group="eval")
    def evaluate(self, workload: tuple, total, count: int, splits: list[str], store_root: str | None = None,
                 model_name: str | None = None) -> dict:
        """`Evaluator.evaluate` of the learners' `total` (sent in pieces: `base/pieces.py`); `workload` is (name,
        config, seed)."""
        return self._evaluator_for(workload).evaluate(pieces.take(total), count, splits, store_root, model_name)

    @ray.method(concurrency_group="eval")
    def score(self, workload: tuple, splits: list[str]) -> dict:
        """`Evaluator.score` of the model evaluated last."""
        return self._evaluator_for(workload).score(splits)


JobServiceActor = ray.remote(concurrency_groups={"eval": 1, **BoardHost.CONCURRENCY})(JobService)
