"""Synchronous SGD: every step, gradients are averaged over all learners with torch.distributed
(`nccl` on GPUs, `gloo` otherwise), weighted by each learner's batch size, so unequal per-learner
batches give exactly the gradient of their union.

One flat all-reduce per step carries the size-weighted gradients, the summed batch sizes and the
summed losses. A learner whose shard is used up contributes zeros; when the summed batch size is
zero every shard is used up and all learners start the next epoch together.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist


class AllreduceMember:
    """Args:
    rank, world_size: this learner's place in the process group.
    address: `host:port` of rank 0's rendezvous.
    backend: `gloo` or `nccl`.
    """

    lockstep = True

    def __init__(self, rank: int, world_size: int, address: str, backend: str = "gloo", timeout_s: float = 300):
        self.rank, self.world_size, self.address, self.backend = rank, world_size, address, backend
        self.timeout_s = timeout_s

    def setup(self, learner) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(self.backend, init_method=f"tcp://{self.address}", rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=self.timeout_s))

    def step(self, learner) -> None:
        buf, size = weighted_gradients(learner, learner.next_batch())
        start = time.perf_counter()
        dist.all_reduce(buf)
        learner.comm_s += time.perf_counter() - start
        apply_reduced_gradients(learner, buf, size)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def weighted_gradients(learner, batch) -> tuple[torch.Tensor, int]:
    """This learner's share of a size-weighted gradient sum, built in place in its gradient buffer
    (gradients x batch size, then the batch size, then loss x batch size; zeros without a batch),
    and its batch size."""
    buf = learner.grad_buffer
    if batch is None:
        buf.zero_()
        return buf, 0
    loss = learner.forward_backward(batch)
    buf[:-2].mul_(batch.size)
    buf[-2], buf[-1] = float(batch.size), loss * batch.size
    return buf, batch.size


def apply_reduced_gradients(learner, buf: torch.Tensor, size: int) -> None:
    """After the all-reduce: the mean gradient of the union of everyone's batches, applied; or, when
    every shard is used up (summed batch size 0), the start of the next epoch."""
    total = float(buf[-2])
    if total == 0:
        learner.start_next_epoch()
        return
    buf[:-2].div_(total)
    learner.apply_step(float(buf[-1]) / total, size)
