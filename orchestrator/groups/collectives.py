"""The process-group toolkit the kinds built on torch.distributed share: joining a group at a
meeting of the job's service (`rendezvous.py`, paced, its listeners guarded: `guard.py`) and
leaving it, collectives that turn a dead member into `GroupBroken`, the broadcast of rank 0's
weights and counters, and one step's size-weighted gradient all-reduce (flat, or in buckets during
backward: `overlap.py`; summed host by host where hosts are known: `host_reduce.py`) with the
checks of what it received (`checks.py`)."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from orchestrator.base.flat import GRAD_TAIL
from orchestrator.groups.checks import GRAD_RATIO, finite, received_weights
from orchestrator.groups.errors import GroupBroken
from orchestrator.groups.guard import STRANGERS, GroupRefused, ListenerGuard, verify_members
from orchestrator.groups.network import bind_to
from orchestrator.groups.overlap import GradientBuckets
from orchestrator.groups.rendezvous import Meeting, RendezvousStore

REFUSED_SUM = "a group's gradient sum that is not finite or far out of scale"
REFUSED_BROADCAST = "a group's broadcast weights that are not finite or far out of scale"

RENDEZVOUS_TIMEOUT_S = 15.0  # joining waits this long for the other ranks (the driver calls it off sooner
# when a member dies meanwhile)
CONNECT_PACING_S = 0.01  # rank r joins r x this late: when ~20 or more ranks connect at once, some
# connections stalled for 5 s (or 10 s) inside TCPStore's connect (28-29 Ray actors joining one gloo
# group on this machine, all at once: 0.40-10.2 s per join; paced by 10 ms: 0.40-0.63 s). The
# rendezvous is no TCPStore any more, but gloo's members still connect to each other all at once


def join_process_group(backend: str, meeting: Meeting, rank: int, world_size: int, timeout_s: float, learner,
                       place: int | None = None, interface: str | None = None) -> ListenerGuard:
    """Leave any process group this process is in and join a new one at `meeting` (blocks until all
    ranks have met, connected and proven the job's secret to each other, at most
    RENDEZVOUS_TIMEOUT_S each; `timeout_s` bounds each collective after that). The group's
    connections go over `interface`, or the one holding the learner's node address
    (`network.bind_to`), and its listeners admit only the members' addresses (`guard.py`).
    `place`: this member's place among everyone who joins a group at this moment (default: its
    rank), which paces its connection (CONNECT_PACING_S). Returns the guard, for the listeners the
    member's later setup opens."""
    leave_process_group()
    if learner.node_address is not None or interface is not None:  # (a member elsewhere must reach this one)
        bind_to(learner.node_address, interface, peer=next((n for n in meeting.nodes if n != learner.node_address),
                                                           None))
    time.sleep((rank if place is None else place) * CONNECT_PACING_S)
    guard = ListenerGuard(meeting.peers)
    store = RendezvousStore(meeting, learner.secret, RENDEZVOUS_TIMEOUT_S, before_publish=guard.apply)
    _holding["store"] = store  # the group's C++ side calls back into this Python object while it lives
    # connecting to every peer is bounded by the rendezvous's timeout (a peer that advertised an
    # address nobody can reach fails the join in seconds, not after the collectives' timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    guard.apply()
    try:
        verify_members(learner.secret, meeting.name, rank, world_size, device=learner.device)
    except GroupBroken as exc:
        if isinstance(exc, GroupRefused):  # (not a member that died meanwhile)
            learner.refusals.refuse("a forming group", "a group member that did not prove the job's secret")
        leave_process_group()
        raise
    dist.distributed_c10d.set_timeout(timedelta(seconds=timeout_s))
    return guard


_holding: dict[str, RendezvousStore] = {}  # the process group's store: a Python store whose Python object
# is collected leaves c10d calling into nothing ("fn INTERNAL ASSERT FAILED ... Not implemented."), so the
# process keeps it for as long as its group lives (`new_group` and NCCL's first collective use it later)
_retired: list[RendezvousStore] = []  # ... and those of groups whose shutdown failed (their threads may live on)


def leave_process_group() -> None:
    """Leave this process's group, if any, so that its next group is made as a newcomer's is."""
    store = _holding.pop("store", None)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError:  # a broken group (a member died) may fail to shut down cleanly
            if store is not None:
                _retired.append(store)
    STRANGERS.watch(())
    # c10d names a process's groups, and so their keys at the rendezvous, by a count of the groups it
    # made, which only a complete destroy resets: a join that failed inside `init_process_group` (its
    # rendezvous called off) or a destroy that failed midway leave it counting, and the next group's
    # members would then wait for each other's keys under different names. Every member starts at 0.
    dist.distributed_c10d._world.group_count = 0


def collective(op, *args, **kwargs):
    """Run a torch.distributed collective; a member that is gone raises GroupBroken.

    The failed process group is shut down before raising: that closes this member's connections,
    so members blocked waiting on this one (not on the dead one) fail too instead of hanging
    until the timeout."""
    try:
        return op(*args, **kwargs)
    except RuntimeError as exc:  # gloo and nccl report a lost peer as DistError, a RuntimeError
        leave_process_group()
        raise GroupBroken(f"{op.__name__} failed: {exc}") from exc


def broadcast_weights(learner, rank: int) -> None:
    """Everyone takes rank 0's weights (weights that are not finite are refused: a member keeps
    its own, and a non-finite loss of rank 0 rolls the job back)."""
    weights = learner.flat_weights(on_device=True)
    own = learner.flat_weights(on_device=True) if rank != 0 else None
    collective(dist.broadcast, weights, src=0)
    if rank == 0:
        return
    if received_weights(weights, own):
        learner.load_flat_weights(weights)
    else:
        learner.refusals.refuse("the group's rank 0", REFUSED_BROADCAST)


def broadcast_counters(learner, rank: int) -> None:
    """Everyone takes rank 0's step and epoch, so the members count epochs alike and stop at the
    same one (a newcomer may have adopted the state of a learner outside this group)."""
    counters = torch.tensor([learner.step, learner.epoch], dtype=torch.int64, device=learner.device)
    collective(dist.broadcast, counters, src=0)
    if rank != 0:
        learner.set_counters(step=int(counters[0]), epoch=int(counters[1]))


def reduce_gradients(learner, batch, buckets: GradientBuckets | None) -> int:
    """The group's size-weighted sum of everyone's gradients, batches left, batch sizes and losses,
    built in place in this learner's gradient buffer: its buckets are all-reduced during backward
    (no buckets: only this learner's share, for the caller to sum). A learner without a batch adds
    zeros. Returns this learner's batch size; raises GroupBroken when a member is gone."""
    buf, size = learner.grad_buffer, batch.size if batch is not None else 0
    if buckets is not None:
        buckets.begin(size)
    try:
        if batch is None:
            buf.zero_()
            loss = 0.0
        else:
            loss = learner.forward_backward(batch)  # its gradient hooks start the buckets
            if buckets is None:
                buf[:-GRAD_TAIL].mul_(size)
        buf[-4], buf[-3] = float(learner.wants_to_stop()), float(learner.batches_left())
        buf[-2], buf[-1] = float(size), loss * size
        if buckets is not None:
            device_settled(learner, compute_only=True)
            start = time.perf_counter()
            with learner.waiting_on_group():
                buckets.finish(buf[-GRAD_TAIL:])  # what backward has not hidden
                device_settled(learner)
            learner.comm_s += time.perf_counter() - start
    except BaseException:
        if buckets is not None:
            buckets.abandon()
        raise
    return size


def reasonable_update(grads: torch.Tensor, learner) -> bool:
    """Whether the group's mean gradient is within GRAD_RATIO of the weights' norm (the weights are
    equal on every member, so all decide alike: a bound on the receiver's own gradient would not be)."""
    return float(torch.linalg.vector_norm(grads)) <= GRAD_RATIO * max(float(torch.linalg.vector_norm(learner.flat)),
                                                                      1.0)


def device_settled(learner, compute_only: bool = False) -> None:
    """On a GPU, wait until the device's queued work is done -- with `compute_only`, that of the
    learner's compute stream (backward), else of every stream (NCCL's too) -- so that what an
    all-reduce costs is timed as communication: an NCCL call returns to the host before its
    transfer is done, and the host would otherwise wait for it later, timed as compute."""
    if learner.device.type == "cuda":
        if compute_only:
            torch.cuda.current_stream(learner.device).synchronize()
        else:
            torch.cuda.synchronize(learner.device)


def apply_reduced_gradients(learner, buf: torch.Tensor, size: int) -> None:
    """After the all-reduce: the mean gradient of the union of everyone's batches, applied; then,
    when no shard has a batch left (or nobody had one), the start of the next epoch. When any
    member voted to end the chunk, every member ends it after this step (`learner.group_stops`)."""
    learner.group_stops = float(buf[-4]) > 0
    left, total = float(buf[-3]), float(buf[-2])
    if total > 0:
        buf[:-GRAD_TAIL].div_(total)
        # the same bits on every member, and replicas equal: all refuse alike
        update = finite(buf[:-GRAD_TAIL]) and reasonable_update(buf[:-GRAD_TAIL], learner)
        if not update:
            learner.refusals.refuse("the group", REFUSED_SUM)
        learner.apply_step(float(buf[-1]) / total, size, update=update)
    if left == 0:
        learner.start_next_epoch()
