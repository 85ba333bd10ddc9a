"""Fuzzing the reader of features folders (`jobs.data.feature_shards.FeatureShards`): an index of any
JSON (damaged, or with rows of any fields) over shard files of any size. Own errors: `DataError`
for an index that is none (one line naming it), `AudioError` for an utterance its shard cannot
give (skipped by the corpus). A row that is malformed or longer than its duration allows is left
out and counted; what is read has the index's shape and comes from within its shard."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.data.feature_shards import INDEX, FeatureShards
from jobs.data.manifests import AudioError, DataError
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input

pytestmark = pytest.mark.unit

ROW = {"id": "u0", "text": "go", "duration": 0.3, "shard": 0, "offset": 0, "frames": 31}
NUMBERS = st.integers(-5, 2**70) | st.floats() | JSON_VALUES
ROWS = st.fixed_dictionaries({}, optional={"id": st.text(max_size=6) | JSON_VALUES, "text": st.text(max_size=6),
                                           "duration": NUMBERS, "shard": NUMBERS, "offset": NUMBERS, "frames": NUMBERS})


@st.composite
def folders(draw) -> tuple[bytes, list[int]]:
    """(the index's bytes, the sizes of shard-00000.bin, shard-00001.bin)."""
    rows = draw(st.lists(st.builds(lambda changes: {**ROW, **changes}, ROWS) | JSON_VALUES, max_size=5))
    index = {"version": draw(st.sampled_from([1, 1, 1, 2, "1"])), "num_mel_bins": draw(st.sampled_from([8, 8, 0, -1])
                                                                                        | JSON_VALUES),
             "utterances": draw(st.just(rows) | JSON_VALUES), "skipped": draw(st.just([]) | JSON_VALUES)}
    raw = json.dumps(index).encode()
    return draw(st.just(raw) | edited(raw, 3)), draw(st.lists(st.integers(0, 4096), min_size=2, max_size=2))


@fuzzed(100)
@given(folder=folders(), num_mel_bins=st.sampled_from([None, 8]), max_seconds=st.sampled_from([math.inf, 1.0]))
@example(folder=(json.dumps({"version": 1, "num_mel_bins": 8, "utterances": [{**ROW, "offset": 2**70}]}).encode(),
                 [4096, 0]), num_mel_bins=8, max_seconds=math.inf)  # was an OverflowError from seek
@example(folder=(json.dumps({"version": 1, "num_mel_bins": 8, "utterances": [{"id": "u"}]}).encode(), [0, 0]),
         num_mel_bins=8, max_seconds=1.0)  # a row without its fields: was a KeyError
@example(folder=(json.dumps({"version": 1, "num_mel_bins": -8, "utterances": [ROW]}).encode(), [4096, 0]),
         num_mel_bins=None, max_seconds=1.0)  # negative channels: was a read of the whole shard and a bad view
@example(folder=(b'{"version": 1, "num_mel_bins": 8, "utterances": [null], "skipped": []}', [0, 0]),
         num_mel_bins=None, max_seconds=math.inf)  # was a TypeError
def test_a_features_folder_reads_what_its_shards_hold_or_refuses_in_one_line(tmp_path, folder, num_mel_bins,
                                                                              max_seconds):
    index, sizes = folder
    with Sandbox(tmp_path) as box:
        (box.run / INDEX).write_bytes(index)
        for i, size in enumerate(sizes):
            (box.run / f"shard-{i:05d}.bin").write_bytes(b"\x00\x3c" * (size // 2))  # float16 ones
        with one_input(DataError, starts=f"{box.run / INDEX}: "):
            shards = FeatureShards(box.run, num_mel_bins, max_seconds)
            for i, utt in enumerate(shards.utterances):
                assert utt.duration <= max_seconds and utt.path.parent == box.run
                with one_input(AudioError):
                    frames = shards.read(i)
                    assert frames.shape[1] == shards.num_mel_bins and bool(frames.isfinite().all())
