"""A passive gossip learner's side of its links (`links.py` has the active's and what both share):
its link listener, made on the first link a partner opens (`channel.LinkListener`, bound to the
learner's node address), and one serving thread per link that answers each exchange while the
learner steps on."""

from __future__ import annotations

import os
import threading

from orchestrator.groups.channel import LINK_ID_BYTES, Channel, LinkListener
from orchestrator.groups.compression import codec_for
from orchestrator.groups.links import (
    ANSWER_WAIT_S,
    CLOSE,
    EXCHANGE,
    HEADER_BYTES,
    IDLE_S,
    LINK_TIMEOUT_S,
    REFUSED_WEIGHTS,
    LinkState,
    as_bytes,
    bind_address,
)


class PassiveLinks:
    """A passive learner's side of its links: its listener (made on the first link it is asked
    for) and one serving thread per link, each with its own state. What a kind whose learners link
    keeps in each learner's process (`GroupKind.process_state`). With `learner._exit_in_exchange`
    (tests and bench/faults.py only) the process exits inside the next exchange it serves, after
    the active's header arrived and before it answers."""

    def __init__(self, learner):
        self.learner = learner
        self.listener: LinkListener | None = None
        self._listener_lock = threading.Lock()
        self._answering = 0  # exchanges whose header has arrived and whose mean is not yet taken
        self._answered = threading.Condition()

    def wait_answered(self, timeout: float = ANSWER_WAIT_S) -> bool:
        """Wait (at most `timeout`) until every exchange an active has started with this learner is
        settled on this side too; False if one is still being answered. At the job's end, once the
        actives have settled theirs, no exchange starts any more and this one's weights hold every
        mean it took part in."""
        with self._answered:
            return self._answered.wait_for(lambda: self._answering == 0, timeout)

    def open(self, link_id: str, active: str, codec: str = "none",
             interface: str | None = None) -> tuple[str, str, str]:
        """Expect a link an active partner opens with id `link_id` (hex) from address `active` (its
        `links.bind_address`); returns the link's codec (`codec`, or `none` when the active is on
        this learner's host: loopback has the bytes to spare, and an exact exchange leaves both on
        the same mean), this learner's address and where its listener listens."""
        key = bytes.fromhex(link_id)
        if len(key) != LINK_ID_BYTES:
            raise ValueError(f"a link id has {LINK_ID_BYTES} bytes")
        own = bind_address(self.learner, interface)
        crosses = active != own
        codec = codec if crosses else "none"
        listener = self._listener(own)
        listener.expect(key, active, lambda channel: self._serve(channel, codec, crosses))
        return codec, own, listener.address

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()

    def _listener(self, address: str) -> LinkListener:
        with self._listener_lock:
            if self.listener is None or not self.listener.alive or self.listener.address.rsplit(":", 1)[0] != address:
                if self.listener is not None:
                    self.listener.close()
                self.listener = LinkListener(self.learner.secret, address, self.learner.refusals)
            return self.listener

    def _serve(self, channel: Channel, codec: str, crosses: bool) -> None:
        state = LinkState(codec_for(codec), self.learner.numel, crosses)
        head = bytearray(HEADER_BYTES)
        try:
            while True:
                channel.settimeout(IDLE_S)  # idle links stay open
                channel.recv_into(head)
                code = int.from_bytes(head, "little")
                if code == CLOSE:
                    return
                if code != EXCHANGE:
                    self.learner.refusals.refuse(channel.peer, "a link message that is not an exchange")
                    return
                with self._answered:
                    self._answering += 1
                try:
                    channel.settimeout(LINK_TIMEOUT_S)
                    if not self._answer(channel, state):
                        return
                finally:
                    with self._answered:
                        self._answering -= 1
                        self._answered.notify_all()
        except OSError:  # the active died, its node or its link: the link ends
            return
        finally:
            channel.close()

    def _answer(self, channel: Channel, state: LinkState) -> bool:
        """Serve one exchange; False when what the active sent is refused (the link ends)."""
        if getattr(self.learner, "_exit_in_exchange", False):  # tests, bench/faults.py (`simulate_exit_in_average`)
            os._exit(1)
        learner, failed = self.learner, []

        def receive() -> None:
            try:
                channel.recv_into(as_bytes(state.inbox))
            except OSError as exc:
                failed.append(exc)
                channel.close()

        receiving = threading.Thread(target=receive, daemon=True)  # under way while this side takes its copy
        receiving.start()
        try:
            payload, version = state.outgoing(learner)
            channel.send(as_bytes(payload))
        except OSError:
            channel.close()
            raise
        finally:
            receiving.join()
        if failed:
            raise failed[0]
        if state.crosses:
            learner.count_sent(payload.numel())
        if not state.settle(learner, version, active=False):  # no lock held: this learner steps on meanwhile
            learner.refusals.refuse(channel.peer, REFUSED_WEIGHTS)
            return False
        learner.count_averages(1)
        return True


# the calls of a kind whose learners link (`GroupKind.calls`: `call(learner, member, links, *args)`)
def open_link(learner, member, links: PassiveLinks, link_id: str, active: str, codec: str = "none",
              interface: str | None = None) -> tuple[str, str, str]:
    """An active partner (at address `active`) opens a link to this learner: `PassiveLinks.open`."""
    return links.open(link_id, active, codec, interface)


def settle(learner, member, links: PassiveLinks) -> None:
    """The job's end, first half, on every learner: the exchanges it started settle."""
    getattr(member, "settle_all", lambda learner: None)(learner)


def wait_answered(learner, member, links: PassiveLinks) -> None:
    """The job's end, second half: the exchanges it serves settle on its side too."""
    links.wait_answered()


def mix(learner, member, links: PassiveLinks, rounds: int) -> int:
    """`rounds` exchanges without gradient steps, each waited for (tests, benchmarks); this
    learner's averages."""
    for _ in range(rounds):
        member.mix(learner)
    return learner.averages


LINK_CALLS = {"open_link": open_link, "settle": settle, "answered": wait_answered, "mix": mix}
LINK_CALL_GROUPS = {"open_link": "links"}  # answered while the learner steps (and while it serves others)
