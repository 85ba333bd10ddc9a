"""Fuzzing the reader of checkpoints (`orchestrator.checkpoint.files`: `load_file`, `load` with the
files a manifest names read in, `resume_from`), whose manifests name the run's state and model
files: manifests of any structure, names that lead anywhere (`../`, absolute, a trailing newline),
and files that are not checkpoints at all. Own error: `CheckpointError`, one line beginning with
the run's folder (naming the file). Nothing outside the run is read or written: a file beside the
run that a name could reach is never loaded."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.checkpoint import files
from orchestrator.checkpoint.files import CheckpointError
from orchestrator.checkpoint.state_store import StateStore
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input

pytestmark = pytest.mark.unit

NAMES = st.sampled_from(["model-8.pt", "state-8-0.pt", "state-start.pt", "../beside.pt", "../../beside.pt",
                         "/etc/hostname", "model-8.pt\n", "sub/model-8.pt", "", ".", "checkpoint-8.pt"]) \
    | st.text(max_size=10) | st.integers()
VALUES = JSON_VALUES | NAMES | st.just(torch.ones(2)) | st.just(torch.tensor([float("nan")]))


def _manifest() -> dict:
    return {"version": 2, "spec": {"name": "t"}, "model": {"file": "model-8.pt", "bytes": 0},
            "learners": [{"file": "state-8-0.pt", "bytes": 0, "counters": {"step": 8}}], "learner_ids": [0],
            "planner": None, "job": {"wall_s": 1.0, "evals": []}}


def _saved(obj) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


PATHS = [("version",), ("spec",), ("model",), ("model", "file"), ("model", "bytes"), ("learners",),
         ("learners", 0), ("learners", 0, "file"), ("learners", 0, "bytes"), ("learners", 0, "counters"),
         ("learner_ids",), ("learner_ids", 0), ("planner",), ("job",)]


@st.composite
def manifests(draw) -> dict:
    manifest = _manifest()
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=3)):
        node = manifest
        for key in path[:-1]:
            node = node[key] if isinstance(node, dict | list) and _has(node, key) else None
            if node is None:
                break
        if isinstance(node, dict | list) and _has(node, path[-1]) or isinstance(node, dict):
            node[path[-1]] = draw(VALUES)
    return manifest


def _has(node, key) -> bool:
    return key in node if isinstance(node, dict) else isinstance(key, int) and -len(node) <= key < len(node)


@fuzzed(80)
@given(manifest=manifests(), damage=st.none() | st.integers(0, 10_000))
@example(manifest={**_manifest(), "learners": [{"file": "../beside.pt", "bytes": 0, "counters": {}}]},
         damage=None)  # the name became a path: the file beside the run was read
@example(manifest={**_manifest(), "model": {"file": "model-8.pt\n", "bytes": 0}}, damage=None)
@example(manifest={**_manifest(), "learner_ids": None}, damage=None)  # was a TypeError from len()
@example(manifest={**_manifest(), "model": {"file": None, "bytes": 0}}, damage=None)  # was a TypeError (Path / None)
@example(manifest={**_manifest(), "version": torch.ones(2)}, damage=None)  # was "Boolean value of Tensor ... ambiguous"
@example(manifest={**_manifest(), "model": {"file": "model-8.pt", "bytes": torch.ones(2)}}, damage=None)
def test_a_checkpoint_loads_from_its_run_or_is_refused_in_one_line(tmp_path, manifest, damage):
    with Sandbox(tmp_path) as box:
        torch.save({"model": {"w": torch.full((2,), 7.0)}}, box.root / "beside.pt")  # what no name may reach
        store = StateStore(box.run)
        sizes = {name: store.write(name, {"model": {"w": torch.ones(2)}, "counters": {"step": 8}})
                 for name in ("model-8.pt", "state-8-0.pt")}
        learners = manifest["learners"] if isinstance(manifest.get("learners"), list) else []
        for entry in [manifest.get("model"), *learners]:  # the sizes of the files it names rightly
            if isinstance(entry, dict) and isinstance(entry.get("file"), str) and type(entry.get("bytes")) is int \
                    and entry["bytes"] == 0 and entry["file"] in sizes:
                entry["bytes"] = sizes[entry["file"]]
        data = _saved(manifest)
        (box.run / "checkpoint-8.pt").write_bytes(data if damage is None else data[:damage])
        with one_input(CheckpointError, starts=f"{box.run}"):
            loaded = files.load(box.run / "checkpoint-8.pt")
            assert all(isinstance(e, dict) for e in loaded.state["learners"])
            assert not any(torch.equal(t, torch.full((2,), 7.0)) for t in _tensors(loaded.state))
        with one_input(CheckpointError, starts=f"{box.run}"):
            files.resume_from(box.run)
        (box.root / "beside.pt").unlink()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors(item)


@fuzzed(60)
@given(data=edited(_saved(_manifest()), 4) | st.binary(max_size=300))
@example(data=_saved(_manifest()).replace(b"little", b"littl\x7f"))  # torch quoted the byte: a control character
def test_a_file_that_is_no_checkpoint_is_refused_in_one_line(tmp_path, data):
    with Sandbox(tmp_path) as box, one_input(CheckpointError, starts=f"{box.run / 'checkpoint-8.pt'}: "):
        (box.run / "checkpoint-8.pt").write_bytes(data)
        files.load_file(box.run / "checkpoint-8.pt")
