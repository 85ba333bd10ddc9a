"""The job checkpoint format and its files: how a checkpoint is written, kept, found and loaded.

A run folder holds the newest `keep` (default 2) checkpoints as `checkpoint-<step>.pt`, and
`checkpoint.pt`: the stable name that `chorus eval`, the summary and the sweep point at, a hard
link to the newest (a copy where the filesystem has no hard links).

Writing is atomic and durable: `torch.save` into a hidden temp file in the same folder, flush and
fsync it, `os.replace` it to `checkpoint-<step>.pt`, link `checkpoint.pt` to it the same way,
fsync the folder, then delete the older checkpoints beyond `keep`. A crash or a full disk at any
point leaves the previous checkpoints whole, and no temp file behind.

Format 2: a job's checkpoint file is a small manifest; its learners' states and its averaged
model are files beside it (`state-<step>-<learner>.pt`, `model-<step>.pt`, written by the
learners and the evaluator: `state_store.py`), named in it with their sizes. A checkpoint is
usable only when every file it names is there at that size. `load` (what `chorus eval` and
readers use) returns the states resolved, as format 1 held them inline; `load_latest` and
`resume_from` return the manifest (a resumed job's learners read their own files).

Loading always uses `torch.load(..., weights_only=True)`: a checkpoint holds only dicts, lists,
tuples, strings, numbers, booleans, None and tensors, so a file can never run code. What is
loaded is verified (the format `version`, the expected keys, the files it names, finite weights). `load_latest` tries
the newest checkpoint first; one that is truncated or corrupt is named in one logged line and the
one before it is used. When none is usable, `CheckpointError` says why in one line.

Example:
    >>> save("runs/x", {"spec": spec, "model": model.state_dict(), ...}, step=120)
    PosixPath('runs/x/checkpoint-120.pt')
    >>> load_latest("runs/x").state["spec"]["name"]
    'x'
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from orchestrator.checkpoint.state_store import StateStore, is_store_file

log = logging.getLogger("chorus.checkpoint")

FORMAT_VERSION = 2
READS = (1, 2)  # format 1: states inline
LATEST = "checkpoint.pt"
KEEP = 2
KEYS = ("version", "spec", "model", "learners", "learner_ids", "planner", "job")
SHAPES = {"spec": dict, "model": dict, "learners": list, "learner_ids": list, "planner": dict | None, "job": dict}
_NUMBERED = re.compile(r"^checkpoint-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message is one line naming the file."""


@dataclass
class Loaded:
    """A verified checkpoint: its state, the file it came from, and one line for each newer file
    that was unusable (and why)."""

    state: dict
    path: Path
    skipped: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# -- writing ------------------------------------------------------------------------------------
def save(folder: str | Path, state: dict, step: int, keep: int = KEEP) -> Path:
    """Write `state` (plus the format version) as `folder/checkpoint-<step>.pt`, point
    `checkpoint.pt` at it and keep only the newest `keep` checkpoints; returns its path."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    folder = Path(folder)
    path = folder / f"checkpoint-{int(step)}.pt"
    tmp = folder / f".{path.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "version": FORMAT_VERSION}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _point_latest(folder, path)
        _fsync_dir(folder)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError | RuntimeError):  # torch reports a full disk as a RuntimeError
            reason = _full(folder) or (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                       else _first_line(exc))
            raise CheckpointError(f"{path}: could not be written ({reason}); the previous checkpoints "
                                  "are kept") from None
        raise
    _prune(folder, keep)
    return path


def _full(folder: Path) -> str | None:
    """'no space left on device (...)' when the folder's filesystem cannot hold another checkpoint
    the size of the newest (torch's own error for a full disk names no cause)."""
    free = shutil.disk_usage(folder).free
    newest = numbered(folder)
    needed = newest[0].stat().st_size if newest else 1 << 20
    if free >= needed:
        return None
    return f"no space left on device: {free / 1e6:.1f} MB free, a checkpoint takes {needed / 1e6:.1f} MB"


def _point_latest(folder: Path, path: Path) -> None:
    """Make `checkpoint.pt` the newest checkpoint, atomically (readers see the old or the new one)."""
    tmp = folder / f".{LATEST}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # a filesystem without hard links: a copy, fsynced like the checkpoint
        shutil.copyfile(path, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, folder / LATEST)


def _fsync_dir(folder: Path) -> None:
    """Make the renames in `folder` durable (a rename lives in the directory, not in the file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(folder: Path, keep: int) -> None:
    """Delete the checkpoints beyond the newest `keep`, and temp files of writes that were killed."""
    for old in numbered(folder)[keep:] + list(folder.glob(".checkpoint*.tmp")):
        old.unlink(missing_ok=True)


# -- finding and loading --------------------------------------------------------------------------
def numbered(folder: str | Path) -> list[Path]:
    """The folder's `checkpoint-<step>.pt` files, newest (highest step) first."""
    found = [(int(m.group(1)), p) for p in Path(folder).glob("checkpoint-*.pt") if (m := _NUMBERED.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def candidates(folder: str | Path) -> list[Path]:
    """What `load_latest` tries, in order: the numbered checkpoints newest first, then
    `checkpoint.pt` when it is a file of its own (a copy, or a folder written before
    checkpoints were numbered)."""
    folder = Path(folder)
    found = numbered(folder)
    latest = folder / LATEST
    if latest.is_file() and not any(os.path.samefile(latest, p) for p in found):
        found.append(latest)
    return found


def load_file(path: str | Path, store: StateStore | None = None) -> dict:
    """Load and verify one checkpoint file (and that the files it names are in `store`, by
    default its own folder); `CheckpointError` (one line) when it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the file is, the answer is one line
        raise CheckpointError(f"{path}: {_load_failure(exc)}") from None
    _verify(path, state)
    _verify_files(path, state, store or StateStore(path.parent.resolve()))
    return state


def load_latest(folder: str | Path, store: StateStore | None = None) -> Loaded:
    """The newest usable checkpoint of a run folder; each newer one that is unusable is logged
    in one line. `CheckpointError` when there is none, or none is usable."""
    folder = Path(folder)
    found = candidates(folder)
    if not found:
        raise CheckpointError(f"{folder}: no checkpoint to resume from (no {LATEST} or checkpoint-<step>.pt)")
    skipped, problems = [], []
    for path in found:
        try:
            state = load_file(path, store)
        except CheckpointError as exc:
            skipped.append(path)
            problems.append(str(exc))
            continue
        for problem in problems:
            log.warning("%s; falling back to %s", problem, path.name)
        return Loaded(state, path, skipped, problems)
    raise CheckpointError(f"{folder}: no usable checkpoint: {'; '.join(problems)}")


def load(path: str | Path) -> Loaded:
    """A run folder or `checkpoint.pt` in one: its newest usable checkpoint (`load_latest`); any
    other file: that file only. With the states it names read in (`resolve`)."""
    path = Path(path)
    if path.is_dir() or path.name == LATEST:
        loaded = load_latest(path if path.is_dir() else path.parent)
    else:
        loaded = Loaded(load_file(path), path)
    loaded.state = resolve(loaded.state, StateStore(loaded.path.parent.resolve()))
    return loaded


def resolve(state: dict, store: StateStore) -> dict:
    """A checkpoint with the files it names read in: each learner's whole state (with its own
    counters) and the averaged model's state_dict, as format 1 held them, with what the workload
    saved beside that state_dict (a tokenizer) as keys of the checkpoint's own."""
    def read(entry: dict, needs: str = "") -> dict:
        if "file" not in entry:
            return entry
        try:
            found = store.read(entry["file"])
        except Exception as exc:  # noqa: BLE001 - one line naming the file
            raise CheckpointError(f"{store.root}/{entry['file']}: {_load_failure(exc)}") from None
        if not isinstance(found, dict) or needs and not isinstance(found.get(needs), dict):
            raise CheckpointError(f"{store.root}/{entry['file']}: corrupt (not the state Chorus writes there)")
        return found

    learners = [{**read(e), "counters": e["counters"]} if "file" in e else e for e in state["learners"]]
    resolved = {**state, "learners": learners}
    if "file" in state["model"]:
        averaged = read(state["model"], needs="model")
        resolved["model"] = averaged["model"]
        resolved.update({k: v for k, v in averaged.items() if k not in resolved})  # the workload's parts (a tokenizer)
    return resolved


def resume_from(folder: str | Path, store: StateStore | None = None) -> Loaded:
    """`load_latest` for a run that goes on from it: newer files that were unusable are set aside
    as `<name>.corrupt` (so they are neither loaded nor kept as the newest again) and
    `checkpoint.pt` points at the checkpoint loaded."""
    loaded = load_latest(folder, store)
    for path in loaded.skipped:
        if path.name != LATEST:
            os.replace(path, path.with_name(path.name + ".corrupt"))
    if loaded.skipped and loaded.path.name != LATEST:
        _point_latest(Path(folder), loaded.path)
        _fsync_dir(Path(folder))
    return loaded


# -- verification ---------------------------------------------------------------------------------
def finite(tensors: dict) -> bool:
    """Whether every floating-point tensor of a state dict is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _verify(path: Path, state) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a Chorus checkpoint (a {type(state).__name__}, not a dict)")
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a Chorus checkpoint of format {FORMAT_VERSION} "
                              f"(no {', '.join(missing)})")
    if type(state["version"]) is not int or state["version"] not in READS:
        raise CheckpointError(f"{path}: format version {_shown(state['version'])}; this Chorus reads "
                              f"{', '.join(map(str, READS))}")
    wrong = [key for key, kind in SHAPES.items() if not isinstance(state[key], kind)]
    if wrong:
        raise CheckpointError(f"{path}: corrupt (its {', '.join(wrong)} not what Chorus writes)")
    learners, ids = state["learners"], state["learner_ids"]
    if len(learners) != len(ids) or not learners or not all(isinstance(e, dict) for e in learners) \
            or not all(type(i) is int for i in ids):
        raise CheckpointError(f"{path}: corrupt (learners and learner_ids do not match)")
    if "file" not in state["model"] and not finite(state["model"]):
        raise CheckpointError(f"{path}: corrupt (its model has non-finite weights)")


def _verify_files(path: Path, state: dict, store: StateStore) -> None:
    """Every file a format-2 checkpoint names is one of its run's files (a name, never a path: a
    name that would lead elsewhere refuses the checkpoint), in the store at the size it was written."""
    entries = [e for e in [state["model"], *state["learners"]] if "file" in e]
    for entry in entries:
        name = entry["file"]
        if not isinstance(name, str) or not is_store_file(name):
            raise CheckpointError(f"{path}: refused: it names {_shown(name)}, which is not a state or model file "
                                  "of its run")
        if type(entry.get("bytes")) is not int or entry is not state["model"] and \
                not isinstance(entry.get("counters"), dict):
            raise CheckpointError(f"{path}: corrupt (the entry of {name} has no size or no counters)")
        size = store.size(name)
        if size != entry["bytes"]:
            found = "missing" if size is None else f"{size} bytes, not {entry['bytes']}"
            raise CheckpointError(f"{path}: unusable: the file it names, {name}, is {found}")


def _shown(value) -> str:
    """A value read from a checkpoint, as one short line (its repr if it is a string or a number)."""
    if isinstance(value, str | int | float) or value is None:
        return repr(value)[:80]
    return f"a {type(value).__name__}"


def _load_failure(exc: Exception) -> str:
    """torch.load's error in a few words (its weights_only errors are paragraphs)."""
    text = str(exc)
    banned = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if banned:
        return (f"refused: it holds {_escaped(banned.group(1))}, not only tensors and plain data (checkpoints load "
                "with weights_only=True)")
    unpickler = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    return f"truncated or corrupt ({_escaped(unpickler.group(1).strip()) if unpickler else _first_line(exc)})"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return _escaped(text[0] if text else type(exc).__name__)


def _escaped(line: str) -> str:
    """`line` with what would garble a terminal escaped: torch's messages quote a damaged file's bytes."""
    return line if line.isprintable() else repr(line)[1:-1]
