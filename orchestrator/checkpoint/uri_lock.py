"""The lock of a run at a URI (`Lease`): one live run per URI, a crashed run's URI free again
within LEASE_S. A folder is locked by `rundir.RunDir` instead (a file lock the kernel drops at
the holder's end); an object store has no such lock, so this one is an object with an owner and
a lease that its holder renews."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from orchestrator.base import strict_json
from orchestrator.checkpoint.uris import StorageError, first_line, redact

LOCK_OBJECT = ".chorus-lock.json"  # the lock at a URI (a dot name: `push` never mirrors nor deletes it)
# How long a URI's lock outlives its holder's last renewal. A run that crashed or lost its node
# frees its URI this long after (a `--resume` waits at most this); a live run renews every
# RENEW_S, so its lease outlasts four failed renewals in a row (an object store unreachable for
# minutes, a paused driver) before another run may take it over.
LEASE_S = 300.0
RENEW_S = LEASE_S / 5
# Between writing a lock and reading it back: two runs that both found no lock and wrote theirs
# (an object store has no create-if-absent that pyarrow.fs offers) learn which write landed last;
# far longer than the round trip between another run's read and its write.
SETTLE_S = 0.25
log = logging.getLogger("chorus.checkpoint")


class Lease:
    """The lock of a run at a URI: the object `.chorus-lock.json`, JSON naming its owner (job,
    pid, host, since when), a random token that tells this run's lock from another's, and when
    its lease expires (`expires`, seconds since the epoch by the writer's clock: the hosts'
    clocks must agree to well within LEASE_S).

    The lease is renewed from a daemon thread every RENEW_S and by every `push` (which also
    checks that the lock is still this run's before it writes): a thread because pushes come only
    with checkpoints, whose interval the spec sets (an epoch may take hours), and the lease must
    stay short for a crashed run's URI to come free soon. A renewal that finds another run's lock
    marks this one lost: its next push raises.

    Object stores offer no create-if-absent through pyarrow.fs, so `acquire` writes its lock,
    waits SETTLE_S and reads it back: of two runs starting at once, the one whose write landed
    last goes on and the other is refused (a run stalled for longer than SETTLE_S between its read
    and its write would still win late; its rival then finds the lock lost at its next renewal).

    Args: fs, root (the URI's path in `fs`), where (the URI as shown), clock (time.time or a test's)."""

    def __init__(self, fs, root: str, where: str, clock: Callable[[], float] = time.time):
        self.fs, self.path, self.where, self.clock = fs, f"{root}/{LOCK_OBJECT}", where, clock
        self.root, self._make_root = root, fs.type_name == "local"  # a folder: made before the lock goes in
        self.held = False
        self.lost: str | None = None  # why this run's lock is no longer its own, once it is not
        self._token = uuid.uuid4().hex
        self._owner: dict = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, job: str | None = None) -> None:
        """Hold the lock, taking over a stale one (saying so); a StorageError naming the holder and
        its lease's end while another run holds it."""
        if self.held:
            return
        found = self._read()
        now = self.clock()
        if found is not None:
            if now < found["expires"]:
                raise StorageError(f"{self.where} is in use by another run ({_describe(found)}): its lease expires at "
                                   f"{_utc(found['expires'])} (in {found['expires'] - now:.0f} s); wait for it to "
                                   "end or pick another --out")
            log.warning("%s: taking over the lock of %s, whose lease expired at %s (%.0f s ago): that run is gone",
                        self.where, _describe(found), _utc(found["expires"]), now - found["expires"])
        self._owner = {"format": "chorus-lock", "token": self._token, "job": job, "pid": os.getpid(),
                       "host": socket.gethostname(), "since": now}
        if self._make_root:
            self.fs.create_dir(self.root, recursive=True)
        self._write()
        time.sleep(SETTLE_S)
        landed = self._read()
        if landed is None or landed.get("token") != self._token:
            raise StorageError(f"{self.where}: another run claimed it at the same moment "
                               f"({_describe(landed) if landed else 'and is gone'}); wait for it to end or pick "
                               "another --out")
        self.held, self.lost = True, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_every, name="chorus-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Push the lease's end LEASE_S on; a StorageError when the lock is no longer this run's."""
        with self._guard:
            if not self.held:
                return
            if self.lost is None:
                found = self._read()
                if found is None or found.get("token") != self._token:
                    self.lost = (f"{self.where}: this run lost its lock (its lease ran out unrenewed) to "
                                 f"{_describe(found) if found else 'nobody'}; it writes nothing more there")
            if self.lost is not None:
                raise StorageError(self.lost)
            self._write()

    def release(self) -> None:
        """Stop renewing and delete the lock, if it is still this run's (a failure to delete is
        logged: the lease then runs out by itself)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        with self._guard:
            if not self.held:
                return
            self.held = False
            try:
                found = self._read()
                if found is not None and found.get("token") == self._token:
                    self.fs.delete_file(self.path)
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: could not delete this run's lock (%s); it lapses within %.0f s",
                            self.where, redact(first_line(exc)), LEASE_S)

    def _renew_every(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self.renew()
            except StorageError as exc:
                log.warning("%s", exc)  # unreachable: tried again in RENEW_S; lost: the next push stops the run
                if self.lost is not None:
                    return

    def _read(self) -> dict | None:
        """The lock the URI holds, or None."""
        import pyarrow.fs

        try:
            if self.fs.get_file_info(self.path).type != pyarrow.fs.FileType.File:
                return None
            with self.fs.open_input_stream(self.path) as src:
                raw = src.read(1 << 16)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{self.where}/{LOCK_OBJECT}: cannot read it ({first_line(exc)})") from None
        try:
            lock = json.loads(raw)
            lock["expires"] = float(lock["expires"])
            if not 0 <= lock["expires"] < 1e11:  # (a year Python's datetime can show)
                raise ValueError
        except (ValueError, TypeError, KeyError):
            raise StorageError(f"{self.where}/{LOCK_OBJECT} is not a Chorus lock: delete it if no run uses "
                               f"{self.where}") from None
        return lock

    def _write(self) -> None:
        expires = self.clock() + LEASE_S
        lock = {**self._owner, "expires": expires, "expires_utc": _utc(expires)}
        try:
            with self.fs.open_output_stream(self.path) as out:
                out.write(strict_json.dumps(lock).encode())
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{self.where}/{LOCK_OBJECT}: cannot write it ({first_line(exc)})") from None


def _describe(lock: dict) -> str:
    """Who holds a lock, in words: "job t-1a2b3c, pid 4242 on node-7 since 2026-11-28 09:00:00 UTC"."""
    since = lock.get("since")
    since = f" since {_utc(since)}" if isinstance(since, int | float) and 0 <= since < 1e11 else ""
    text = f"job {lock.get('job') or '?'}, pid {lock.get('pid', '?')} on {lock.get('host', '?')}{since}"
    return " ".join(text.split())  # one line, whatever the object holds


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
