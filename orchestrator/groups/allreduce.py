"""Synchronous SGD: every step, gradients are averaged over all learners with torch.distributed
(`nccl` on GPUs, `gloo` otherwise), weighted by each learner's batch size, so unequal per-learner
batches give exactly the gradient of their union.

One flat all-reduce per step, after backward, carries the size-weighted gradients, the members'
votes to end the chunk after this step (their time is up, or one must leave: all stop together,
`LearnerService.run`), the summed batches the shards have left, the summed batch sizes and the
summed losses. With `bucket_bytes`
the gradients instead go in buckets that start during backward (`overlap.py`, as DDP): measured
faster, but not the default, because a kill can then stall the group's re-forming until the
collective timeout (see `overlap.py`). A learner whose shard is used up contributes zeros. When
no shard has a batch left after a step, all learners start the next epoch together right after
it (without that, every epoch ended with a collective round that trained nothing: 1 in 17 rounds
with 16 batches a shard); a summed batch size of zero (a planned batch turned out unreadable)
ends the epoch too.

The group is re-formed, not restarted, when members come or go: every member joins a new process
group and rank 0's weights are broadcast to all, so a newcomer starts from the group's weights
and replicas that a failed step left one update apart agree again.

Members meet on a board of the job's service (`rendezvous.py`: no TCPStore, no rendezvous port);
the library's listeners admit only the members' addresses and every pair of members proves the
job's secret over its own connection before any weights flow (`guard.py`). A sum that is not
finite is refused by every member alike (they all hold the same bits): the step's update is
skipped on all of them, counted as a refusal, and its loss still reaches the driver (a
non-finite loss rolls the job back, `driver/rollback.py`).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from orchestrator.groups.balance import batch_shares
from orchestrator.groups.collectives import (
    apply_reduced_gradients,
    broadcast_counters,
    broadcast_weights,
    collective,
    device_settled,
    join_process_group,
    leave_process_group,
    reduce_gradients,
)
from orchestrator.groups.guard import STRANGERS, ListenerGuard, verify_members
from orchestrator.groups.host_reduce import HostReduce, hosts_of, ring_bytes
from orchestrator.groups.kind import GroupKind
from orchestrator.groups.overlap import GradientBuckets
from orchestrator.groups.rendezvous import Meeting
from orchestrator.groups.strategies import GroupStrategy, Rebalance, Rendezvous


class AllreduceMember:
    """One learner's part of a synchronous allreduce group.

    Args:
    rank, world_size: this learner's place in the process group.
    meeting: where the members meet (`rendezvous.Meeting`).
    backend: `gloo` or `nccl`.
    bucket_bytes: gradient bytes per all-reduce bucket started during backward (`overlap.py`);
        None (the default): one all-reduce after backward.
    interface: the network interface the group uses (`group.interface`); None: the one that
        holds the learner's node address (`network.bind_to`).
    hosts: every host's ranks (`host_reduce.hosts_of`): the sum is taken host by host
        (`host_reduce.py`); None: one flat all-reduce.
    compression: how the sum crosses between hosts (`group.compression`: `none`, `bf16`, `int8`).
    """

    lockstep = True
    stops_alone = False

    def __init__(self, rank: int, world_size: int, meeting: Meeting, backend: str = "gloo", timeout_s: float = 120,
                 bucket_bytes: int | None = None, interface: str | None = None,
                 hosts: list[list[int]] | None = None, compression: str = "none"):
        self.rank, self.world_size, self.meeting, self.backend = rank, world_size, meeting, backend
        self.timeout_s, self.bucket_bytes, self.interface = timeout_s, bucket_bytes, interface
        self.hosts, self.compression = hosts, compression
        self.buckets: GradientBuckets | None = None  # made in the learner's process
        self.by_host: HostReduce | None = None  # likewise
        self.guard: ListenerGuard | None = None  # likewise, until the first step has made every communicator

    def setup(self, learner) -> None:
        guard = join_process_group(self.backend, self.meeting, self.rank, self.world_size, self.timeout_s, learner,
                                   interface=self.interface)
        if self.bucket_bytes:
            self.buckets = GradientBuckets(learner.params, learner.flat_grads(), self.bucket_bytes, collective)
        elif self.compression != "none" or (self.hosts and 1 < len(self.hosts) < self.world_size):
            self.by_host = HostReduce(self.rank, self.hosts or [[r] for r in range(self.world_size)],
                                      self.compression, collective, self.timeout_s,
                                      verify=lambda group, ranks, name: verify_members(
                                          learner.secret, f"{self.meeting.name}/{name}", ranks.index(self.rank),
                                          len(ranks), group, learner.device))
        guard.apply()  # listeners of the groups made just now (NCCL's are made at their first collective)
        broadcast_weights(learner, self.rank)
        broadcast_counters(learner, self.rank)
        guard.apply()
        STRANGERS.watch(port for _, port in guard.filtered)
        self.guard = guard if self.by_host is not None else None  # its groups' first collectives come with a step

    def step(self, learner) -> None:
        size = reduce_gradients(learner, learner.next_batch(), self.buckets)
        self._guard_late_listeners()
        buffer = learner.grad_buffer
        if self.buckets is None:
            device_settled(learner, compute_only=True)
            start = time.perf_counter()
            with learner.waiting_on_group():
                if self.by_host is not None:
                    learner.count_sent(self.by_host.sum(buffer))
                else:
                    collective(dist.all_reduce, buffer)
                    learner.count_sent(ring_bytes(buffer.numel() * buffer.element_size(), self.world_size))
                device_settled(learner)
            learner.comm_s += time.perf_counter() - start
        else:
            learner.count_sent(ring_bytes(buffer.numel() * buffer.element_size(), self.world_size))
        apply_reduced_gradients(learner, buffer, size)

    def _guard_late_listeners(self) -> None:
        """After the first step: the listeners of communicators its first collectives made (NCCL's
        of the host-by-host groups) get the members-only filter too."""
        if self.guard is not None:
            self.guard.apply()
            STRANGERS.watch(port for _, port in self.guard.filtered)
            self.guard = None

    def close(self) -> None:
        if self.buckets is not None:
            self.buckets.close()
        if self.by_host is not None:
            self.by_host.close()
        leave_process_group()


class AllreduceStrategy(GroupStrategy):
    """Synchronous SGD: rounds; with `group.balance`, shards and batches by measured speed."""

    name = "allreduce"
    replicas_equal = True

    def members(self, roster, rendezvous: Rendezvous) -> list:
        handles = [roster.live[i].handle for i in roster.order]
        backend, meeting = rendezvous.backend(handles), rendezvous.meeting(handles)
        hosts = hosts_of([roster.live[i].node or "" for i in roster.order]) if self.spec.group.topology_aware \
            else None
        return [AllreduceMember(i, len(handles), meeting, backend, interface=self.interface, hosts=hosts,
                                compression=self.compression) for i in range(len(handles))]

    def shard_weights(self, roster) -> list[float] | None:
        """By measured speed, once every member has one (`balance.batch_shares`)."""
        if not (self.balance and len(roster.order) > 1):
            return None
        speeds = [roster.live[i].speed for i in roster.order]
        if any(s is None for s in speeds):
            return None
        planned_ids, planned = self.planned
        if planned is None or planned_ids != roster.order:  # planned afresh: by speed alone
            return batch_shares(speeds)
        return batch_shares(speeds, planned, [roster.live[i].step_compute_s or 0.0 for i in roster.order])

    def rebalance(self, roster) -> Rebalance | None:
        return self.replan_if_moved(self.shard_weights(roster))

    def rebalanced(self, roster) -> tuple[str, dict]:
        live, order, weights = roster.live, roster.order, self.planned[1]
        out = [i for i, w in zip(order, weights, strict=True) if w == 0]
        message = "shard and batch shares by measured speed: " + ", ".join(
            f"learner {i} {w:.2f}" for i, w in zip(order, weights, strict=True)) + "".join(
            f"; learner {i} sits out (its {live[i].step_compute_s:.2f} s per step at a small share "
            "outlast the others' steps; it keeps its replica in step)" for i in out)
        return message, {"weights": {str(i): w for i, w in zip(order, weights, strict=True)},
                         "speeds": {str(i): round(live[i].speed, 2) for i in order},
                         "step_compute_s": {str(i): round(live[i].step_compute_s or 0.0, 4) for i in order}}

    def shares(self, roster) -> dict[int, float]:
        ids, planned = self.planned
        if not roster.order:
            return {}
        if planned and ids == roster.order:
            return dict(zip(ids, planned, strict=True))
        return {i: 1 / len(roster.order) for i in roster.order}


KIND = GroupKind("allreduce", AllreduceStrategy)
