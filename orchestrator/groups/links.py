"""Gossip's pairwise weight exchange over a direct link: a 2-process gloo group per (active,
passive) pair, opened on the pair's first exchange and kept while the pair stays partners.

One exchange: the active sends a header, then both sides send their weights to each other at
the same time (the passive under its weight lock, taking a snapshot there), and each side
computes the mean as `(mine + theirs) * 0.5` (IEEE addition commutes, so both get the same bits);
the passive assigns it before it releases the lock, the active after its gradient computation
(delay-by-one, as before). Nothing passes through Ray's object store and no Ray call is made per
exchange: on this machine a 10M-parameter exchange went from 299 ms through the object store to
the cost of moving the bytes (bench/transport.py).

Opening a link is the only Ray call: the active asks the passive (`open_link`) to start its side
in a thread, then both meet at a rendezvous in a TCP store the active hosts. The passive serves
each link in a thread of its own (blocked in a receive, which releases the GIL) until the active
closes it or goes away. A partner that is gone costs its neighbour that one exchange: a broken
link fails its send or receive at once (the kernel closes a dead process's sockets); a partner
whose actor Ray reports dead is not asked again.

Weights travel as CPU float32 (gloo); a learner on a GPU stages them through host memory. NCCL
links for GPU learners are not built.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

# what a Ray call raises when the partner's actor or node died
PARTNER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
OPEN_TIMEOUT_S = 5.0  # opening a link: the partner's answer, then the rendezvous
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
        self._opened = 0
        self._store = self._host = None
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
        learner.flat_weights_into(self._mine)
        try:
            works = [link.send([torch.tensor([EXCHANGE])], 1, HEADER), link.send([self._mine], 1, TO_PASSIVE),
                     link.recv([self._theirs], 1, TO_ACTIVE)]
        except RuntimeError:
            self._drop(partner_id)
            return None
        return partner_id, works

    def finish(self, learner, pending) -> bool:
        """Wait for the exchange and load the mean; False when the partner went away meanwhile."""
        if pending is None:
            return False
        partner_id, works = pending
        try:
            wait_all(works)
        except RuntimeError:  # the partner died, or its node: a lost exchange
            self._drop(partner_id)
            self._mine = None  # an aborted receive may still write into the old buffer
            return False
        with learner.lock:
            learner.assign_mean(self._mine, self._theirs)
        return True

    def keep_only(self, partners) -> None:
        """Close the links to anyone who is no longer a partner."""
        wanted = {p._actor_id.hex() for p in partners}
        for partner_id in [p for p in self._links if p not in wanted]:
            self._close(partner_id)

    def close(self) -> None:
        self.keep_only([])

    def _open(self, partner, partner_id: str):
        if partner_id in self._gone:
            return None
        if self._store is None:
            self._host = ray.util.get_node_ip_address()
            self._store = dist.TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=OPEN_TIMEOUT_S))
        self._opened += 1
        key = f"link-{self._opened}"
        try:
            ray.get(partner.open_link.remote(key, f"{self._host}:{self._store.port}"), timeout=OPEN_TIMEOUT_S)
            self._links[partner_id] = pair_group(self._store, key, 0, self._host)
        except PARTNER_GONE:
            self._gone.add(partner_id)
            return None
        except (ray.exceptions.GetTimeoutError, RuntimeError):  # busy or slow: try again next exchange
            return None
        return self._links[partner_id]

    def _close(self, partner_id: str) -> None:
        link = self._links.pop(partner_id)
        try:
            link.send([torch.tensor([CLOSE])], 1, HEADER).wait()
        except RuntimeError:
            pass

    def _drop(self, partner_id: str) -> None:
        self._links.pop(partner_id, None)


class PassiveLinks:
    """A passive learner's side of its links: one serving thread per link. `exit_in_exchange`
    (tests and bench/faults.py only): the process exits inside the next exchange it serves, after
    the active's header arrived and before it answers."""

    def __init__(self, learner):
        self.learner = learner
        self.exit_in_exchange = False
        self._lock = threading.Lock()  # the buffer below, shared by the serving threads
        self._theirs = None  # the active partner's weights, received

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
        try:
            while True:
                link.recv([header], 0, HEADER).wait()
                if int(header) == CLOSE:
                    return
                self._answer(link)
        except RuntimeError:  # the active died or its node: the link ends
            return

    def _answer(self, link) -> None:
        import os

        if self.exit_in_exchange:
            os._exit(1)
        learner = self.learner
        with self._lock:
            if self._theirs is None or self._theirs.numel() != learner.numel:
                self._theirs = torch.empty(learner.numel)
            works = [link.recv([self._theirs], 0, TO_PASSIVE)]  # under way while this side takes the lock
            try:
                with learner.lock:
                    mine = learner.flat if learner.flat.device.type == "cpu" else learner.flat.cpu()
                    works.append(link.send([mine], 0, TO_ACTIVE))
                    wait_all(works)
                    learner.assign_mean(self._theirs, mine)
                    learner.averages += 1
            except RuntimeError:
                self._theirs = None  # an aborted receive may still write into the old buffer
                raise
