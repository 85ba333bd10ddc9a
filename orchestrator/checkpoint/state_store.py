"""StateStore: the files of a run's checkpoints that the driver never touches — each learner's
state (`state-<step>-<learner>.pt`, `state-start.pt`) and the averaged model (`model-<step>.pt`)
— written and read by the learners and the evaluator themselves, straight into the run's folder
or its URI (`s3://...`, anything `pyarrow.fs` opens). The driver's checkpoint file
(`checkpoint-<step>.pt`, `files.py`) is a small manifest that names them.

A store is only its root (a string), so it crosses to any process; a URI's filesystem is opened
on first use there. Writes are atomic: a hidden temp file renamed into place in a folder (an
object store's upload is atomic by itself). Reads use `torch.load(weights_only=True)`.

Example:
    >>> store = StateStore("runs/tiny")
    >>> store.write("state-120-3.pt", learner_state)   # -> bytes written
    >>> store.read("state-120-3.pt")["counters"]["step"]
    120
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import torch

STATE_FILE = re.compile(r"^(?:state|model)-(\d+)(?:-\d+)?\.pt$")  # a checkpoint's files, by step
START = "state-start.pt"  # the learners' starting state: where a rollback before any checkpoint goes


def is_store_file(name: str) -> bool:
    """Whether `name` is one of the files learners and the evaluator write (not the driver's)."""
    return bool(STATE_FILE.fullmatch(name)) or name == START  # (`$` would let a trailing newline through)


def checked_name(name) -> str:
    """`name` when it is a store file's (`is_store_file`: a plain name, never a path); else ValueError. The
    names a store reads come from checkpoint manifests, which are files: none may lead outside the root."""
    if not isinstance(name, str) or not is_store_file(name):
        raise ValueError(f"{str(name)[:80]!r} is not the name of a checkpoint's state or model file")
    return name


def state_file(step: int, learner_id: int) -> str:
    return f"state-{int(step)}-{int(learner_id)}.pt"


def model_file(step: int) -> str:
    return f"model-{int(step)}.pt"


class StateStore:
    """The checkpoint files that learners and the evaluator write and read themselves.

    Args: root (a folder, or a URI)."""

    def __init__(self, root: str | Path):
        self.root = str(root)
        self._fs = None

    def __reduce__(self):  # only the root crosses to another process
        return (StateStore, (self.root,))

    @property
    def is_uri(self) -> bool:
        return "://" in self.root

    def _remote(self):
        if self._fs is None:
            import pyarrow.fs

            self._fs, path = pyarrow.fs.FileSystem.from_uri(self.root)
            self._path = path.rstrip("/")
        return self._fs, self._path

    def write(self, name: str, obj) -> int:
        """Save `obj` (tensors and plain data) as `name`; returns its size in bytes."""
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = buffer.getbuffer()
        if self.is_uri:
            fs, path = self._remote()
            with fs.open_output_stream(f"{path}/{name}") as out:
                out.write(data)
            return len(data)
        folder = Path(self.root)
        tmp = folder / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, folder / name)
        finally:
            tmp.unlink(missing_ok=True)
        return len(data)

    def read(self, name: str):
        name = checked_name(name)
        if self.is_uri:
            fs, path = self._remote()
            with fs.open_input_stream(f"{path}/{name}") as src:
                return torch.load(io.BytesIO(src.read()), map_location="cpu", weights_only=True)
        return torch.load(Path(self.root) / name, map_location="cpu", weights_only=True)

    def size(self, name: str) -> int | None:
        """The file's size in bytes, or None when there is no such file."""
        name = checked_name(name)
        if self.is_uri:
            import pyarrow.fs

            fs, path = self._remote()
            info = fs.get_file_info(f"{path}/{name}")
            return info.size if info.type == pyarrow.fs.FileType.File else None
        path = Path(self.root) / name
        return path.stat().st_size if path.is_file() else None

    def names(self) -> list[str]:
        """The checkpoint files the store holds (`state-*`, `model-*`)."""
        if self.is_uri:
            import pyarrow.fs

            fs, path = self._remote()
            infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
            found = [i.base_name for i in infos if i.type == pyarrow.fs.FileType.File]
        else:
            found = [p.name for p in Path(self.root).iterdir()] if Path(self.root).is_dir() else []
        return sorted(n for n in found if is_store_file(n))

    def delete(self, name: str) -> None:
        if self.is_uri:
            fs, path = self._remote()
            try:
                fs.delete_file(f"{path}/{name}")
            except FileNotFoundError:
                pass
            return
        (Path(self.root) / name).unlink(missing_ok=True)

    def prune(self, kept_steps: set[int], newest: int) -> None:
        """Delete the files of checkpoints older than `newest` that are not kept (pruned ones,
        and ones whose manifest was never written). Newer files are a checkpoint in the making."""
        for name in self.names():
            match = STATE_FILE.match(name)
            if match and int(match.group(1)) < newest and int(match.group(1)) not in kept_steps:
                self.delete(name)
