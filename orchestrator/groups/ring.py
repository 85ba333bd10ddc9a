"""A learner's place on an AD-PSGD ring (Lian et al., ICML 2018; Zhang et al., ICASSP 2019), for the
kinds that mix over links (`RingMember`).

Learners at even ring positions are active, odd ones passive. With each local step an active
learner averages its weights with a randomly chosen passive neighbour over a direct link
(`links.py`); the passive side serves it in a thread of its own while it computes, and both end
with the same mean (a passive whose own step landed meanwhile keeps that step on top of it). The
exchange overlaps the active learner's gradient computation (delay-by-one): the gradient computed
on the pre-average weights is applied to the mean. On a link slower than the learner's steps the
exchange runs on across steps and is settled when its bytes have arrived, while the learner mixes
with its other partner meanwhile (as AD-PSGD's communication thread, Lian et al.). There is no
global barrier, and on a ring of odd size the last active position still has a passive
neighbour, so every learner keeps mixing. A partner that has died costs its neighbour that one
exchange (counted in `failed_exchanges`), never an error or a hang.
"""

from __future__ import annotations

import random
import time

from orchestrator.groups.links import ActiveLinks
from orchestrator.groups.replica import next_batch_or_new_epoch

FINAL_SETTLE_S = 10.0  # at the job's end, how long an exchange still in flight is waited for


def ring_partners(position: int, ring_size: int) -> list[int]:
    """Passive neighbours of an active (even) position; [] for passive positions and rings of one."""
    if position % 2 == 1 or ring_size < 2:
        return []
    neighbours = {(position - 1) % ring_size, (position + 1) % ring_size}
    return sorted(q for q in neighbours if q % 2 == 1 and q != position)


class RingMember:
    """One learner's place on an AD-PSGD ring.

    Args:
    position: this learner's place on the ring.
    partners: actor handles of its passive neighbours (empty for passive learners).
    seed: for the choice of partner.
    compression: `group.compression` of its links (`none`, `bf16`, `int8`).
    interface: `group.interface` of its links (None: its node address's).
    kind: the kind whose learners serve its links (their `open_link` call).
    """

    lockstep = False
    stops_alone = True

    def __init__(self, position: int, partners: list, seed: int = 0, compression: str = "none",
                 interface: str | None = None, *, kind: str):
        self.position, self.partners = position, partners
        self.compression, self.interface, self.kind = compression, interface, kind
        self._rng = random.Random(seed * 1_000_003 + position)
        self._links = self._learner = None  # this process's ActiveLinks and learner, once this member has used them

    def setup(self, learner) -> None:
        pass

    def step(self, learner) -> None:
        batch = next_batch_or_new_epoch(learner)
        if batch is None:
            return
        exchange = self.start_exchange(learner)
        started = time.perf_counter()
        loss = learner.forward_backward(batch)  # overlaps the exchange
        self.finish_exchange(learner, exchange, time.perf_counter() - started)
        learner.apply_step(loss, batch.size)

    def mix(self, learner) -> None:
        """One exchange without a gradient step, waited for (tests and consensus checks)."""
        self.start_exchange(learner)
        if learner.group_links is not None:
            with learner.waiting_on_group():
                self._count(learner, learner.group_links.settle_all(learner))

    def start_exchange(self, learner):
        """Settle the exchanges that arrived since the last step, then start averaging with a
        randomly chosen partner whose link is free; returns that exchange in flight (None: no
        partner, every link busy, or no link could be had: a lost exchange)."""
        links = learner.group_links
        if links is None and not self.partners:
            return None
        if links is None or (links.codec.name, links.interface, links.kind) != (self.compression, self.interface,
                                                                                self.kind):
            if links is not None:
                links.close(learner)
            links = learner.group_links = ActiveLinks(self.compression, self.interface, self.kind)
        self._links, self._learner = links, learner
        started = time.perf_counter()
        with learner.waiting_on_group():  # closing and opening links wait for partners
            links.keep_only(self.partners, learner)  # a re-formed ring: links to former partners close
            self._count(learner, links.settle(learner))
            free = [p for p in self.partners if not links.busy(p)]
            pending = links.start(learner, self._rng.choice(free)) if free else None
        learner.comm_s += time.perf_counter() - started
        if free and pending is None:  # no link could be had: this step goes unmixed
            learner.failed_exchanges += 1
        elif not free:  # every link still carries an earlier exchange (slower than the steps)
            learner.busy_steps += 1
        return pending

    def finish_exchange(self, learner, exchange, compute_s: float = 0.0) -> None:
        """After the step's computation: the exchange this step started, waited for while its link
        keeps up (`links.ActiveLinks.settle`), and any other that has arrived."""
        if learner.group_links is None:
            return
        waited = time.perf_counter()
        with learner.waiting_on_group():
            self._count(learner, learner.group_links.settle(learner, exchange, compute_s))
        learner.comm_s += time.perf_counter() - waited

    def settle_all(self, learner, timeout: float = FINAL_SETTLE_S) -> None:
        """Wait (at most `timeout` each) for the exchanges in flight and settle them (the job's
        end: its last evaluation then averages models that took both halves of every exchange)."""
        if learner.group_links is not None:
            with learner.waiting_on_group():
                self._count(learner, learner.group_links.settle_all(learner, timeout))

    @staticmethod
    def _count(learner, settled: tuple[int, int]) -> None:
        mixed, lost = settled
        learner.count_averages(mixed)  # the passive partner holds the same mean (or the opposite move)
        learner.failed_exchanges += lost  # the partner (or its node, or its link) went away meanwhile

    def close(self) -> None:
        if self._links is not None:
            self._links.close(self._learner)
