"""Where process groups meet (orchestrator/groups/rendezvous.py), without Ray: a board serves only
calls that carry the job's tag, keeps its bounds, and is called off at once; a gloo group forms
over `RendezvousStore` (its board in this process, reached through a stand-in for the service's
actor handle)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from orchestrator.base.secret import JobSecret
from orchestrator.groups import rendezvous
from orchestrator.groups.rendezvous import Meeting, RendezvousBoards, RendezvousRefused, RendezvousStore

pytestmark = pytest.mark.unit


def _proof(secret, name: str) -> bytes:
    return secret.tag(b"rendezvous", name.encode())


def test_a_board_serves_only_calls_that_carry_the_jobs_tag():
    secret = JobSecret()
    boards = RendezvousBoards(secret)
    with pytest.raises(RendezvousRefused):
        boards.call(_proof(JobSecret(), "g"), "g", "set", "k", b"v")
    with pytest.raises(RendezvousRefused):  # a tag is for one board only
        boards.call(_proof(secret, "other"), "g", "get", "k")
    proof = _proof(secret, "g")
    boards.call(proof, "g", "set", "k", b"v")
    assert boards.call(proof, "g", "get", "k") == b"v"
    assert boards.call(proof, "g", "add", "n", 2) == 2 and boards.call(proof, "g", "add", "n", 3) == 5
    assert boards.call(proof, "g", "check", ["k", "n"]) and not boards.call(proof, "g", "check", ["k", "x"])
    assert boards.call(proof, "g", "compare_set", "k", b"v", b"w") == b"w"
    assert boards.call(proof, "g", "compare_set", "k", b"v", b"z") == b"w"  # expected no longer there
    assert boards.call(proof, "g", "count") == 2
    assert boards.call(proof, "g", "delete", "k") and boards.call(proof, "g", "count") == 1
    started = time.monotonic()
    assert boards.call(proof, "g", "get", "absent") is None  # one short wait, then None: the member asks again
    assert rendezvous.POLL_S * 0.8 <= time.monotonic() - started < 5 * rendezvous.POLL_S


def test_a_board_keeps_its_bounds(monkeypatch):
    monkeypatch.setattr(rendezvous, "MAX_KEYS", 3)
    monkeypatch.setattr(rendezvous, "MAX_BOARDS", 2)
    secret = JobSecret()
    boards = RendezvousBoards(secret)
    proof = _proof(secret, "g")
    with pytest.raises(RendezvousRefused):
        boards.call(proof, "g", "set", "big", b"x" * (rendezvous.MAX_VALUE_BYTES + 1))
    for key in "abc":
        boards.call(proof, "g", "set", key, b"1")
    boards.call(proof, "g", "set", "a", b"2")  # a key that is there may change
    with pytest.raises(RendezvousRefused):
        boards.call(proof, "g", "set", "d", b"1")
    for name in ("h", "i"):  # two more boards: the oldest ("g") is dropped
        boards.call(_proof(secret, name), name, "set", "k", b"1")
    assert boards.call(proof, "g", "count") == 0


def test_a_called_off_board_fails_its_waiting_members_at_once():
    secret = JobSecret()
    boards = RendezvousBoards(secret)
    proof, failed = _proof(secret, "g"), []

    def wait() -> None:
        try:
            boards.call(proof, "g", "get", "never")
        except RendezvousRefused as exc:
            failed.append((time.monotonic(), str(exc)))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    called_off = time.monotonic()
    boards.abort("g", "learner 3 is gone")
    waiter.join(5)
    assert failed and failed[0][0] - called_off < rendezvous.POLL_S and "learner 3 is gone" in failed[0][1]
    with pytest.raises(RendezvousRefused, match="learner 3 is gone"):
        boards.call(proof, "g", "set", "k", b"v")


def test_a_gloo_group_forms_over_the_boards(monkeypatch):
    """Two members (threads) make a gloo group with `RendezvousStore`: its sum is right, and each
    member's `before_publish` ran before its first key reached the board."""
    secret, host = JobSecret(), rendezvous.BoardHost(JobSecret())
    host.boards = RendezvousBoards(secret)
    handle = SimpleNamespace(rendezvous=SimpleNamespace(remote=host.boards.call))  # what Ray would carry
    monkeypatch.setattr(rendezvous.ray, "get", lambda value: value)
    meeting, sums, published = Meeting(handle, "board-1", ["127.0.0.1"] * 2), {}, []

    def member(rank: int) -> None:
        store = RendezvousStore(meeting, secret, 10.0, before_publish=lambda: published.append(rank))
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timedelta(seconds=10)
        group = dist.ProcessGroupGloo(store, rank, 2, options)
        tensor = torch.full((3,), float(rank + 1))
        group.allreduce([tensor]).wait()
        sums[rank] = tensor.tolist()

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sums == {0: [3.0] * 3, 1: [3.0] * 3}
    assert sorted(set(published)) == [0, 1]
    assert host.boards.calls > 0
