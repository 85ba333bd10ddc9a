"""Gossip's pairwise weight exchange over a direct link: a 2-process gloo group per (active,
passive) pair, opened on the pair's first exchange and kept while the pair stays partners.

One exchange: the active sends a header, then both sides send a snapshot of their weights to
each other at the same time, and each side computes the mean as `lerp(active's, passive's, 0.5)`
from the same two tensors in the same order, so both get the same bits. The passive assigns it
under its weight lock, the active after its gradient computation (delay-by-one). The passive
holds its lock only to take the snapshot and to assign, never while waiting on the network; if
its own optimizer step (or anything else) changed its weights meanwhile, it adds the mean's
change to them instead (`mean - snapshot`), so no update of its own is lost (the same holds for
the active). Nothing passes through Ray's object store and no Ray call is made per exchange: on
this machine a 10M-parameter exchange went from 299 ms through the object store to 1.3-1.5x a
raw gloo round trip of the same bytes (bench/transport.py).

Opening a link is the only Ray call: the active asks the passive (`open_link`) to start its side
in a thread, then both meet at a rendezvous in a TCP store the active hosts. The passive serves
each link in a thread of its own (blocked in a receive, which releases the GIL) until the active
closes it or goes away. A partner that is gone costs its neighbour that one exchange: a broken
link fails its send or receive at once (the kernel closes a dead process's sockets); a partner
whose actor Ray reports dead is not asked again, and one that did not answer is not asked again
for OPEN_BACKOFF_S; a learner whose own rendezvous store could not start opens no link for
OPEN_BACKOFF_S.

Weights travel as CPU float32 (gloo); a learner on a GPU stages them through host memory. NCCL
links for GPU learners are not built.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

# what a Ray call raises when the partner's actor or node died (ActorUnavailableError, a subclass
# of RayActorError, is a temporary loss of contact: a retry, not a death)
PARTNER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
OPEN_TIMEOUT_S = 5.0  # opening a link: the partner's answer, then the rendezvous
OPEN_BACKOFF_S = 5.0  # a partner that did not answer is not asked again for this long
CLOSE_WAIT_S = 2.0  # closing a link waits this long for the partner to take the message
IDLE_S = 365 * 86400.0  # how long a passive waits for its active's next exchange (until it closes)
LINK_TIMEOUT_S = 30.0  # a send or receive on an open link fails after this long (a partner's node
# that vanished without closing its sockets; a process that died closes them and fails it at once)
HEADER, TO_PASSIVE, TO_ACTIVE = 0, 1, 2  # message tags
EXCHANGE, CLOSE = 1, 0  # what a header asks


def pair_group(store, key: str, rank: int, host: str) -> dist.ProcessGroupGloo:
    """The 2-process gloo group of one link (rank 0 the active), on the node's own address."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timedelta(seconds=LINK_TIMEOUT_S)
    return dist.ProcessGroupGloo(dist.PrefixStore(key, store), rank, 2, options)


def wait_all(works) -> None:
    for work in works:
        work.wait()


class ActiveLinks:
    """An active learner's open links, by partner actor id (kept across re-formed rings)."""

    def __init__(self):
        self._links: dict[str, dist.ProcessGroupGloo] = {}
        self._gone: set[str] = set()  # partners whose actor Ray reported dead
        self._retry_at: dict[str, float] = {}  # partners that did not answer: when to ask again
        self._opened = 0
        self._store = self._host = None
        self._store_retry_at = 0.0  # this learner's store could not start: when to try again
        self._mine = self._theirs = None  # this side's buffers: its weights out, the partner's in

    def start(self, learner, partner):
        """Send this learner's weights to `partner` and post the receive of theirs; returns what
        `finish` takes, or None when no link could be had (that exchange is lost)."""
        partner_id = partner._actor_id.hex()
        link = self._links.get(partner_id) or self._open(partner, partner_id)
        if link is None:
            return None
        if self._mine is None or self._mine.numel() != learner.numel:
            self._mine, self._theirs = torch.empty(learner.numel), torch.empty(learner.numel)
        version = learner.snapshot(self._mine)
        try:
            works = [link.send([torch.tensor([EXCHANGE])], 1, HEADER), link.send([self._mine], 1, TO_PASSIVE),
                     link.recv([self._theirs], 1, TO_ACTIVE)]
        except RuntimeError:
            self._drop(partner_id)
            self._mine = None
            return None
        return partner_id, works, version

    def finish(self, learner, pending) -> bool:
        """Wait for the exchange and load the mean; False when the partner went away meanwhile."""
        if pending is None:
            return False
        partner_id, works, version = pending
        try:
            wait_all(works)
        except RuntimeError:  # the partner died, or its node: a lost exchange
            self._drop(partner_id)
            self._mine = None  # an aborted receive may still write into the old buffer
            return False
        learner.settle_mean(self._mine, self._theirs, self._mine, version)
        return True

    def keep_only(self, partners) -> None:
        """Close the links to anyone who is no longer a partner."""
        wanted = {p._actor_id.hex() for p in partners}
        for partner_id in [p for p in self._links if p not in wanted]:
            self._close(partner_id)

    def close(self) -> None:
        self.keep_only([])

    def _open(self, partner, partner_id: str):
        now = time.monotonic()
        if partner_id in self._gone or now < self._retry_at.get(partner_id, 0.0) or now < self._store_retry_at:
            return None
        self._opened += 1
        key = f"link-{self._opened}"
        try:
            if self._store is None:  # this learner's rendezvous, hosted once for all its links
                self._host = ray.util.get_node_ip_address()
                self._store_retry_at = now + OPEN_BACKOFF_S  # until it has started
                self._store = dist.TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                            timeout=timedelta(seconds=OPEN_TIMEOUT_S))
                self._store_retry_at = 0.0
            ray.get(partner.open_link.remote(key, f"{self._host}:{self._store.port}"), timeout=OPEN_TIMEOUT_S)
            self._links[partner_id] = pair_group(self._store, key, 0, self._host)
        except ray.exceptions.ActorUnavailableError:
            self._retry_at[partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return None
        except PARTNER_GONE:
            self._gone.add(partner_id)
            return None
        except (ray.exceptions.GetTimeoutError, RuntimeError):  # busy, slow or unreachable; or this
            # learner's own store could not start (its server did not answer itself within
            # OPEN_TIMEOUT_S on a saturated machine: a 32-learner start, 2026-11-25)
            self._retry_at[partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return None
        return self._links[partner_id]

    def _close(self, partner_id: str) -> None:
        link = self._links.pop(partner_id)
        try:
            link.send([torch.tensor([CLOSE])], 1, HEADER).wait(timedelta(seconds=CLOSE_WAIT_S))
        except RuntimeError:
            pass

    def _drop(self, partner_id: str) -> None:
        self._links.pop(partner_id, None)


class PassiveLinks:
    """A passive learner's side of its links: one serving thread per link, each with its own
    buffers. `exit_in_exchange` (tests and bench/faults.py only): the process exits inside the
    next exchange it serves, after the active's header arrived and before it answers."""

    def __init__(self, learner):
        self.learner = learner
        self.exit_in_exchange = False

    def open(self, key: str, address: str) -> None:
        threading.Thread(target=self._serve, args=(key, address), name=f"gossip-{key}", daemon=True).start()

    def _serve(self, key: str, address: str) -> None:
        host, port = address.rsplit(":", 1)
        try:
            store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=OPEN_TIMEOUT_S))
            link = pair_group(store, key, 1, ray.util.get_node_ip_address())
        except RuntimeError:  # the active gave up or went away before the rendezvous
            return
        header = torch.zeros(1, dtype=torch.int64)
        mine, theirs = torch.empty(self.learner.numel), torch.empty(self.learner.numel)
        try:
            while True:
                link.recv([header], 0, HEADER).wait(timedelta(seconds=IDLE_S))  # idle links stay open
                if int(header) == CLOSE:
                    return
                self._answer(link, mine, theirs)
        except RuntimeError:  # the active died or its node: the link ends
            return

    def _answer(self, link, mine: torch.Tensor, theirs: torch.Tensor) -> None:
        if self.exit_in_exchange:
            os._exit(1)
        learner = self.learner
        works = [link.recv([theirs], 0, TO_PASSIVE)]  # under way while this side takes its snapshot
        version = learner.snapshot(mine)
        works.append(link.send([mine], 0, TO_ACTIVE))
        wait_all(works)  # no lock held: this learner steps on meanwhile
        learner.settle_mean(theirs, mine, mine, version)
        learner.averages += 1
