"""A batch too large for the learner's device memory: on CUDA out-of-memory the learner trains
it in halves, one after the other (and halves of those, down to single samples), instead of
dying; each part's gradient is weighted by its share of the batch, so the step's gradient is the
whole batch's (for a loss that is a mean over samples). A batch whose single samples do not fit
is skipped: no gradient, counted and logged. Both happen per batch: the next one is tried whole.

The workload's batch says how it splits (`halves()`, `orchestrator.workload.Batch`); one that
cannot split is skipped at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger("chorus.learner")


class MemoryFit:
    """Counts, for one learner, the batches it split (`splits`) and skipped (`skipped`)."""

    def __init__(self, learner_id: int):
        self.learner_id, self.splits, self.skipped = learner_id, 0, 0

    def backward(self, batch, backward: Callable[[object, float], float], zero_grad: Callable[[], None]) -> float:
        """`backward(part, weight)` over `batch`, or its parts when it does not fit; returns the
        batch's loss (the parts' weighted sum), 0.0 for a skipped batch (whose gradient is zero)."""
        parts = [batch]
        while True:
            try:
                return sum(backward(part, part.size / batch.size) * part.size / batch.size for part in parts)
            except torch.OutOfMemoryError:
                zero_grad()  # what the failed pass accumulated is thrown away: the parts start over
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                finer = [half for part in parts for half in (_halves(part) or (part,))]
                if len(finer) == len(parts):
                    self.skipped += 1
                    log.warning("learner %d: CUDA out of memory on a batch of %d even one sample at a time: "
                                "skipped (%d so far)", self.learner_id, batch.size, self.skipped)
                    return 0.0
                self.splits += len(parts) == 1  # batches split, each once
                log.warning("learner %d: CUDA out of memory on a batch of %d: trying it in %d parts (%d batches "
                            "split so far)", self.learner_id, batch.size, len(finer), self.splits)
                parts = finer


def _halves(batch) -> tuple | None:
    halves = getattr(batch, "halves", None)
    return halves() if halves is not None else None
