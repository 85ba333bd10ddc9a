"""Evaluator: the job's view of its learners' models. It averages their weights into one model
(the group's consensus, what `chorus eval` later reads), measures how far apart they are (the
consensus distance) and scores the average through the workload (`dev` while training; `test`,
`test_unseen` at the end), exporting each score as a metric.

It reads learner states handed to it; it never calls a learner and never writes a file.
"""

from __future__ import annotations

import torch

from orchestrator.workload import EVAL_SPLITS


class Evaluator:
    """Args:
    workload: the driver's copy of the job's workload (`orchestrator.workload`).
    metrics: the job's JobMetrics.
    """

    def __init__(self, workload, metrics):
        self.workload, self.metrics = workload, metrics
        self.model = workload.build_model()

    def average(self, states: list[dict]) -> float:
        """Load the average of the learners' models into the evaluation model (floating-point
        parameters and buffers averaged, integer buffers taken from the first); returns the
        consensus distance (mean L2 distance of each learner's trainable weights to their mean)."""
        models = [s["model"] for s in states]
        mean = {k: torch.stack([m[k] for m in models]).mean(0) if v.is_floating_point() else v
                for k, v in models[0].items()}
        self.model.load_state_dict(mean)
        trainable = [k for k, p in self.model.named_parameters() if p.requires_grad]
        flat = torch.stack([torch.cat([m[k].reshape(-1) for k in trainable]) for m in models])
        flat_mean = torch.cat([mean[k].reshape(-1) for k in trainable])
        return float((flat - flat_mean).norm(dim=1).mean())

    def score(self, split: str) -> dict | None:
        """The averaged model's error rate (`wer`), loss and sample count on a split of the
        spec, or None when it has no such split."""
        result = self.workload.evaluate(self.model, split)
        if result is not None and result["wer"] is not None:  # None: no sample of it could be read
            self.metrics.evaluation(split, result["wer"])
        return result

    def dev_record(self) -> dict:
        """`dev_wer` and `dev_loss` for an evaluation's record (none without a dev split)."""
        dev = self.score("dev")
        if dev is None:
            return {}
        return {"dev_wer": rounded(dev["wer"], 2), "dev_loss": rounded(dev["loss"], 4)}

    def finals(self) -> dict:
        """`wer_<split>` and `utterances_<split>` of the splits scored at the end."""
        out = {}
        for split in EVAL_SPLITS[1:]:
            result = self.score(split)
            out[f"wer_{split}"] = rounded(result["wer"], 2) if result else None
            out[f"utterances_{split}"] = result["utterances"] if result else 0
        return out

    def state_dict(self) -> dict:
        return self.model.state_dict()


def rounded(value: float | None, digits: int) -> float | None:
    """round(), passing None (a score over no samples) through."""
    return None if value is None else round(value, digits)
