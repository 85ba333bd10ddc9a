"""Where the members of a library's process group (gloo, NCCL) meet: a `torch.distributed.Store`
whose keys live in the job's service process and travel over Ray's own channel, not an open
TCPStore. No learner listens for a rendezvous at all.

c10d's TCPStore serves anyone who reaches its port: no authentication, every interface whatever
host it is given, a public "validation" constant (torch's SECURITY.md; vLLM's CVE-2025-47277).
Here a group's keys are a board of the job's `RendezvousBoards` (hosted by `JobService` on a
concurrency group of its own); a member reaches it with the job service's actor handle and a tag
of the job's secret over the board's name (checked on every call), so a process on the cluster
that holds no secret can neither read nor write a key. Each formation of a group meets on a board
of its own (a fresh random name, `Meeting`); boards are bounded in keys, bytes and number, and
the driver aborts a board when a member dies while the others wait on it (they fail at once, not
after RENDEZVOUS_TIMEOUT_S). Measured against a TCPStore on this machine: bench/README.md.

A blocking `get` or `wait` is a loop of short waits on the board (POLL_S each), so a rendezvous
holds none of the service's threads for long.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta

import ray
import torch.distributed as dist

POLL_S = 0.25  # the longest one call waits on the board for a key (then the member asks again)
MAX_BOARDS = 256  # boards kept (the oldest dropped first): a job's groups of the last few formations
MAX_KEYS = 4096  # per board: gloo writes a few keys per member
MAX_VALUE_BYTES = 2**20  # per value: a gloo address is ~100 bytes, an NCCL unique id 128
MAX_BOARD_BYTES = 16 * 2**20  # per board, keys and values


class RendezvousRefused(RuntimeError):
    """A call on a board without the job's tag, or past a board's bounds; or an aborted board."""


@dataclass
class Meeting:
    """Where one formation of a group meets: the job service's handle (`boards`), the board's
    name (random, fresh per formation: also the nonce of the members' proofs to each other,
    `guard.verify_members`), every member's group address (the only addresses the group's
    library listeners admit, `guard.ListenerGuard`) and its node's address (`nodes`: whether
    members on other hosts must reach this one)."""

    boards: object
    name: str
    peers: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


@dataclass
class _Board:
    values: dict[str, bytes] = field(default_factory=dict)
    nbytes: int = 0
    aborted: str | None = None


class RendezvousBoards:
    """The job's boards (in its service process).

    Args: secret: the job's `JobSecret`; a call must carry its tag over the board's name.
    """

    def __init__(self, secret):
        self._secret = secret
        self._boards: OrderedDict[str, _Board] = OrderedDict()
        self._changed = threading.Condition()
        self.calls = 0

    def call(self, proof: bytes, name: str, op: str, *args):
        """One store operation on board `name`: set, get (waits up to POLL_S; None if absent),
        add, check, compare_set, delete, count."""
        if not self._secret.proves(proof, b"rendezvous", name.encode()):
            raise RendezvousRefused(f"board {name}: the call did not carry the job's tag")
        with self._changed:
            self.calls += 1
            board = self._board(name)
            if op == "get":
                self._changed.wait_for(lambda: args[0] in board.values or board.aborted, timeout=POLL_S)
            if board.aborted:
                raise RendezvousRefused(f"the group's rendezvous was called off: {board.aborted}")
            return getattr(self, f"_{op}")(board, *args)

    def abort(self, name: str, reason: str) -> None:
        """Members waiting on board `name` (and any that come later) fail at once with `reason`."""
        with self._changed:
            self._board(name).aborted = reason
            self._changed.notify_all()

    def forget(self, names: list[str]) -> None:
        with self._changed:
            for name in names:
                self._boards.pop(name, None)

    def _board(self, name: str) -> _Board:
        board = self._boards.get(name)
        if board is None:
            board = self._boards[name] = _Board()
            while len(self._boards) > MAX_BOARDS:
                self._boards.popitem(last=False)
        return board

    def _put(self, board: _Board, key: str, value: bytes) -> None:
        old = board.values.get(key)
        grow = len(value) + (len(key) if old is None else -len(old))
        if len(value) > MAX_VALUE_BYTES or board.nbytes + grow > MAX_BOARD_BYTES or \
                (old is None and len(board.values) >= MAX_KEYS):
            raise RendezvousRefused(f"a rendezvous board holds at most {MAX_KEYS} keys and {MAX_BOARD_BYTES} bytes")
        board.values[key], board.nbytes = value, board.nbytes + grow
        self._changed.notify_all()

    def _set(self, board: _Board, key: str, value: bytes) -> None:
        self._put(board, key, bytes(value))

    def _get(self, board: _Board, key: str) -> bytes | None:
        return board.values.get(key)

    def _add(self, board: _Board, key: str, amount: int) -> int:
        total = int(board.values.get(key, b"0")) + int(amount)
        self._put(board, key, str(total).encode())
        return total

    def _check(self, board: _Board, keys: list[str]) -> bool:
        return all(k in board.values for k in keys)

    def _compare_set(self, board: _Board, key: str, expected: bytes, desired: bytes) -> bytes:
        current = board.values.get(key)
        if (current is None and not expected) or current == expected:
            self._put(board, key, bytes(desired))
            return bytes(desired)
        return current if current is not None else bytes(expected)

    def _delete(self, board: _Board, key: str) -> bool:
        value = board.values.pop(key, None)
        if value is not None:
            board.nbytes -= len(key) + len(value)
        return value is not None

    def _count(self, board: _Board) -> int:
        return len(board.values)


class BoardHost:
    """An actor's share in hosting a job's boards (the job's service is one: `JobService`; a
    benchmark may start `BoardActor` of its own). Its calls run on the `rendezvous` threads."""

    CONCURRENCY = {"rendezvous": 16}  # threads: a call holds one for at most POLL_S

    def __init__(self, secret):
        self.boards = RendezvousBoards(secret)

    @ray.method(concurrency_group="rendezvous")
    def rendezvous(self, proof: bytes, name: str, op: str, *args):
        return self.boards.call(proof, name, op, *args)

    @ray.method(concurrency_group="rendezvous")
    def abort_board(self, name: str, why: str) -> None:
        self.boards.abort(name, why)

    @ray.method(concurrency_group="rendezvous")
    def forget_boards(self, names: list[str]) -> None:
        self.boards.forget(names)


BoardActor = ray.remote(concurrency_groups=BoardHost.CONCURRENCY)(BoardHost)


class RendezvousStore(dist.Store):
    """A member's view of its meeting's board, as the `torch.distributed.Store` a process group
    is made with.

    Args:
    meeting: the group's `Meeting`.
    secret: the job's `JobSecret`.
    timeout_s: how long a `get` or `wait` waits for its keys.
    before_publish: called before every `set` reaches the board (`guard.ListenerGuard.apply`:
        the listeners a library opened get their filter before anyone learns their address).
    """

    def __init__(self, meeting: Meeting, secret, timeout_s: float, before_publish=None):
        super().__init__()
        self._boards, self._name, self._timeout_s = meeting.boards, meeting.name, timeout_s
        self._proof = secret.tag(b"rendezvous", meeting.name.encode())
        self._before_publish = before_publish or (lambda: None)

    def _call(self, op: str, *args):
        return ray.get(self._boards.rendezvous.remote(self._proof, self._name, op, *args))

    def set(self, key, value) -> None:
        self._before_publish()
        self._call("set", key, bytes(value))

    def get(self, key) -> bytes:
        deadline = time.monotonic() + self._timeout_s
        while True:
            value = self._call("get", key)
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"rendezvous: no {key!r} after {self._timeout_s:g} s")

    def add(self, key, amount) -> int:
        return self._call("add", key, int(amount))

    def check(self, keys) -> bool:
        return self._call("check", list(keys))

    def wait(self, keys, timeout=None) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else self._timeout_s
        deadline = time.monotonic() + seconds
        for key in keys:
            while self._call("get", key) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rendezvous: no {key!r} after {seconds:g} s")

    def compare_set(self, key, expected, desired) -> bytes:
        self._before_publish()
        return self._call("compare_set", key, bytes(expected), bytes(desired))

    def delete_key(self, key) -> bool:
        return self._call("delete", key)

    def num_keys(self) -> int:
        return self._call("count")
