"""The allreduce's gradient buckets (`groups/overlap.py`), on a real one-process gloo group: they
start during backward, in one fixed order, and sum the size-weighted gradients exactly."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from orchestrator.base.flat import GRAD_TAIL, flat_grad_buffer
from orchestrator.groups.overlap import GradientBuckets


class _Logged:
    """The group's collective: every all-reduce runs on a real gloo group of one process and is
    logged (which slice of the buffer, and whether backward had finished when it started)."""

    def __init__(self, grads):
        store = dist.HashStore()
        self.pg = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=30))
        self.grads, self.started, self.backward_done = grads, [], False

    def __call__(self, op, *args, **kwargs):
        if op is dist.all_reduce:
            tensor = args[0]
            offset = (tensor.data_ptr() - self.grads.data_ptr()) // tensor.element_size()
            self.started.append((offset, tensor.numel(), self.backward_done))
            return self.pg.allreduce([tensor])
        return op(*args, **kwargs)


@pytest.mark.unit
def test_buckets_start_during_backward_last_layer_first_and_sum_exactly():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    params = list(model.parameters())
    buffer = flat_grad_buffer(params, torch.device("cpu"))
    grads = buffer[:-GRAD_TAIL]
    logged = _Logged(grads)
    layer_bytes = (64 * 64 + 64) * 4
    buckets = GradientBuckets(params, grads, layer_bytes, logged)  # one layer a bucket
    assert len(buckets.buckets) == 4

    x = torch.randn(8, 64)
    expected = torch.autograd.grad(model(x).square().mean(), params)
    buckets.begin(scale=8)
    model(x).square().mean().backward()
    logged.backward_done = True
    buckets.finish(buffer[-GRAD_TAIL:])

    offsets = [offset for offset, _, _ in logged.started[:4]]
    assert offsets == sorted(offsets, reverse=True)  # the last layer's bucket first
    assert sum(numel for _, numel, _ in logged.started[:4]) == grads.numel()  # every gradient once
    assert [done for _, _, done in logged.started[:4]] == [False] * 4  # all four inside backward
    assert logged.started[4][1] == GRAD_TAIL and logged.started[4][2]  # the tail after it
    assert torch.equal(grads, torch.cat([g.reshape(-1) for g in expected]) * 8)  # scaled by the batch size


@pytest.mark.unit
def test_buckets_of_parameters_without_gradients_start_after_backward_in_order():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    params = list(model.parameters())
    buffer = flat_grad_buffer(params, torch.device("cpu"))
    logged = _Logged(buffer[:-GRAD_TAIL])
    buckets = GradientBuckets(params, buffer[:-GRAD_TAIL], (8 * 8 + 8) * 4, logged)
    buckets.begin(scale=0)  # a member without a batch: no backward, zeros all-reduced all the same
    buffer.zero_()
    logged.backward_done = True
    buckets.finish(buffer[-GRAD_TAIL:])
    assert [offset for offset, _, _ in logged.started] == [8 * 8 + 8, 0, 2 * (8 * 8 + 8)]
    model(torch.randn(2, 8)).sum().backward()  # outside begin() .. finish(): the hooks start nothing
    assert len(logged.started) == 3
    buckets.close()
