"""Chorus's own channels (orchestrator/groups/channel.py) on this machine's loopback: a connection
carries nothing until both ends proved the job's secret; strangers' connections (wrong proof,
garbage, nothing at all, a flood) are closed, counted by reason and logged once per source, and
cost no lasting descriptor or memory."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

from orchestrator.base.secret import JobSecret
from orchestrator.groups import channel
from orchestrator.groups.channel import ChannelRefused, LinkListener, Refusals, connect, own_listeners

pytestmark = pytest.mark.unit
LINK = b"L" * channel.LINK_ID_BYTES


@pytest.fixture
def served():
    """A listener on 127.0.0.1 expecting link LINK; what connects is echoed back once, then closed."""
    secret, refusals = JobSecret(), Refusals("learner 0")
    listener = LinkListener(secret, "127.0.0.1", refusals)
    connected = threading.Event()

    def echo(chan) -> None:
        data = bytearray(5)
        try:
            chan.recv_into(data)
            chan.send(bytes(data))
            connected.set()
        except OSError:  # a member that connected and left at once
            pass
        finally:
            chan.close()

    listener.expect(LINK, "127.0.0.1", echo)
    yield secret, refusals, listener, connected
    listener.close()


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))





def _until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_members_that_prove_the_secret_exchange_bytes(served):
    secret, refusals, listener, connected = served
    assert listener.address.startswith("127.0.0.1:") and ("127.0.0.1", listener.port) in own_listeners()
    chan = connect(listener.address, secret, LINK, source="127.0.0.1")
    chan.send(b"hello")
    back = bytearray(5)
    chan.recv_into(back)
    assert bytes(back) == b"hello" and connected.wait(5)
    chan.close()
    assert refusals.take() == {}
    with pytest.raises(ConnectionError):  # a link id is used once: the listener closes the connection
        connect(listener.address, secret, LINK)
    assert _until(lambda: refusals.counts == {"a connection from an address no link is expected from": 1}, 5), \
        refusals.counts


def test_a_stranger_without_the_secret_gets_nothing(served, caplog):
    _, refusals, listener, connected = served
    with pytest.raises(ConnectionError):  # the listener closes it
        connect(listener.address, JobSecret(), LINK)
    assert not connected.is_set()
    assert _until(lambda: refusals.counts == {"a connection that did not prove the job's secret": 1}, 5)
    assert [r for r in caplog.records if r.name == "chorus.security"], "the refusal was not logged"
    # and the link stays expected for its member
    chan = connect(listener.address, served[0], LINK)
    chan.send(b"later")
    chan.close()
    assert connected.wait(5)


def test_a_listener_that_cannot_prove_the_secret_is_refused_by_the_member():
    """Something at the partner's address that speaks the protocol but holds no secret (it answers
    the member's proof with bytes of its own): the member refuses it before sending anything."""
    stranger = socket.create_server(("127.0.0.1", 0))  # (a plain socket: the listener checks first)

    def answer() -> None:
        conn, _ = stranger.accept()
        conn.sendall(channel.MAGIC + os.urandom(channel.NONCE_BYTES))
        conn.recv(channel.REQUEST_BYTES)
        conn.sendall(os.urandom(channel.TAG_BYTES))
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(ChannelRefused, match="did not prove"):
            connect(f"127.0.0.1:{stranger.getsockname()[1]}", JobSecret(), LINK)
    finally:
        stranger.close()


def test_garbage_a_flood_and_silence_cost_bounded_descriptors_and_are_logged_once(served, caplog, monkeypatch):
    monkeypatch.setattr(channel, "HANDSHAKE_S", 0.5)
    secret, refusals, listener, _ = served
    host, port = listener.address.rsplit(":", 1)
    before = _descriptors()
    caplog.set_level(logging.WARNING, logger="chorus.security")
    garbage = socket.create_connection((host, int(port)))
    garbage.settimeout(5)
    sent = 0
    with pytest.raises(OSError):  # the listener reads 64 bytes, refuses and closes: the rest is reset
        for _ in range(64):
            garbage.sendall(os.urandom(1 << 20))
            sent += 1 << 20
    garbage.close()
    for _ in range(300):  # a few bytes each, then gone
        s = socket.create_connection((host, int(port)))
        s.send(b"GET / HTTP/1.0\r\n")
        s.close()
    assert _until(lambda: sum(refusals.counts.values()) == 301, 10), refusals.counts
    flood = refusals.take()
    assert flood.pop("a connection that did not prove the job's secret") == 1
    # each closed before its handshake, or (while the listener held MAX_PENDING) was closed at once
    assert set(flood) <= {"a connection closed during its handshake",
                          "a connection beyond the handshakes held at once"} and sum(flood.values()) == 300
    # ... and some that say nothing: as many as one address may hold in handshakes, and one more
    silent = [socket.create_connection((host, int(port))) for _ in range(channel.MAX_PER_SOURCE + 1)]
    assert _until(lambda: refusals.counts == {"a handshake that did not finish in time": channel.MAX_PER_SOURCE,
                                              "a connection beyond the handshakes held at once": 1}, 5), refusals.counts
    for s in silent:
        s.close()
    assert _until(lambda: _descriptors() <= before, 5), (before, _descriptors())
    logged = [r for r in caplog.records if r.name == "chorus.security"]
    assert len(logged) == 1, [r.getMessage() for r in logged]  # one source: one line
    chan = connect(listener.address, secret, LINK)  # and a member still gets through
    chan.close()


def test_handshakes_beyond_the_bound_are_closed_at_once(served, monkeypatch):
    monkeypatch.setattr(channel, "MAX_PENDING", 4)
    _, refusals, listener, _ = served
    host, port = listener.address.rsplit(":", 1)
    held = [socket.create_connection((host, int(port))) for _ in range(4)]
    assert _until(lambda: len(_listener_connections(listener.port)) >= 4, 5)
    extra = socket.create_connection((host, int(port)))
    extra.settimeout(5)
    assert _until(lambda: refusals.counts.get("a connection beyond the handshakes held at once") == 1, 5)
    assert extra.recv(100) == b""  # closed without a hello
    for s in held + [extra]:
        s.close()


def _listener_connections(port: int) -> list[str]:
    rows = open("/proc/self/net/tcp").read().splitlines()[1:]
    return [r for r in rows if int(r.split()[1].split(":")[1], 16) == port and r.split()[3] == "01"]


def test_a_connection_from_an_address_no_link_comes_from_is_closed_as_it_is_accepted(served):
    _, refusals, listener, connected = served
    host, port = listener.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), source_address=("127.0.0.2", 0), timeout=5) as stranger:
        assert stranger.recv(64) == b""  # closed: not even a hello
    assert _until(lambda: refusals.counts == {"a connection from an address no link is expected from": 1}, 5)
    assert not connected.is_set()
