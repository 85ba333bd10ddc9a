"""Where a run's outputs live: a local (or shared) folder, or a URI — `s3://`, `gs://`,
`file://`, anything `pyarrow.fs` opens, the layer Ray Train's `storage_path` uses.

A run at a URI works in a local staging folder (fresh per run, so it needs nothing of the node
it ran on before) and mirrors it to the URI: `pull()` brings a stopped run's files there before
a resume; `push()` — after every checkpoint and when the run ends, however it ends — uploads
each file that changed (and those of its `tensorboard/` folder) and deletes at the URI what the
run deleted (older checkpoints), so the URI holds what a local run folder would. `checkpoint.pt`,
a hard link to the newest numbered checkpoint locally, is not uploaded (it would double the
bytes): a resume finds the newest `checkpoint-<step>.pt` itself. The learners' and the evaluator's checkpoint files
(`state_store.py`) are written straight to the URI by them, and read there: `pull` leaves them.

What a URI run may not lose, this module keeps:
- one live run per URI: `claim` takes the lock at the URI (`Lease`, the object `.chorus-lock.json`)
  before it looks at what the URI holds, and `release` deletes it;
- `--overwrite` deletes the previous run's own files only (`rundir.is_run_file`, as in a folder);
- a failed upload keeps the staging folder (`close` leaves it, `kept` says where and how to push
  it), and a resume given that folder (`--staging`) takes its files over the URI's older ones;
- nothing shown carries a URI's credentials or query: `redact`, used for every URI and error we show.

Example:
    >>> storage = RunStorage("s3://bucket/runs/tiny?endpoint_override=127.0.0.1:9000&scheme=http")
    >>> storage.claim(resume=False, overwrite=False, job="tiny-1a2b3c")  # the URI's lock, then its contents
    >>> storage.local  # where the job writes; storage.push() mirrors it to the bucket
    >>> storage.release(); storage.close()
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.checkpoint.uri_lock import LOCK_OBJECT, Lease
from orchestrator.checkpoint.uris import StorageError, first_line, is_uri, redact

NOT_MIRRORED = (".lock", "checkpoint.pt")  # the local lock, and the link to the newest checkpoint
MIRRORED_FOLDERS = ("tensorboard",)  # the run's folders whose files are mirrored too (`driver/pictures.py`)
_MIRRORED = re.compile(rf"(?:{'|'.join(MIRRORED_FOLDERS)})/[A-Za-z0-9][A-Za-z0-9._-]*")  # a plain file in one: a
# key a bucket holds never names a path outside the staging folder (`tensorboard/../../x`)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")  # files.py's numbered checkpoints (that module loads torch)


class RunStorage:
    """A run's outputs: a local folder, or a URI mirrored from a local staging folder.

    Args: out (a folder, or a URI), staging (the local folder a URI run works in; default: a
    fresh temporary one, removed by `close`; a folder that holds a run's files, e.g. one a failed
    upload kept, is resumed from), clock (what the URI lock's lease is timed by: time.time, or a
    test's own)."""

    def __init__(self, out: str | Path, staging: Path | None = None, clock: Callable[[], float] = time.time):
        self.uri = str(out) if is_uri(out) else None
        self.fs = None
        self.synced = True  # every file staged here reached the URI (False from a push's start to its end)
        if self.uri is None:
            self.local = Path(out)
            return
        import pyarrow.fs

        try:
            self.fs, self.root = pyarrow.fs.FileSystem.from_uri(self.uri)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors vary by scheme
            raise StorageError(f"--out {self.where}: cannot open it ({first_line(exc)})") from None
        self.root = self.root.rstrip("/")
        self._own_staging = staging is None
        self.local = Path(staging) if staging is not None else Path(tempfile.mkdtemp(prefix="chorus-staging-"))
        self._pushed: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) as last uploaded
        self.lease = Lease(self.fs, self.root, self.where, clock)

    @property
    def where(self) -> str:
        """What to tell the user: the URI without credentials or query (`redact`), or the folder."""
        return redact(self.uri) if self.uri else str(self.local)

    def locate(self, name: str) -> str:
        """Where the run's file `name` is kept."""
        return f"{self.where.rstrip('/')}/{name}" if self.uri else str(self.local / name)

    def remote_files(self) -> list[str]:
        """The names of the files the URI holds (none when it does not exist yet), its lock aside."""
        import pyarrow.fs

        try:
            infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.root, allow_not_found=True, recursive=True))
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{self.where}: cannot list it ({first_line(exc)})") from None
        names = [i.path[len(self.root):].lstrip("/") for i in infos if i.type == pyarrow.fs.FileType.File]
        return sorted(n for n in names if n != LOCK_OBJECT and ("/" not in n or _MIRRORED.fullmatch(n)))

    def claim(self, resume: bool, overwrite: bool, job: str | None = None) -> None:
        """Take the URI's lock for the run `job` (`Lease.acquire`), then check what the URI holds
        against what the run asks: a new run into one that holds files needs --overwrite (which
        deletes the previous run's files, and only those), a resume needs a run to resume (at the
        URI, or in a staging folder given). A no-op for a folder (`RunDir` locks it)."""
        if self.uri is None:
            return
        from orchestrator.checkpoint.rundir import is_run_file

        self.lease.acquire(job)
        try:
            held = self.remote_files()
            if resume and not held and not self._staged():
                raise StorageError(f"{self.where}: no run there to resume")
            if held and not resume:
                if not overwrite:
                    raise StorageError(f"{self.where} already holds a run ({', '.join(held[:4])}"
                                       f"{', ...' if len(held) > 4 else ''}): pass --resume to continue it or "
                                       "--overwrite to replace it")
                for name in filter(is_run_file, held):
                    self._delete(name)
        except BaseException:
            self.lease.release()
            raise

    def release(self) -> None:
        """Delete the URI's lock (when this run still holds it)."""
        if self.uri is not None:
            self.lease.release()

    def pull(self) -> None:
        """Before a resume: copy the run's files from the URI into the staging folder — unless the
        staging folder holds a run already (one a failed upload kept: `_adopt`)."""
        if self.uri is None:
            return
        from orchestrator.checkpoint.state_store import is_store_file

        self.local.mkdir(parents=True, exist_ok=True)
        remote = self.remote_files()
        if self._staged():
            self._adopt(remote)
            return
        for name in [n for n in remote if not is_store_file(n)]:
            try:
                (self.local / name).parent.mkdir(exist_ok=True)
                with self.fs.open_input_stream(f"{self.root}/{name}") as src, open(self.local / name, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
            except Exception as exc:  # noqa: BLE001
                raise StorageError(f"{self.where}/{name}: cannot read it ({first_line(exc)})") from None
            self._pushed[name] = _stamp(self.local / name)

    def push(self) -> None:
        """Upload each staged file that changed since it was last uploaded; delete at the URI
        the files the run deleted here. First the lock is renewed: a run that lost it (its lease
        ran out and another run took the URI) raises instead of writing over the other's files."""
        if self.uri is None:
            return
        self.synced = False
        self.lease.renew()
        here = {p.name: p for p in self.local.iterdir() if p.is_file() and p.name not in NOT_MIRRORED
                and not p.name.startswith(".")}
        here |= {f"{folder}/{p.name}": p for folder in MIRRORED_FOLDERS if (self.local / folder).is_dir()
                 for p in (self.local / folder).iterdir() if p.is_file() and not p.name.startswith(".")}
        for name, path in sorted(here.items()):
            stamp = _stamp(path)
            if self._pushed.get(name) == stamp:
                continue
            try:
                with open(path, "rb") as src, self.fs.open_output_stream(f"{self.root}/{name}") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
            except Exception as exc:  # noqa: BLE001
                raise StorageError(f"{self.where}/{name}: cannot write it ({first_line(exc)})") from None
            self._pushed[name] = stamp
        for name in sorted(set(self._pushed) - set(here)):
            self._delete(name)
            del self._pushed[name]
        self.synced = True

    def kept(self, error: Exception) -> StorageError:
        """The error of a run whose last push failed (`error`): one line saying where the run's
        files are now and how to push them (`close` keeps the staging folder)."""
        folder = shlex.quote(str(self.local))
        return StorageError(f"{redact(str(error))}; the run's newest files are kept in {self.local}: run the same "
                            f"command with --resume --staging {folder} (not --overwrite) to upload them and go on "
                            "to its budget")

    def close(self) -> None:
        """Remove the staging folder this object made, once everything in it reached the URI;
        after a failed push it stays, the only copy of the run's newest files (`kept`)."""
        if self.uri is not None and self._own_staging and self.synced:
            shutil.rmtree(self.local, ignore_errors=True)

    def _staged(self) -> bool:
        """Whether the staging folder holds a run's files."""
        from orchestrator.checkpoint.rundir import is_run_file

        return self.local.is_dir() and any(is_run_file(p.name) for p in self.local.iterdir())

    def _adopt(self, remote: list[str]) -> None:
        """Resume from a staging folder that holds the run (a failed upload kept it): its files
        are newer than the URI's, so none is pulled; the next push uploads them all and deletes
        at the URI the run's files the folder no longer has (checkpoints it pruned). A folder older
        than the URI (whose newest checkpoint the URI has passed) is refused."""
        from orchestrator.checkpoint.rundir import is_run_file
        from orchestrator.checkpoint.state_store import is_store_file

        here, there = _newest_step(os.listdir(self.local)), _newest_step(remote)
        if there > here:
            raise StorageError(f"{self.local} is older than {self.where} (newest checkpoint: step {here} against "
                               f"{there}): resume from the URI alone, without --staging")
        self._pushed.update({n: (-1, -1) for n in remote if is_run_file(n) and not is_store_file(n)})

    def _delete(self, name: str) -> None:
        try:
            self.fs.delete_file(f"{self.root}/{name}")
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{self.where}/{name}: cannot delete it ({first_line(exc)})") from None


def _newest_step(names: list[str]) -> int:
    """The step of the newest numbered checkpoint among `names` (-1: none)."""
    return max((int(m.group(1)) for n in names if (m := _CHECKPOINT.match(n))), default=-1)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns
