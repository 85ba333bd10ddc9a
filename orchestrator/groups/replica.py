"""The contract between a group and the learner it runs in: `Replica` (what a member may read and
change on its learner), `GroupMember` (what every member offers its learner), and the step helper
of the free-running members (solo, gossip).

Members reach their learner only through `Replica`; the learner (`orchestrator/learner/`)
implements it, and nothing here imports the learner.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Replica(Protocol):
    """A learner as its group sees it: counters, buffers and weights to read; the attributes under
    "changed by the group" are the only ones a member writes."""

    # read
    step: int
    epoch: int
    device: torch.device
    params: list[torch.Tensor]
    grad_buffer: torch.Tensor  # every gradient is a view into it (`base/flat.py`); collectives sum it in place
    flat: torch.Tensor  # the trainable weights, every parameter a view into it (changed under its weight lock)
    numel: int  # of the flat trainable weights
    node_address: str | None  # its node's address, which its groups bind to (None: this process only)
    secret: object  # the job's `JobSecret`: what its channels and its group's members prove
    kind_states: object  # `kind_states.KindStates`: what the group's kind keeps in this process
    refusals: object  # `channel.Refusals`: what it refused of other processes, counted by reason
    # changed by the group
    comm_s: float  # communication seconds, added to by the group
    group_links: object  # what a group keeps in this process across re-formed groups (gossip's links)
    group_stops: bool  # a collective's members agreed to end the chunk after its last step
    failed_exchanges: int  # gossip: exchanges lost
    busy_steps: int  # gossip: steps that started no exchange (links busy)

    # training
    def next_batch(self): ...

    def start_next_epoch(self, move_on: bool = False) -> None: ...

    def forward_backward(self, batch) -> float: ...

    def apply_step(self, loss: float, samples: int, update: bool = True) -> None: ...

    def batches_left(self) -> int: ...

    def wants_to_stop(self, chunk: bool = True) -> bool: ...

    def set_counters(self, step: int, epoch: int) -> None: ...

    def waiting_on_group(self) -> AbstractContextManager: ...

    # weights, under the learner's weight lock
    def flat_grads(self) -> torch.Tensor: ...

    def flat_weights(self, on_device: bool = False) -> torch.Tensor: ...

    def load_flat_weights(self, flat: torch.Tensor) -> None: ...

    def copy_weights_to(self, out: torch.Tensor) -> int: ...

    def settle_mean(self, active: torch.Tensor, passive: torch.Tensor, mine: torch.Tensor, version: int) -> None: ...

    def add_to_weights(self, delta: torch.Tensor) -> None: ...

    def count_averages(self, n: int) -> None: ...

    def count_sent(self, nbytes: int) -> None: ...


class GroupMember(Protocol):
    """One learner's part of a group, built by the driver and sent to the learner (`groups/__init__`)."""

    lockstep: bool
    stops_alone: bool

    def setup(self, learner: Replica) -> None: ...

    def step(self, learner: Replica) -> None: ...

    def close(self) -> None: ...


def next_batch_or_new_epoch(learner: Replica):
    """Free-running learners (solo, gossip) move to their next epoch on their own: at the end of a
    shard this starts the next epoch and returns None (that step does nothing), so the driver's
    epoch limit is checked before any batch of the new epoch is taken. A learner with no shard in
    its epoch (it joined after the split) moves on to its first epoch with one."""
    batch = learner.next_batch()
    if batch is None:
        learner.start_next_epoch(move_on=True)
    return batch
