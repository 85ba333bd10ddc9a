"""AD-PSGD on a ring (Lian et al., ICML 2018; Zhang et al., ICASSP 2019).

Learners at even ring positions are active, odd ones passive. After each local step an active
learner averages its weights with a randomly chosen passive neighbour over a direct link
(`links.py`); the passive side serves it in a thread of its own while it computes, and both end
with the same mean (a passive whose own step landed meanwhile keeps that step on top of it). The
exchange overlaps the active learner's next gradient computation (delay-by-one): the gradient
computed on the pre-average weights is applied to the mean. There is no global barrier, and on a
ring of odd size the last active position still has a passive neighbour, so every learner keeps
mixing. A partner that has died costs its neighbour that one exchange (counted in
`failed_exchanges`), never an error or a hang.
"""

from __future__ import annotations

import random
import time

from orchestrator.groups.links import ActiveLinks


def ring_partners(position: int, ring_size: int) -> list[int]:
    """Passive neighbours of an active (even) position; [] for passive positions and rings of one."""
    if position % 2 == 1 or ring_size < 2:
        return []
    neighbours = {(position - 1) % ring_size, (position + 1) % ring_size}
    return sorted(q for q in neighbours if q % 2 == 1 and q != position)


class GossipMember:
    """Args:
    position: this learner's place on the ring.
    partners: actor handles of its passive neighbours (empty for passive learners).
    seed: for the choice of partner.
    """

    lockstep = False
    stops_alone = True

    def __init__(self, position: int, partners: list, seed: int = 0):
        self.position, self.partners = position, partners
        self._rng = random.Random(seed * 1_000_003 + position)
        self._links = None  # this process's ActiveLinks, once this member has used them

    def setup(self, learner) -> None:
        pass

    def step(self, learner) -> None:
        from orchestrator.groups import next_batch_or_new_epoch

        batch = next_batch_or_new_epoch(learner)
        if batch is None:
            return
        exchange = self.start_exchange(learner)
        loss = learner.forward_backward(batch)  # overlaps the exchange
        self.finish_exchange(learner, exchange)
        learner.apply_step(loss, batch.size)

    def mix(self, learner) -> None:
        """One exchange without a gradient step (tests and consensus checks)."""
        self.finish_exchange(learner, self.start_exchange(learner))

    def start_exchange(self, learner):
        """Start averaging with a randomly chosen partner; what `finish_exchange` takes."""
        links = learner.group_links
        if links is None and not self.partners:
            return None
        if links is None:
            links = learner.group_links = ActiveLinks()
        self._links = links
        started = time.perf_counter()
        with learner.waiting_on_group():  # closing and opening links wait for partners
            links.keep_only(self.partners)  # a re-formed ring: links to former partners close
            pending = links.start(learner, self._rng.choice(self.partners)) if self.partners else None
        learner.comm_s += time.perf_counter() - started
        if not self.partners:
            return None
        return ("exchange", pending)  # pending is None when no link could be had: a lost exchange

    @staticmethod
    def finish_exchange(learner, exchange) -> None:
        if exchange is None:
            return
        waited = time.perf_counter()
        with learner.waiting_on_group():
            mixed = learner.group_links.finish(learner, exchange[1])
        learner.comm_s += time.perf_counter() - waited
        if mixed:  # the passive partner now holds the same mean
            learner.averages += 1
        else:  # the partner (or its node) died: this step goes unmixed
            learner.failed_exchanges += 1

    def close(self) -> None:
        if self._links is not None:
            self._links.close()
