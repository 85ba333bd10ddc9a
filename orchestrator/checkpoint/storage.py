"""Where a run's outputs live: a local (or shared) folder, or a URI — `s3://`, `gs://`,
`file://`, anything `pyarrow.fs` opens, the layer Ray Train's `storage_path` uses.

A run at a URI works in a local staging folder (fresh per run, so it needs nothing of the node
it ran on before) and mirrors it to the URI: `pull()` brings a stopped run's files there before
a resume; `push()` — after every checkpoint and when the run ends, however it ends — uploads
each file that changed and deletes at the URI what the run deleted (older checkpoints), so the
URI holds what a local run folder would. `checkpoint.pt`, a hard link to the newest numbered
checkpoint locally, is not uploaded (it would double the bytes): a resume finds the newest
`checkpoint-<step>.pt` itself. The learners' and the evaluator's checkpoint files
(`state_store.py`) are written straight to the URI by them, and read there: `pull` leaves them.

Example:
    >>> storage = RunStorage("s3://bucket/runs/tiny?endpoint_override=127.0.0.1:9000&scheme=http")
    >>> storage.local  # where the job writes; storage.push() mirrors it to the bucket
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

NOT_MIRRORED = (".lock", "checkpoint.pt")  # the local lock, and the link to the newest checkpoint


class StorageError(RuntimeError):
    """A URI that cannot be opened, read or written; the message is one line naming it."""


def is_uri(out: str | Path) -> bool:
    return "://" in str(out)


class RunStorage:
    """A run's outputs: a local folder, or a URI mirrored from a local staging folder.

    Args: out (a folder, or a URI), staging (the local folder a URI run works in; default: a
    fresh temporary one)."""

    def __init__(self, out: str | Path, staging: Path | None = None):
        self.uri = str(out) if is_uri(out) else None
        self.fs = None
        if self.uri is None:
            self.local = Path(out)
            return
        import pyarrow.fs

        try:
            self.fs, self.root = pyarrow.fs.FileSystem.from_uri(self.uri)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors vary by scheme
            raise StorageError(f"--out {self.uri}: cannot open it ({_first_line(exc)})") from None
        self.root = self.root.rstrip("/")
        self._own_staging = staging is None
        self.local = staging or Path(tempfile.mkdtemp(prefix="chorus-staging-"))
        self._pushed: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) as last uploaded

    @property
    def where(self) -> str:
        """What to tell the user: the URI without its query (which may carry an endpoint), or the folder."""
        return self.uri.split("?", 1)[0] if self.uri else str(self.local)

    def locate(self, name: str) -> str:
        """Where the run's file `name` is kept."""
        return f"{self.where.rstrip('/')}/{name}" if self.uri else str(self.local / name)

    def remote_files(self) -> list[str]:
        """The names of the files the URI holds (none when it does not exist yet)."""
        import pyarrow.fs

        try:
            infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.root, allow_not_found=True))
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"{self.where}: cannot list it ({_first_line(exc)})") from None
        return sorted(i.base_name for i in infos if i.type == pyarrow.fs.FileType.File)

    def check(self, resume: bool, overwrite: bool) -> None:
        """What a URI holds against what the run asks: a new run into one that holds a run needs
        --overwrite (which deletes it), a resume needs a run to resume."""
        if self.uri is None:
            return
        held = self.remote_files()
        if resume and not held:
            raise StorageError(f"{self.where}: no run there to resume")
        if held and not resume:
            if not overwrite:
                raise StorageError(f"{self.where} already holds a run ({', '.join(held[:4])}"
                                   f"{', ...' if len(held) > 4 else ''}): pass --resume to continue it or "
                                   "--overwrite to replace it")
            for name in held:
                self.fs.delete_file(f"{self.root}/{name}")

    def pull(self) -> None:
        """Copy the run's files from the URI into the staging folder (before a resume)."""
        if self.uri is None:
            return
        from orchestrator.checkpoint.state_store import is_store_file

        self.local.mkdir(parents=True, exist_ok=True)
        for name in [n for n in self.remote_files() if not is_store_file(n)]:
            try:
                with self.fs.open_input_stream(f"{self.root}/{name}") as src, open(self.local / name, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
            except Exception as exc:  # noqa: BLE001
                raise StorageError(f"{self.where}/{name}: cannot read it ({_first_line(exc)})") from None
            self._pushed[name] = _stamp(self.local / name)

    def push(self) -> None:
        """Upload each staged file that changed since it was last uploaded; delete at the URI
        the files the run deleted here."""
        if self.uri is None:
            return
        here = {p.name: p for p in self.local.iterdir() if p.is_file() and p.name not in NOT_MIRRORED
                and not p.name.startswith(".")}
        for name, path in sorted(here.items()):
            stamp = _stamp(path)
            if self._pushed.get(name) == stamp:
                continue
            try:
                with open(path, "rb") as src, self.fs.open_output_stream(f"{self.root}/{name}") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
            except Exception as exc:  # noqa: BLE001
                raise StorageError(f"{self.where}/{name}: cannot write it ({_first_line(exc)})") from None
            self._pushed[name] = stamp
        for name in sorted(set(self._pushed) - set(here)):
            try:
                self.fs.delete_file(f"{self.root}/{name}")
            except FileNotFoundError:
                pass
            del self._pushed[name]


    def close(self) -> None:
        """Remove the staging folder this object made (after the last `push`)."""
        if self.uri is not None and self._own_staging:
            shutil.rmtree(self.local, ignore_errors=True)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
