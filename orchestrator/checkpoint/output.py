"""A run's output as its job holds it: where the run works (a folder, or a URI's local staging
folder: `storage.RunStorage`) and the locks that make it the only live run there (`rundir.RunDir`
on the folder, `uri_lock.Lease` at a URI). `claim` takes them (and brings a stopped run's files
from its URI for a resume); `finish` pushes what the run wrote, however it ended; `release` gives
everything back on every exit path (a staging folder only once all it holds reached the URI).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.checkpoint.rundir import RunDir
from orchestrator.checkpoint.storage import RunStorage
from orchestrator.checkpoint.uris import StorageError


class RunOutput:
    """The output of one run.

    Args: out (a folder or a URI), staging (with a URI: the local folder to work in; a folder a
    failed upload kept is resumed from), resume, overwrite (`rundir.py`)."""

    def __init__(self, out: str | Path, staging: Path | None = None, resume: bool = False, overwrite: bool = False):
        self.storage = RunStorage(out, staging)
        self.local, self.resume, self.overwrite = self.storage.local, resume, overwrite
        self.run_dir = RunDir(self.local)

    def claim(self, job_id: str) -> None:
        """Lock the output (a URI: its lock, what it holds, brought here for a resume) and the folder
        the run writes in (`RunDir.claim`); everything taken is given back if a step fails."""
        if self.run_dir.held:
            return
        try:
            self.storage.claim(resume=self.resume, overwrite=self.overwrite, job=job_id)
            if self.resume:
                self.storage.pull()
            self.run_dir.claim(resume=self.resume, overwrite=self.overwrite)
        except BaseException:
            self.release()
            raise

    def finish(self) -> None:
        """What the run wrote reaches its storage, however the run ended; then `release`. A push
        that fails keeps the staging folder and says where, and how to push it (`storage.kept`)."""
        try:
            self.storage.push()
        except StorageError as exc:
            raise self.storage.kept(exc) from None
        finally:
            self.release()

    def release(self) -> None:
        """The folder's lock, the URI's, and the staging folder once all it holds reached the URI."""
        self.run_dir.release()
        self.storage.release()
        self.storage.close()
