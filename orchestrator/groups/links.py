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

Opening a link is the only Ray call: the active asks the passive (its kind's `open_link` call) to
expect a link of a fresh random id; the passive's `channel.LinkListener` (one per learner, bound to its node's
address) then takes the active's connection once it has proven the job's secret (`channel.py`),
and serves the link in a thread of its own (blocked in a receive, which releases the GIL) until
the active closes it or goes away. A partner that is gone costs its neighbour that one exchange:
a broken link fails its send or receive at once (the kernel closes a dead process's sockets), or
after LINK_TIMEOUT_S (a host cut off); a partner whose actor Ray reports dead is not asked again,
and one that did not answer (or whose listener did not prove the secret) is not asked again for
OPEN_BACKOFF_S.

What a side receives is checked before it is used (`checks.received_weights`: finite, and a norm
within NORM_RATIO of its own): a payload that fails is refused, the link dropped and the refusal
counted (`refused`); the learner trains on. Sizes on a link never come from the wire: both ends
know the payload's length from the codec and the model.

Both ends bind the link to their node's address (`learner.node_address`), or to the interface
the spec names (`group.interface`). Weights travel as CPU tensors; a learner on a GPU stages them
through host memory.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

import ray
import torch

from orchestrator.groups.channel import LINK_ID_BYTES, Channel, ChannelRefused, connect
from orchestrator.groups.checks import received_weights
from orchestrator.groups.compression import codec_for
from orchestrator.groups.network import interfaces
from orchestrator.groups.registry import call

# what a Ray call raises when the partner's actor or node died (ActorUnavailableError, a subclass
# of RayActorError, is a temporary loss of contact: a retry, not a death)
PARTNER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
OPEN_TIMEOUT_S = 5.0  # opening a link: the partner's answer, then the connection and its handshake
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
HEADER_BYTES = 8  # what the active asks, before each exchange's payload
EXCHANGE, CLOSE = 1, 0  # what a header asks
REFUSED_WEIGHTS = "weights that are not finite or far out of scale (checks.received_weights)"


def node_address(learner) -> str:
    return getattr(learner, "node_address", None) or ray.util.get_node_ip_address()



def bind_address(learner, interface: str | None) -> str:
    """The address a link binds to: `group.interface`'s first IPv4 address, else the learner's
    node address (never a wildcard address)."""
    if not interface:
        return node_address(learner)
    found = interfaces().get(interface)
    if not found:
        raise OSError(f"group.interface {interface} has no IPv4 address on this host")
    return found[0]


def header(code: int) -> bytes:
    return code.to_bytes(HEADER_BYTES, "little")


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, without a copy (what a channel sends and receives into)."""
    return memoryview(tensor.numpy()).cast("B")


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

    def settle(self, learner, version: int, active: bool) -> bool:
        """After both payloads arrived: this side's weights become the pair's mean (`none`), or
        move by half the difference of the public copies. False, changing nothing of the learner,
        when what arrived is refused (`checks.received_weights`): the link must then end."""
        if not self.codec.lossy:
            if not received_weights(self.theirs, self.mine):
                return False
            pair = (self.theirs, self.mine) if not active else (self.mine, self.theirs)
            learner.settle_mean(pair[0], pair[1], self.mine, version)
            return True
        self.codec.decode_add(self.inbox, self.numel, self.theirs)
        if not received_weights(self.theirs, self.mine):
            return False
        learner.add_to_weights(torch.sub(self.theirs, self.mine, out=self.work).mul_(0.5))
        return True


@dataclass
class Pending:
    """An exchange in flight on one link: a thread of its own receives the partner's payload into
    `inbox` while a second sends this side's header and payload."""

    partner_id: str
    channel: Channel
    payload: torch.Tensor  # what this side sends: alive until its send is done
    inbox: torch.Tensor
    version: int
    started: float = field(default_factory=time.perf_counter)
    arrived: threading.Event = field(default_factory=threading.Event)
    arrived_at: float | None = None  # time.perf_counter() when its bytes were all there
    error: Exception | None = None

    def __post_init__(self):
        threading.Thread(target=self._exchange, name=f"link-exchange-{self.partner_id[:8]}", daemon=True).start()

    def _exchange(self) -> None:
        sent: list[Exception] = []
        sender = threading.Thread(target=self._send, args=(sent,), daemon=True)
        sender.start()
        try:
            self.channel.recv_into(as_bytes(self.inbox))
        except OSError as exc:  # the partner died, its node, or its link
            self.error = exc
            self.channel.close()  # a send still under way fails at once
        finally:
            sender.join()
            self.error = self.error or (sent[0] if sent else None)
            self.arrived_at = time.perf_counter()
            self.arrived.set()

    def _send(self, errors: list) -> None:
        try:
            self.channel.send(header(EXCHANGE))
            self.channel.send(as_bytes(self.payload))
        except OSError as exc:
            errors.append(exc)
            self.channel.close()  # the receive fails at once

    def done(self) -> bool:
        return self.arrived.is_set()


class ActiveLinks:
    """An active learner's open links, by partner actor id (kept across re-formed rings).

    Args:
    codec: `group.compression` (`none`, `bf16`, `int8`).
    interface: `group.interface` (None: the node address's).
    kind: the group kind whose learners serve the links (its `open_link` call, `passive_links.py`).
    """

    def __init__(self, codec: str = "none", interface: str | None = None, kind: str = ""):
        self.codec, self.interface, self.kind = codec_for(codec), interface, kind
        self._links: dict[str, Channel] = {}
        self._state: dict[str, LinkState] = {}
        self.pending: dict[str, Pending] = {}  # partner id -> its exchange in flight
        self._gone: set[str] = set()  # partners whose actor Ray reported dead
        self._retry_at: dict[str, float] = {}  # partners that did not answer: when to ask again

    def busy(self, partner) -> bool:
        return partner._actor_id.hex() in self.pending

    def start(self, learner, partner) -> Pending | None:
        """Send this learner's weights to `partner` and receive theirs, in the background; returns
        the exchange in flight, or None when no link could be had (that exchange is lost)."""
        partner_id = partner._actor_id.hex()
        link = self._links.get(partner_id) or self._open(learner, partner, partner_id)
        if link is None:
            return None
        state = self._state[partner_id]
        payload, version = state.outgoing(learner)
        if state.crosses:
            learner.count_sent(payload.numel() + HEADER_BYTES)
        self.pending[partner_id] = Pending(partner_id, link, payload, state.inbox, version)
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
        """Wait for one exchange and settle it; False when the partner went away meanwhile, or
        what it sent was refused (the link is dropped either way)."""
        del self.pending[pending.partner_id]
        pending.arrived.wait()
        if pending.error is None:
            state = self._state[pending.partner_id]
            took = pending.arrived_at - pending.started
            state.duration_s = took if state.duration_s is None else 0.5 * state.duration_s + 0.5 * took
            if state.settle(learner, pending.version, active=True):
                return True
            learner.refusals.refuse(pending.channel.peer, REFUSED_WEIGHTS)
        # the partner died, its node or its link, or it sent what was refused: a lost exchange
        self._drop(pending.partner_id)
        self._retry_at[pending.partner_id] = time.monotonic() + OPEN_BACKOFF_S
        return False

    def keep_only(self, partners, learner) -> None:
        """Close the links to anyone who is no longer a partner (their exchange in flight first)."""
        wanted = {p._actor_id.hex() for p in partners}
        for partner_id in [p for p in self._links if p not in wanted]:
            self._close(partner_id, learner)

    def close(self, learner) -> None:
        self.keep_only([], learner)

    def _open(self, learner, partner, partner_id: str) -> Channel | None:
        now = time.monotonic()
        if partner_id in self._gone or now < self._retry_at.get(partner_id, 0.0):
            return None
        link_id = secrets.token_bytes(LINK_ID_BYTES)  # random and used once: no link can be guessed
        try:
            own = bind_address(learner, self.interface)
            asked = call(partner, self.kind, "open_link", link_id.hex(), own, self.codec.name, self.interface)
            codec, theirs, listener = ray.get(asked, timeout=OPEN_TIMEOUT_S)
            channel = connect(listener, learner.secret, link_id, source=own, timeout=OPEN_TIMEOUT_S)
        except ray.exceptions.ActorUnavailableError:
            self._retry_at[partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return None
        except PARTNER_GONE:
            self._gone.add(partner_id)
            return None
        except ChannelRefused as exc:  # its listener did not prove the secret (or it was not its listener)
            learner.refusals.refuse(listener.rsplit(":", 1)[0], f"a listener that did not prove the job's "
                                    f"secret ({exc})")
            self._retry_at[partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return None
        except (ray.exceptions.GetTimeoutError, OSError):  # busy, slow or unreachable
            self._retry_at[partner_id] = time.monotonic() + OPEN_BACKOFF_S
            return None
        channel.settimeout(LINK_TIMEOUT_S)
        self._links[partner_id] = channel
        # public copies start at zero on both ends
        self._state[partner_id] = LinkState(codec_for(codec), learner.numel, crosses=theirs != own)
        return channel

    def _close(self, partner_id: str, learner) -> None:
        """Close one link: its exchange in flight is settled if its bytes arrive within
        CLOSE_WAIT_S (the passive settles its side once they have: both move, the sum is kept),
        then the partner is told. One still travelling then is cut instead (its sender may be
        mid-payload: a header now would land inside it); the passive's side of it fails and
        settles nothing."""
        pending = self.pending.get(partner_id)
        if pending is not None and pending.arrived.wait(CLOSE_WAIT_S) and learner is not None:
            self._finish(learner, pending)
        travelling = self.pending.pop(partner_id, None)
        link = self._links.pop(partner_id, None)
        self._state.pop(partner_id, None)
        if link is None:  # the exchange failed: the link is gone already
            return
        if travelling is None:  # nothing else uses the link now
            try:
                link.settimeout(CLOSE_WAIT_S)
                link.send(header(CLOSE))
            except OSError:
                pass
        link.close()

    def _drop(self, partner_id: str) -> None:
        link = self._links.pop(partner_id, None)
        if link is not None:
            link.close()
        self._state.pop(partner_id, None)
        self.pending.pop(partner_id, None)
