"""The tiny `linear` workload that orchestration tests train: it implements the Workload
protocol, learns, shards exactly like the ASR workload and is reproducible."""

import pytest
import torch

from jobs.linear import LinearWorkload
from jobs.sections import LinearConfig
from orchestrator.workload import build_workload, workload_class

pytestmark = pytest.mark.unit


def test_it_is_registered_and_learns():
    assert workload_class("linear") is LinearWorkload
    w = build_workload("linear", {"data": {"samples": 256, "batch_size": 16}, "optim": {"lr": 0.5}}, seed=0)
    model, opt = w.build_model(), None
    opt = w.build_optimizer(model)
    before = w.evaluate(model, "dev")
    for epoch in range(5):
        for batch in w.batches(0, 1, epoch):
            opt.zero_grad()
            w.loss(model, batch).backward()
            w.optimizer_step(model, opt, 0, 0.0)
    after = w.evaluate(model, "dev")
    assert after["loss"] < 0.7 * before["loss"] and after["wer"] < before["wer"]
    assert after["utterances"] == 64 and w.evaluate(model, "test_unseen") is None  # not in eval_splits


def test_ranks_cover_every_sample_once_by_weight():
    w = LinearWorkload(LinearConfig(data={"samples": 300, "batch_size": 10}), seed=1)
    seen = []
    for rank in range(3):
        shard = w.batches(rank, 3, epoch=2, weights=[0.5, 0.3, 0.2])
        seen += [int(i) for b in shard.plan for i in b]
    assert sorted(seen) == list(range(300))


def test_same_seed_same_data_and_model_and_a_resumed_shard_goes_on_where_it_was():
    a, b = LinearWorkload(LinearConfig(), seed=4), LinearWorkload(LinearConfig(), seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.build_model().parameters(), b.build_model().parameters(),
                                                  strict=True))
    first = [batch.y.tolist() for batch in a.batches(0, 2, 0)]
    resumed = b.batches(0, 2, 0, start=3)
    assert [batch.y.tolist() for batch in resumed] == first[3:] and resumed.position == len(first)
