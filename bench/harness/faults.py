"""The fault every contender gets, the same way: SIGKILL of a learner's (or Ray Train worker's)
process, and how Ray Train's unnamed workers are found to be killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def sigkill(pid: int) -> None:
    """The one fault every contender gets: SIGKILL of the learner's (or worker's) process."""
    os.kill(pid, signal.SIGKILL)


def train_worker_pids() -> list[int]:
    """Ray Train's worker processes (Ray titles each `ray::<actor class>...`), found through
    /proc so that no dashboard is needed."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and title.startswith(b"ray::") and b"TrainWorker" in title:
            pids.append(int(entry.name))
    return sorted(pids)
