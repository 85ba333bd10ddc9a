"""Chorus's own channels between learners (gossip's links): TCP connections that carry nothing
until both ends have proven they hold the job's secret.

A learner that serves links has one `LinkListener`, bound to its node's address (never a
wildcard address). A connection from an address no expected link comes from (its active partner
announced it through Ray, `links.py`) is closed as it is accepted. Every other connection gets a
hello (a magic and a fresh nonce) and must answer within HANDSHAKE_S with the id of a link this
learner expects, a nonce of its own and the secret's tag over both nonces and the id; the listener
then proves the secret back over the same values. A connection that answers wrongly, too slowly,
for a link nobody expects or not at all is closed, counted by reason and logged once per source
address every LOG_EVERY_S. At most MAX_PENDING handshakes are held at a time, MAX_PER_SOURCE of
them from one address (each costs a descriptor and 64 bytes; one over either bound is closed at
once), so strangers cost bounded memory and descriptors, and the listener's own thread (a
selector, never a training thread) is the only one they reach. Link ids are random, used once and
expire after EXPECT_TTL_S.

What flows over a channel once it is open (raw tensor bytes of sizes both ends know in advance)
is `links.py`'s; nothing read from it is ever unpickled or sized by what the peer says.
"""

from __future__ import annotations

import logging
import secrets
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

MAGIC = b"CHORUS\x01\x00"  # protocol and version
NONCE_BYTES = LINK_ID_BYTES = 16
TAG_BYTES = 32  # HMAC-SHA256
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
REQUEST_BYTES = LINK_ID_BYTES + NONCE_BYTES + TAG_BYTES
HANDSHAKE_S = 3.0  # a member answers a hello in well under a millisecond on a LAN, 2 RTTs on a WAN
MAX_PENDING = 32  # handshakes in progress at once (a learner has at most a few partners opening links) ...
MAX_PER_SOURCE = 8  # ... and from one address (a host's learners: gossip's actives, hierarchical's leaders)
EXPECT_TTL_S = 60.0  # an expected link id not connected by then is forgotten (the active gave up long before)
MAX_EXPECTED = 256  # link ids expected at once (each partner opens one at a time)
LOG_EVERY_S = 60.0  # a refused source is logged once, then again at most this often (every refusal counts)
MAX_SOURCES = 1024  # refused sources remembered for the rate limit (the oldest forgotten first)
ACCEPT_BACKLOG = 64
CHUNK = 4 * 2**20  # bytes per recv call
ACCEPT_PAUSE_S = 0.5  # accepting failed (out of descriptors): the listener rests this long (else it would spin)

log = logging.getLogger("chorus.security")
_OWN: set[tuple[str, int]] = set()  # this process's link listeners' (address, port) (`own_listeners`)


def own_listeners() -> set[tuple[str, int]]:
    """(address, port) of this process's own link listeners (no library's: `guard.ListenerGuard` leaves them)."""
    return set(_OWN)


class ChannelRefused(ConnectionError):
    """The other end of a channel did not prove the job's secret (or spoke another protocol)."""


class Refusals:
    """What a learner refused (connections, messages, tensors), counted by reason until `take`,
    and logged once per source address every LOG_EVERY_S (a flood is one line a minute)."""

    def __init__(self, where: str = "learner"):
        self.where = where
        self.counts: dict[str, int] = {}
        self._logged: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def refuse(self, source: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + 1
            last = self._logged.get(source)
            if last is not None and now - last < LOG_EVERY_S:
                return
            self._logged[source] = now
            self._logged.move_to_end(source)
            while len(self._logged) > MAX_SOURCES:
                self._logged.popitem(last=False)
            # logged under the lock: whoever sees the count sees the line (a test once looked in between)
            log.warning("%s refused %s from %s (refusals from there are counted; the next is logged after %g s)",
                        self.where, reason, source, LOG_EVERY_S)

    def take(self) -> dict[str, int]:
        """The counts since the last call, by reason."""
        with self._lock:
            counts, self.counts = self.counts, {}
        return counts


class Channel:
    """An authenticated connection: exact-size sends and receives of raw bytes."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def send(self, data) -> None:
        self.sock.sendall(data)

    def recv_into(self, buffer) -> None:
        """Fill `buffer` (anything with the buffer protocol) exactly; ConnectionError if the peer
        closes first, TimeoutError after the timeout without a byte."""
        view = memoryview(buffer).cast("B")
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:], min(len(view) - got, CHUNK))
            if n == 0:
                raise ConnectionError(f"{self.peer} closed the channel")
            got += n

    def close(self) -> None:
        """Shut the connection down (a send or receive blocked on it in another thread fails at
        once), then close it. Safe to call twice, from any thread."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def connect(address: str, secret, link_id: bytes, source: str | None = None, timeout: float = 5.0) -> Channel:
    """Open a channel to the listener at `address` ("ip:port") for link `link_id`, from `source`
    (this learner's own address; None: the kernel's choice). Raises ChannelRefused when the
    listener does not prove the secret, OSError when it cannot be reached."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout,
                                    source_address=(source, 0) if source else None)
    try:
        hello = _recv_exact(sock, HELLO_BYTES)
        if not hello.startswith(MAGIC):
            raise ChannelRefused(f"{address} is not a Chorus link listener")
        nonce_s, nonce_c = hello[len(MAGIC):], secrets.token_bytes(NONCE_BYTES)
        sock.sendall(link_id + nonce_c + secret.tag(b"link-client", nonce_s, nonce_c, link_id))
        if not secret.proves(_recv_exact(sock, TAG_BYTES), b"link-server", nonce_c, nonce_s, link_id):
            raise ChannelRefused(f"{address} did not prove the job's secret")
    except BaseException:
        sock.close()
        raise
    return Channel(sock, host)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:  # closed (busy, or not expecting us): unreachable for now, not a stranger's proof
            raise ConnectionError("the listener closed the connection during the handshake")
        data += part
    return data


@dataclass
class _Handshake:
    source: str
    nonce: bytes
    deadline: float
    received: bytearray = field(default_factory=bytearray)


class LinkListener:
    """One learner's listener for the links its partners open (see the module's docstring).

    Args:
    secret: the job's `JobSecret`.
    address: the address to bind (the learner's node address, or its `group.interface`'s).
    refusals: where refused connections are counted and logged (the learner's `Refusals`).
    """

    def __init__(self, secret, address: str, refusals: Refusals):
        if secret is None:
            raise ValueError("a link listener needs the job's secret")
        self.secret, self.refusals = secret, refusals
        self._sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, 0))
        self._own = (address, self._sock.getsockname()[1])
        _OWN.add(self._own)  # before it listens: a guard never mistakes it for a library's
        self._sock.listen(ACCEPT_BACKLOG)
        self._sock.setblocking(False)
        self.address = f"{address}:{self._own[1]}"
        self._expected: OrderedDict[bytes, tuple[float, str, Callable[[Channel], None]]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="chorus-link-listener", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._own[1]

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def expect(self, link_id: bytes, source: str, on_connect: Callable[[Channel], None]) -> None:
        """The next connection from address `source` that proves the secret for `link_id` goes to
        `on_connect` (called in a thread of its own); once, and only within EXPECT_TTL_S."""
        with self._lock:
            self._forget_expired()
            while len(self._expected) >= MAX_EXPECTED:
                self._expected.popitem(last=False)
            self._expected[link_id] = (time.monotonic() + EXPECT_TTL_S, source, on_connect)

    def _expected_sources(self) -> set[str]:
        with self._lock:
            self._forget_expired()
            return {source for _, source, _ in self._expected.values()}

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2.0)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for link_id in [k for k, (until, _, _) in self._expected.items() if until < now]:
            del self._expected[link_id]

    def _run(self) -> None:
        selector = self._selector
        pending: dict[socket.socket, _Handshake] = {}
        resume_at = None  # accepting is paused until then (out of descriptors)
        try:
            while not self._closed.is_set():
                now = time.monotonic()
                if resume_at is not None and now >= resume_at:
                    selector.register(self._sock, selectors.EVENT_READ, None)
                    resume_at = None
                wait = min([h.deadline for h in pending.values()] + [resume_at or now + 0.5, now + 0.5]) - now
                for key, _ in selector.select(timeout=max(0.0, wait)):
                    try:
                        if key.data is None:
                            if not self._accept(selector, pending):
                                selector.unregister(self._sock)
                                resume_at = time.monotonic() + ACCEPT_PAUSE_S
                        else:
                            self._read(selector, pending, key.fileobj)
                    except Exception:  # noqa: BLE001 - one connection's trouble never ends the listener
                        log.exception("%s: the link listener's event failed", self.refusals.where)
                        if key.data is not None and key.fileobj in pending:
                            self._drop(selector, pending, key.fileobj, None)
                now = time.monotonic()
                for conn in [c for c, h in pending.items() if h.deadline <= now]:
                    self._drop(selector, pending, conn, "a handshake that did not finish in time")
        finally:
            for conn in list(pending):
                self._drop(selector, pending, conn, None)
            selector.close()
            _OWN.discard(self._own)
            self._sock.close()

    def _accept(self, selector, pending: dict) -> bool:
        """Accept what waits; False when accepting failed (out of descriptors: pause)."""
        expected = self._expected_sources()
        while True:
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                log.warning("%s: the link listener cannot accept (%s); it rests %g s", self.refusals.where, exc,
                            ACCEPT_PAUSE_S)
                return False
            source = peer[0]
            if source not in expected:
                conn.close()
                self.refusals.refuse(source, "a connection from an address no link is expected from")
                continue
            if len(pending) >= MAX_PENDING or sum(h.source == source for h in pending.values()) >= MAX_PER_SOURCE:
                conn.close()
                self.refusals.refuse(source, "a connection beyond the handshakes held at once")
                continue
            nonce = secrets.token_bytes(NONCE_BYTES)
            try:
                conn.setblocking(False)
                conn.send(MAGIC + nonce)  # 24 bytes: fits any send buffer
            except OSError:
                conn.close()
                continue
            pending[conn] = _Handshake(source, nonce, time.monotonic() + HANDSHAKE_S)
            selector.register(conn, selectors.EVENT_READ, "handshake")

    def _read(self, selector, pending: dict, conn: socket.socket) -> None:
        handshake = pending[conn]
        try:
            data = conn.recv(REQUEST_BYTES - len(handshake.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(selector, pending, conn, "a connection closed during its handshake")
            return
        handshake.received += data
        if len(handshake.received) < REQUEST_BYTES:
            return
        request = bytes(handshake.received)
        link_id, nonce_c, tag = (request[:LINK_ID_BYTES], request[LINK_ID_BYTES:LINK_ID_BYTES + NONCE_BYTES],
                                 request[LINK_ID_BYTES + NONCE_BYTES:])
        if not self.secret.proves(tag, b"link-client", handshake.nonce, nonce_c, link_id):
            self._drop(selector, pending, conn, "a connection that did not prove the job's secret")
            return
        with self._lock:
            self._forget_expired()
            expected = self._expected.get(link_id)
            if expected is not None and expected[1] == handshake.source:
                del self._expected[link_id]
            else:
                expected = None
        if expected is None:
            self._drop(selector, pending, conn, "a link nobody expects (or expected no more)")
            return
        selector.unregister(conn)
        del pending[conn]
        try:
            conn.setblocking(True)
            conn.sendall(self.secret.tag(b"link-server", nonce_c, handshake.nonce, link_id))
        except OSError:
            conn.close()
            return
        threading.Thread(target=expected[2], args=(Channel(conn, handshake.source),),
                         name=f"link-served-{link_id.hex()[:8]}", daemon=True).start()

    def _drop(self, selector, pending: dict, conn: socket.socket, reason: str | None) -> None:
        handshake = pending.pop(conn)
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        if reason is not None:
            self.refusals.refuse(handshake.source, reason)
