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
        batch = learner.next_batch()
        if batch is not None:
            loss = learner.forward_backward(batch)
            size = batch.size
            grads = learner.flat_grads() * size
        else:
            loss, size = 0.0, 0
            grads = torch.zeros(sum(p.numel() for p in learner.params))
        buf = torch.cat([grads, torch.tensor([float(size), loss * size])])
        start = time.perf_counter()
        dist.all_reduce(buf)
        learner.comm_s += time.perf_counter() - start
        total = float(buf[-2])
        if total == 0:
            learner.start_next_epoch()
            return
        learner.load_flat_grads(buf[:-2] / total)
        learner.apply_step(float(buf[-1]) / total, size)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
