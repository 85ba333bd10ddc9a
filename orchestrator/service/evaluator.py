"""Evaluator: scores the group's averaged model. It runs in the job's service actor beside the
shard planner (`job_service.py`; in this process for a one-learner job), on a thread of its own,
so the learners train on while it works and the driver never holds a model.

It is handed the sum of the learners' models (a flat tensor the learners added up among
themselves, `consensus.py`) and how many were summed; it loads the mean, writes it as the
checkpoint's averaged model (`model-<step>.pt`, what `chorus eval` reads) into the run's
`StateStore` with what the workload saves beside it (the ASR workload: its tokenizer), and
scores splits of the spec through the workload (`dev` while training; `test`, `test_unseen`,
`test_unseen_engine` at the end).
"""

from __future__ import annotations

import torch

from orchestrator.base.flat import load_vector
from orchestrator.checkpoint.state_store import StateStore
from orchestrator.workload import build_workload


class Evaluator:
    """Scores the group's averaged model and writes it as the checkpoint's model.

    Args: workload (registered name), workload_config (its sections of the spec), seed, use_gpu
    (evaluate on the GPU this process sees, if any; else on the CPU)."""

    def __init__(self, workload: str, workload_config: dict, seed: int, use_gpu: bool = False):
        self.workload = build_workload(workload, workload_config, seed)
        self.model = self.workload.build_model()
        if use_gpu and torch.cuda.is_available():
            self.model = self.model.cuda()
        self.model.eval()

    def evaluate(self, total: torch.Tensor, count: int, splits: list[str], store_root: str | None = None,
                 model_name: str | None = None) -> dict:
        """Load `total / count`; unless it is non-finite (`{"finite": False}`: nothing changes),
        write it as `model_name` into the store and score `splits`. Returns `finite`, `scores`
        (split -> the workload's result, or None without such a split) and `model` (the file
        written: name and bytes)."""
        mean = total / count
        if not bool(torch.isfinite(mean).all()):
            return {"finite": False}
        load_vector(self.model, mean)
        written = None
        if model_name is not None:
            state = self.workload.state_dict(self.model)  # the workload's parts too (a tokenizer)
            written = {"file": model_name, "bytes": StateStore(store_root).write(model_name, state)}
        return {"finite": True, "scores": self.score(splits), "model": written}

    def score(self, splits: list[str]) -> dict:
        """The loaded model's results on `splits` (None for a split the spec lacks)."""
        return {split: self.workload.evaluate(self.model, split) for split in splits}
