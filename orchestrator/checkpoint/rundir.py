"""A run's output folder: one live run per folder, and no run replacing another's files unasked.

`RunDir.claim` takes `<folder>/.lock` (an exclusive `fcntl.flock`, held until `release` or the
process's end, with the holder's pid and host written in it), so a second live run into the same
folder is refused with one line naming the holder. A folder that already holds files is refused
too unless the run resumes (`--resume`) or replaces them (`--overwrite`: the files a run writes
are deleted, `is_run_file`; anything else in the folder is left alone — the rule a URI's
`--overwrite` follows too, `storage.py`).

Example:
    >>> run_dir = RunDir("runs/x")
    >>> run_dir.claim(resume=False, overwrite=False)  # RunDirError: runs/x already holds a run (...)
    >>> run_dir.release()
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import fnmatch
import os
import shutil
import socket
from pathlib import Path

LOCK = ".lock"
# what a run's driver writes (TrainingJob: checkpoints, curves, pictures, summary; a sweep trial: trial.json), and the
# temporary files its learners and evaluator leave when they die mid-write (their files: `state_store.is_store_file`)
RUN_FILES = ("checkpoint.pt", "checkpoint-*.pt", "checkpoint-*.pt.corrupt", ".checkpoint*.tmp", "evals.jsonl",
             "evals.superseded.jsonl", "events.jsonl", "summary.json", "trial.json", ".state-*.pt.tmp",
             ".model-*.pt.tmp", "curves.png", ".curves.png.tmp", "tensorboard", "tensorboard/*")


def is_run_file(name: str) -> bool:
    """Whether `name` is a file a run writes into its folder (or its URI): what --overwrite deletes."""
    from orchestrator.checkpoint.state_store import is_store_file  # (torch: loaded once a run's files are looked at)

    return is_store_file(name) or any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_FILES)


class RunDirError(RuntimeError):
    """The folder is in use by another live run, or holds files the run would overwrite."""


class RunDir:
    """A run folder held by one live run at a time (its lock file).

    Args: path (the run's output folder; made when missing)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def claim(self, resume: bool = False, overwrite: bool = False) -> None:
        """Lock the folder for this run and check what it holds (a no-op when already held)."""
        if self.held:
            return
        if resume and overwrite:
            raise RunDirError(f"{self.path}: pass --resume or --overwrite, not both")
        if resume and not self.path.is_dir():
            raise RunDirError(f"{self.path}: no such run folder to resume")
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            held = self.contents()
            if held and not resume:
                if not overwrite:
                    raise RunDirError(f"{self.path} already holds {_what(held)} ({_names(held)}): pass --resume "
                                      "to continue it or --overwrite to replace it")
                self.clear()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unlock (the lock file stays: removing it would let a waiting run lock a file nobody sees)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def contents(self) -> list[str]:
        """The folder's entries, but the lock file, sorted."""
        return sorted(p.name for p in self.path.iterdir() if p.name != LOCK)

    def run_files(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if is_run_file(p.name))

    def clear(self) -> None:
        """Delete the files of the previous run (and nothing else)."""
        for path in self.run_files():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def _lock(self) -> None:
        # os.open's descriptors are not inherited by child processes (PEP 446), so the lock dies
        # with this process, not with the Ray processes it may start
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 400).decode(errors="replace").strip() or "holder unknown"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise RunDirError(f"{self.path / LOCK}: cannot lock ({exc.strerror})") from None
            raise RunDirError(f"{self.path} is in use by another run ({holder}): wait for it to end or "
                              "pick another --out") from None
        os.ftruncate(fd, 0)
        since = datetime.datetime.now().isoformat(" ", "seconds")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)
        self._fd = fd


def _what(names: list[str]) -> str:
    return "a run" if any(n.startswith(("checkpoint", "evals", "events", "summary")) for n in names) else "files"


def _names(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + ("..." if len(names) > shown else "")
