"""A tiny workload: a linear classifier on random tensors (registered as `linear`).

It implements the same `orchestrator.workload.Workload` protocol as the ASR workload, with no
audio and millisecond steps, so the tests about orchestration (placement, elasticity, groups,
checkpoints, rollbacks) run through the real orchestrator in seconds, and a user can try a
cluster without a corpus (`workload: linear`). The data is a fixed random teacher's labels of
Gaussian inputs, so a model that learns shows a falling error; sharding uses the ASR workload's
`shard_batches` (every sample has length 1), so shards and weighted shares behave the same.

Example:
    >>> w = LinearWorkload(LinearConfig(), seed=0)
    >>> model = w.build_model(); opt = w.build_optimizer(model)
    >>> for batch in w.batches(rank=0, world_size=1, epoch=0):
    ...     opt.zero_grad(); w.loss(model, batch).backward(); opt.step()
    >>> w.evaluate(model, "dev")["wer"]  # percent misclassified
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from jobs.data.manifests import DataError, shard_batches
from jobs.sections import LinearConfig
from jobs.workload import load_model_state, model_state


@dataclass
class LinearBatch:
    x: torch.Tensor
    y: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.y)


class LinearShard:
    """One shard's batches of one epoch, from planned batch `start` on."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, plan: list[list[int]], start: int = 0):
        self.x, self.y, self.plan, self.position = x, y, plan, start

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator[LinearBatch]:
        while self.position < len(self.plan):
            index = torch.tensor(self.plan[self.position])
            self.position += 1
            yield LinearBatch(self.x[index], self.y[index])


class LinearWorkload:
    """Softmax regression on a random teacher's labels."""

    Config = LinearConfig
    input_error = DataError

    def __init__(self, config: LinearConfig, seed: int = 0):
        self.config, self.seed = config, seed
        d = config.data
        teacher = torch.randn(d.features, d.classes, generator=torch.Generator().manual_seed(10_000 + seed))
        self._splits = {}
        for k, name in enumerate(("train", "dev", "test", "test_unseen", "test_unseen_engine")):
            n = d.samples if name == "train" else max(1, d.samples // 4)
            x = torch.randn(n, d.features, generator=torch.Generator().manual_seed(seed * 10 + k))
            self._splits[name] = (x, (x @ teacher).argmax(1))

    @property
    def max_rollbacks(self) -> int:
        return self.config.optim.max_rollbacks

    def check_data(self) -> None:
        pass

    def build_model(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        width = self.config.data.features
        hidden = [m for _ in range(self.config.model.hidden_layers) for m in (torch.nn.Linear(width, width),
                                                                               torch.nn.ReLU())]
        if not hidden:
            return torch.nn.Linear(width, self.config.data.classes)
        return torch.nn.Sequential(*hidden, torch.nn.Linear(width, self.config.data.classes))

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=self.config.optim.lr)

    def batches(self, rank: int, world_size: int, epoch: int, start: int = 0,
                weights: list[float] | None = None) -> LinearShard:
        x, y = self._splits["train"]
        plan = shard_batches([1.0] * len(y), float(self.config.data.batch_size), epoch, self.seed, rank, world_size,
                             weights)
        return LinearShard(x, y, plan, start)

    def loss(self, model: torch.nn.Module, batch: LinearBatch) -> torch.Tensor:
        started = time.perf_counter()
        device = next(model.parameters()).device
        loss = torch.nn.functional.cross_entropy(model(batch.x.to(device)), batch.y.to(device))
        time.sleep(max(0.0, self.config.data.compute_seconds - (time.perf_counter() - started)))
        return loss

    def optimizer_step(self, model, optimizer, step: int, progress: float, lr_scale: float = 1.0) -> float:
        for group in optimizer.param_groups:
            group["lr"] = self.config.optim.lr * lr_scale
        optimizer.step()
        return 0.0

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, split: str) -> dict | None:
        """Percent misclassified (as `wer`), mean loss and sample count on a split."""
        if split not in self.config.data.eval_splits:
            return None
        started = time.perf_counter()
        x, y = self._splits[split]
        device = next(model.parameters()).device
        logits = model(x.to(device))
        wrong = (logits.argmax(1).cpu() != y).float().mean().item()
        loss = torch.nn.functional.cross_entropy(logits, y.to(device)).item()
        time.sleep(max(0.0, self.config.data.eval_seconds - (time.perf_counter() - started)))
        return {"wer": 100.0 * wrong, "loss": loss, "utterances": len(y), "skipped": 0}

    state_dict = staticmethod(model_state)
    load_state_dict = staticmethod(load_model_state)

    def new_skips(self) -> dict[str, str]:
        return {}

    def add_skips(self, skips: dict[str, str]) -> None:
        pass

    def skip_counts(self) -> dict[str, int]:
        return {}
