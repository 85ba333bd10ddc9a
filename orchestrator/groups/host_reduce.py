"""An allreduce step's sum, host by host: the members on one host all-reduce among themselves
over the host's loopback, one leader per host combines the hosts' sums across the network, and
each leader broadcasts the result to its host. The result is the same sum as one flat
all-reduce, but the bytes that cross between hosts are a leader's, not every member's: with a
flat ring of 4 learners on 2 hosts each host sends 1.5x the gradient bytes per step, with this
one host sum in each direction (2 hosts: a ring of two), and with `group.compression` a quarter
(`int8`) or half (`bf16`) of that (as Horovod's hierarchical all-reduce and NCCL's trees do
inside and across nodes).

Across hosts the leaders exchange their sums exactly (`none`: an all-reduce) or compressed: each
leader all-gathers its host's sum as a payload (`compression.py`) with error feedback (what it
rounded away is sent in its next step's), and every leader decodes and adds the payloads in the
same order, so every host gets the same bits and replicas stay identical. The tail slots of the
gradient buffer (votes, batches left, sizes, losses) are always summed exactly. An all-gather
sends (leaders - 1) payloads per leader, so compression pays while there are fewer than ~8 hosts
(int8; ~3 for bf16); beyond that an exact ring all-reduce sends fewer bytes.

Every member creates the same process groups in the same order (torch.distributed's `new_group`
is collective); one host, or a learner alone on its host, skips the parts it has no one for.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from orchestrator.base.flat import GRAD_TAIL as TAIL  # the gradient buffer's exact slots
from orchestrator.groups.compression import Residual, codec_for
from orchestrator.groups.errors import GroupBroken


class HostReduce:
    """The gradient sum taken host by host: inside each host, then between hosts.

    Args:
    rank: this member's rank in the job's process group.
    hosts: every host's ranks, the leader (the lowest) first; the same list on every member.
    compression: how leaders send their hosts' sums (`none`, `bf16`, `int8`).
    collective: runs a torch.distributed call, raising GroupBroken when a member is gone.
    timeout_s: bounds each collective of the groups made here.
    verify: called as `verify(group, ranks, name)` on each group made here that this member is in,
        once made (`guard.verify_members`: its members prove the job's secret to each other).
    """

    def __init__(self, rank: int, hosts: list[list[int]], compression: str, collective, timeout_s: float,
                 verify=None):
        self.rank, self.collective, self.codec = rank, collective, codec_for(compression)
        verify = verify or (lambda group, ranks, name: None)
        timeout = timedelta(seconds=timeout_s)
        self.host, self.host_group, self.leaders_group = [rank], None, None
        for k, ranks in enumerate(hosts):  # every member makes every group, in the same order
            group = dist.new_group(sorted(ranks), timeout=timeout) if len(ranks) > 1 else None
            if rank in ranks:
                self.host, self.host_group = sorted(ranks), group
                if group is not None:
                    verify(group, self.host, f"host-{k}")
        self.leaders = [min(ranks) for ranks in hosts]
        if len(self.leaders) > 1:
            self.leaders_group = dist.new_group(sorted(self.leaders), timeout=timeout)
            if rank in self.leaders:
                verify(self.leaders_group, sorted(self.leaders), "leaders")
        self.leader = rank == self.host[0]
        self.residual: Residual | None = None
        self._total: torch.Tensor | None = None  # the leaders' decoded sum (kept: a fresh one costs its page faults)

    def sum(self, buffer: torch.Tensor) -> int:
        """Replace `buffer` (gradients, then TAIL exact slots) by its sum over every member;
        returns the bytes this member sent to other hosts (by the algorithm's count). Raises
        GroupBroken when a member is gone, having closed this member's groups."""
        sent = 0
        try:
            if self.host_group is not None:
                self.collective(dist.all_reduce, buffer, group=self.host_group)
            if self.leader and self.leaders_group is not None:
                sent += self._across(buffer)
            if self.host_group is not None:
                self.collective(dist.broadcast, buffer, src=self.host[0], group=self.host_group)
        except GroupBroken:
            self.close()
            raise
        return sent

    def close(self) -> None:
        """Let go of this member's groups, which closes their connections: a member blocked on
        this one in another group (a leader waiting across hosts for this host's leader, which
        lost a member of its host) fails at once instead of at the collective timeout.
        `destroy_process_group` shuts the groups down but leaves their connections open while
        anything still refers to them."""
        self.host_group = self.leaders_group = None

    def _across(self, buffer: torch.Tensor) -> int:
        """The leaders' sum of their hosts' sums."""
        count, nbytes = len(self.leaders), buffer.numel() * buffer.element_size()
        if not self.codec.lossy:
            self.collective(dist.all_reduce, buffer, group=self.leaders_group)
            return ring_bytes(nbytes, count)
        grads, tail = buffer[:-TAIL], buffer[-TAIL:]
        self.collective(dist.all_reduce, tail, group=self.leaders_group)
        if self.residual is None or self.residual.error is None or self.residual.error.numel() != grads.numel():
            self.residual = Residual(self.codec, grads.numel())
        payload = self.residual.encode(grads).to(buffer.device)
        gathered = [torch.empty_like(payload) for _ in range(count)]
        self.collective(dist.all_gather, gathered, payload, group=self.leaders_group)
        if self._total is None or self._total.numel() != grads.numel():
            self._total = torch.empty(grads.numel())
        total = self._total.zero_()
        for part in gathered:  # the same order on every leader: the same bits
            self.codec.decode_add(part.cpu(), grads.numel(), total)
        grads.copy_(total.to(buffer.device))
        return payload.numel() * (count - 1) + ring_bytes(TAIL * 4, count)


def ring_bytes(nbytes: int, members: int) -> int:
    """Bytes each member of a ring all-reduce of `nbytes` sends: 2 (n - 1) / n of them."""
    return 0 if members < 2 else 2 * (members - 1) * nbytes // members


def hosts_of(order_nodes: list[str]) -> list[list[int]]:
    """Ranks by host, from each rank's node (in rank order); hosts in order of their first rank.

    Example:
        >>> hosts_of(["a", "b", "a", "b"])
        [[0, 2], [1, 3]]
    """
    hosts: dict[str, list[int]] = {}
    for rank, node in enumerate(order_nodes):
        hosts.setdefault(node, []).append(rank)
    return list(hosts.values())
