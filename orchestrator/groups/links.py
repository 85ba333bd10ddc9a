"""Gossip's pairwise weight exchange over a direct link: a 2-process gloo group per (active,
passive) pair, opened on the pair's first exchange and kept while the pair stays partners.

One exchange: the active sends a header, then both sides send their weights to each other at the
same time. With `group.compression: none` each sends a copy of its float32 weights and each
side computes the mean as `lerp(active's, passive's, 0.5)` from the same two tensors in the same
order, so both get the same bits. With `bf16` or `int8` each sends the compressed difference
between its weights and its *public copy* (what the other side knows of them), both sides add it
to that copy, and each side moves by half the difference of the two public copies: the two moves
cancel, so the models' sum is kept exactly and what the codec dropped is sent with the next
exchange (`compression.py`). Only links between hosts are compressed: partners on one host
exchange float32 over its loopback. Nothing passes through Ray's object store and no Ray call is made per
exchange: on this machine a 10M-parameter exchange went from 299 ms through the object store to
1.3-1.5x a raw gloo round trip of the same bytes (bench/transport.py).

An exchange never holds a learner longer than its link needs to: the active starts it before its
gradient computation and, after, waits for it only while its link keeps up (its exchanges took no
longer than a step's computation); on a slower link it steps on and settles the exchange at a
later step, when its bytes have arrived (the mean's change is added to the weights it has by then:
no step of its own is lost). A link with an exchange in flight takes no second one; the active
mixes with its other partner meanwhile. The passive holds its weight lock only to take its
copy and to settle, never while bytes travel; its own steps go on meanwhile.

Opening a link is the only Ray call: the active asks the passive (`open_link`) to start its side
in a thread, then both meet at a rendezvous in a TCP store the active hosts. The passive serves
each link in a thread of its own (blocked in a receive, which releases the GIL) until the active
closes it or goes away. A partner that is gone costs its neighbour that one exchange: a broken
link fails its send or receive at once (the kernel closes a dead process's sockets), or after
LINK_TIMEOUT_S (a host cut off); a partner whose actor Ray reports dead is not asked again, and
one that did not answer is not asked again for OPEN_BACKOFF_S; a learner whose own rendezvous
store could not start opens no link for OPEN_BACKOFF_S.

Both ends bind the link to their node's address (`learner.node_address`), or to the interface
the spec names (`group.interface`). Weights travel as CPU tensors (gloo); a learner on a GPU
stages them through host memory. NCCL links for GPU learners are not built.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

from orchestrator.groups.compression import codec_for

# what a Ray call raises when the partner's actor or node died (ActorUnavailableError, a subclass
# of RayActorError, is a temporary loss of contact: a retry, not a death)
PARTNER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
OPEN_TIMEOUT_S = 5.0  # opening a link: the partner's answer, then the rendezvous
OPEN_BACKOFF_S = 5.0  # a partner that did not answer is not asked again for this long
CLOSE_WAIT_S = 2.0  # closing a link waits this long for the partner to take the message
IDLE_S = 600.0  # a passive whose active sent nothing for this long ends its side (an active that vanished
# without closing its sockets, e.g. behind a cut link, would otherwise hold the thread and buffers)
LINK_TIMEOUT_S = 300.0  # a send or receive on an open link fails after this long (a partner's node
# that vanished without closing its sockets; a process that died closes them and fails it at once).
# Generous: a 40 MB float32 exchange takes 64 s at 5 Mbit/s, and an exchange in flight holds only its
# own link, never the learner
ANSWER_WAIT_S = 10.0  # at the job's end, how long a passive waits for the exchanges it serves to settle
KEEPS_UP = 1.5  # a link keeps up while its exchanges take at most this x a step's computation
MIN_WAIT_S = 1.0  # ... and then the active waits up to a step's computation, at least this long
HEADER, TO_PASSIVE, TO_ACTIVE = 0, 1, 2  # message tags
EXCHANGE, CLOSE = 1, 0  # what a header asks


def pair_group(store, key: str, rank: int, host: str | None, interface: str | None = None):
    """The 2-process gloo group of one link (rank 0 the active), on the node's own address."""
    options = dist.ProcessGroupGloo._Options()
    device = dist.ProcessGroupGloo.create_device(interface=interface) if interface else \
        dist.ProcessGroupGloo.create_device(hostname=host)
    options._devices = [device]
    options._timeout = timedelta(seconds=LINK_TIMEOUT_S)
    return dist.ProcessGroupGloo(dist.PrefixStore(key, store), rank, 2, options)


def node_address(learner) -> str:
    return getattr(learner, "node_address", None) or ray.util.get_node_ip_address()


@dataclass
class LinkState:
    """One side's state of one link: the codec, the payload buffers and, for a lossy codec, the
    public copies of both sides' weights (identical on both ends); whether the link crosses
    between hosts (only then is what it sends counted in `sent_bytes`)."""

    codec: object
    numel: int
    crosses: bool = True
    mine: torch.Tensor = None  # none: this side's copy; else its public copy
    theirs: torch.Tensor = None  # none: the partner's weights as received; else its public copy
    inbox: torch.Tensor = None  # the partner's payload
    duration_s: float | None = None  # the link's recent exchange time (a moving average), as the active saw it

    work: torch.Tensor = None  # lossy: scratch of the same length (a fresh 40 MB tensor costs its page faults)

    def __post_init__(self):
        self.mine, self.theirs = torch.zeros(self.numel), torch.zeros(self.numel)
        self.work = torch.empty(self.numel) if self.codec.lossy else None
        self.inbox = torch.empty(self.codec.payload_bytes(self.numel), dtype=torch.uint8) if self.codec.lossy \
            else self.theirs.view(torch.uint8)  # float32 arrives in place

    def outgoing(self, learner) -> tuple[torch.Tensor, int]:
        """This side's payload for an exchange, and the version of the weights it was taken at."""
        if not self.codec.lossy:
            version = learner.copy_weights_to(self.mine)
            return self.mine.view(torch.uint8), version
        version = learner.copy_weights_to(self.work)
        payload = self.codec.encode(self.work.sub_(self.mine))
        self.codec.decode_add(payload, self.numel, self.mine)
        return payload, version

    def settle(self, learner, version: int, active: bool) -> None:
        """After both payloads arrived: this side's weights become the pair's mean (`none`), or
        move by half the difference of the public copies."""
        if not self.codec.lossy:
            pair = (self.theirs, self.mine) if not active else (self.mine, self.theirs)
            learner.settle_mean(pair[0], pair[1], self.mine, version)
            return
        self.codec.decode_add(self.inbox, self.numel, self.theirs)
        learner.add_to_weights(torch.sub(self.theirs, self.mine, out=self.work).mul_(0.5))


@dataclass
class Pending:
    """An exchange in flight on one link. A thread of its own waits for its sends and receive
    (gloo's point-to-point works cannot be polled: they complete only in `wait`)."""

    partner_id: str
    works: list
    version: int
    payload: torch.Tensor  # what this side sends: alive until its send is done
    started: float = field(default_factory=time.perf_counter)
    arrived: threading.Event = field(default_factory=threading.Event)
    arrived_at: float | None = None  # time.perf_counter() when its bytes were all there
    error: Exception | None = None

    def __post_init__(self):
        threading.Thread(target=self._wait, name=f"gossip-exchange-{self.partner_id[:8]}", daemon=True).start()

    def _wait(self) -> None:
        try:
            wait_all(self.works)
        except RuntimeError as exc:  # the partner died, its node, or its link
            self.error = exc
        finally:
            self.arrived_at = time.perf_counter()
            self.arrived.set()

    def done(self) -> bool:
        return self.arrived.is_set()


def wait_all(works) -> None:
    for work in works:
        work.wait()


class ActiveLinks:
    """An active learner's open links, by partner actor id (kept across re-formed rings).

    Args:
    codec: `group.compression` (`none`, `bf16`, `int8`).
    interface: `group.interface` (None: the node address's).
    """

    def __init__(self, codec: str = "none", interface: str | None = None):
        self.codec, self.interface = codec_for(codec), interface
        self._links: dict[str, object] = {}
        self._state: dict[str, LinkState] = {}
        self.pending: dict[str, Pending] = {}  # partner id -> its exchange in flight
        self._gone: set[str] = set()  # partners whose actor Ray reported dead
        self._retry_at: dict[str, float] = {}  # partners that did not answer: when to ask again
        self._opened = 0
        self._store = self._host = None
        self._store_retry_at = 0.0  # this learner's store could not start: when to try again

    def busy(self, partner) -> bool:
        return partner._actor_id.hex() in self.pending

    def start(self, learner, partner) -> Pending | None:
        """Send this learner's weights to `partner` and post the receive of theirs; returns the
        exchange in flight, or None when no link could be had (that exchange is lost)."""
        partner_id = partner._actor_id.hex()
        link = self._links.get(partner_id) or self._open(learner, partner, partner_id)
        if link is None:
            return None
        state = self._state[partner_id]
        payload, version = state.outgoing(learner)
        try:
            works = [link.send([torch.tensor([EXCHANGE])], 1, HEADER), link.send([payload], 1, TO_PASSIVE),
                     link.recv([state.inbox], 1, TO_ACTIVE)]
        except RuntimeError:
            self._drop(partner_id)
            return None
        if state.crosses:
            learner.count_sent(payload.numel() + 8)
        self.pending[partner_id] = Pending(partner_id, works, version, payload)
        return self.pending[partner_id]

    def settle(self, learner, wait_for: Pending | None = None, compute_s: float = 0.0) -> tuple[int, int]:
        """Settle the exchanges in flight whose bytes have arrived; `wait_for` (the one this step
        started) is first waited for while its link keeps up (`KEEPS_UP`), at most a step's
        computation. Returns (exchanges settled, exchanges lost)."""
        if wait_for is not None and wait_for.partner_id in self.pending:
            expected = self._state[wait_for.partner_id].duration_s
            if expected is None or expected <= KEEPS_UP * compute_s:
                until = time.perf_counter() + max(compute_s, MIN_WAIT_S)
                wait_for.arrived.wait(max(0.0, until - time.perf_counter()))
        mixed = lost = 0
        for pending in [p for p in self.pending.values() if p.done()]:
            if self._finish(learner, pending):
                mixed += 1
            else:
                lost += 1
        return mixed, lost

    def settle_all(self, learner, timeout: float | None = None) -> tuple[int, int]:
        """Wait for every exchange in flight and settle it; with `timeout`, at most that long for
        each (one still travelling then stays in flight)."""
        mixed = lost = 0
        for pending in list(self.pending.values()):
            if timeout is not None and not pending.arrived.wait(timeout):
                continue
            if self._finish(learner, pending):
                mixed += 1
            else:
                lost += 1
        return mixed, lost

    def _finish(self, learner, pending: Pending) -> bool:
        """Wait for one exchange and settle it; False when the partner went away meanwhile."""
        del self.pending[pending.partner_id]
        pending.arrived.wait()
        if pending.error is not None:  # the partner died, its node, or its link: a lost exchange
            self._drop(pending.partner_id)
            self._retry_at[pending.partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return False
        state = self._state[pending.partner_id]
        took = pending.arrived_at - pending.started
        state.duration_s = took if state.duration_s is None else 0.5 * state.duration_s + 0.5 * took
        state.settle(learner, pending.version, active=True)
        return True

    def keep_only(self, partners, learner) -> None:
        """Close the links to anyone who is no longer a partner (their exchange in flight first)."""
        wanted = {p._actor_id.hex() for p in partners}
        for partner_id in [p for p in self._links if p not in wanted]:
            self._close(partner_id, learner)

    def close(self, learner) -> None:
        self.keep_only([], learner)

    def _open(self, learner, partner, partner_id: str):
        now = time.monotonic()
        if partner_id in self._gone or now < self._retry_at.get(partner_id, 0.0) or now < self._store_retry_at:
            return None
        self._opened += 1
        key = f"link-{self._opened}"
        try:
            if self._store is None:  # this learner's rendezvous, hosted once for all its links
                self._host = node_address(learner)
                self._store_retry_at = now + OPEN_BACKOFF_S  # until it has started
                self._store = dist.TCPStore(self._host, 0, is_master=True, wait_for_workers=False,
                                            timeout=timedelta(seconds=OPEN_TIMEOUT_S))
                self._store_retry_at = 0.0
            codec, address = ray.get(partner.open_link.remote(key, f"{self._host}:{self._store.port}",
                                                              self.codec.name, self.interface), timeout=OPEN_TIMEOUT_S)
            self._links[partner_id] = pair_group(self._store, key, 0, self._host, self.interface)
            # public copies start at zero on both ends
            self._state[partner_id] = LinkState(codec_for(codec), learner.numel, crosses=address != self._host)
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

    def _close(self, partner_id: str, learner) -> None:
        """Close one link: its exchange in flight is settled if its bytes arrive within
        CLOSE_WAIT_S (the passive settles its side once they have: both move, the sum is kept),
        then the partner is told."""
        pending = self.pending.get(partner_id)
        if pending is not None and pending.arrived.wait(CLOSE_WAIT_S) and learner is not None:
            self._finish(learner, pending)
        self.pending.pop(partner_id, None)
        link = self._links.pop(partner_id, None)
        self._state.pop(partner_id, None)
        if link is None:  # the exchange failed: the link is gone already
            return
        try:
            link.send([torch.tensor([CLOSE])], 1, HEADER).wait(timedelta(seconds=CLOSE_WAIT_S))
        except RuntimeError:
            pass

    def _drop(self, partner_id: str) -> None:
        self._links.pop(partner_id, None)
        self._state.pop(partner_id, None)
        self.pending.pop(partner_id, None)


class PassiveLinks:
    """A passive learner's side of its links: one serving thread per link, each with its own
    state. `exit_in_exchange` (tests and bench/faults.py only): the process exits inside the
    next exchange it serves, after the active's header arrived and before it answers."""

    def __init__(self, learner):
        self.learner = learner
        self.exit_in_exchange = False
        self._answering = 0  # exchanges whose header has arrived and whose mean is not yet taken
        self._answered = threading.Condition()

    def wait_answered(self, timeout: float = ANSWER_WAIT_S) -> bool:
        """Wait (at most `timeout`) until every exchange an active has started with this learner is
        settled on this side too; False if one is still being answered. At the job's end, once the
        actives have settled theirs, no exchange starts any more and this one's weights hold every
        mean it took part in."""
        with self._answered:
            return self._answered.wait_for(lambda: self._answering == 0, timeout)

    def open(self, key: str, address: str, codec: str = "none", interface: str | None = None) -> tuple[str, str]:
        """Serve a link an active partner opens (its rendezvous at `address`); returns the link's
        codec, `codec` or `none` when the active is on this learner's host (loopback has the
        bytes to spare, and an exact exchange leaves both on the same mean), and this learner's
        node address."""
        own = node_address(self.learner)
        crosses = address.rsplit(":", 1)[0] != own
        codec = codec if crosses else "none"
        threading.Thread(target=self._serve, args=(key, address, codec, interface, crosses), name=f"gossip-{key}",
                         daemon=True).start()
        return codec, own

    def _serve(self, key: str, address: str, codec: str, interface: str | None, crosses: bool) -> None:
        host, port = address.rsplit(":", 1)
        try:
            store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=OPEN_TIMEOUT_S))
            link = pair_group(store, key, 1, node_address(self.learner), interface)
        except RuntimeError:  # the active gave up or went away before the rendezvous
            return
        header = torch.zeros(1, dtype=torch.int64)
        state = LinkState(codec_for(codec), self.learner.numel, crosses)
        try:
            while True:
                link.recv([header], 0, HEADER).wait(timedelta(seconds=IDLE_S))  # idle links stay open
                if int(header) == CLOSE:
                    return
                with self._answered:
                    self._answering += 1
                try:
                    self._answer(link, state)
                finally:
                    with self._answered:
                        self._answering -= 1
                        self._answered.notify_all()
        except RuntimeError:  # the active died, its node or its link: the link ends
            return

    def _answer(self, link, state: LinkState) -> None:
        if self.exit_in_exchange:
            os._exit(1)
        learner = self.learner
        works = [link.recv([state.inbox], 0, TO_PASSIVE)]  # under way while this side takes its copy
        payload, version = state.outgoing(learner)
        works.append(link.send([payload], 0, TO_ACTIVE))
        if state.crosses:
            learner.count_sent(payload.numel())
        wait_all(works)  # no lock held: this learner steps on meanwhile
        state.settle(learner, version, active=False)
        learner.count_averages(1)
