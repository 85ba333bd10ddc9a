"""Precomputed features (jobs/data/feature_shards.py, `chorus features`): a features folder reads as the
corpus it was made from (same utterances, texts and durations, the same filterbanks to float16's
precision, the same batches); a spec whose mel bins differ, a shard cut short, an unfinished
folder and test-time warps (which need audio) each give one line naming the file (the utterance,
the split); malformed index entries are skipped and counted, and nothing is read past a shard."""

from __future__ import annotations

import json

import pytest
import torch

from jobs.data.feature_shards import INDEX, FeatureShards, is_features_folder, write_shards
from jobs.data.manifests import LONGER_THAN_STATED, MALFORMED_ENTRY, AudioError, DataError
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from tests.builders import run_cli
from tests.jobs.data.hostile import audio_bytes

pytestmark = pytest.mark.unit


def _workload(source, mel_bins: int = 80) -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": source, "max_batch_seconds": 10, "prefetch_batches": 0},
                                      features={"num_mel_bins": mel_bins}), seed=0)


def test_a_features_folder_reads_as_the_corpus_it_was_made_from(corpus, tmp_path):
    summary = write_shards(corpus / "dev.jsonl", tmp_path / "dev", num_mel_bins=80, shard_mb=0.2)
    assert summary["utterances"] == 20 and summary["skipped"] == 0 and summary["shards"] >= 2, summary
    audio, shards = _workload(corpus / "dev.jsonl"), _workload(tmp_path / "dev")
    from_audio, from_shards = audio.train, shards.train
    assert from_shards.shards is not None and from_audio.shards is None
    assert [(u.id, u.text, u.duration) for u in from_shards.utterances] == \
        [(u.id, u.text, u.duration) for u in from_audio.utterances]
    for i in range(len(from_audio)):
        expected, got = from_audio.features(i), from_shards.features(i)
        assert got.dtype == torch.float32 and got.shape == expected.shape
        assert torch.allclose(got, expected, atol=0.01, rtol=0.001)  # float16 on disk
    expected = list(audio.batches(0, 1, 0))
    got = list(shards.batches(0, 1, 0))
    assert [b.ids for b in got] == [b.ids for b in expected] and len(got) > 1


def test_mel_bins_other_than_the_specs_are_refused_in_one_line(corpus, tmp_path):
    write_shards(corpus / "dev.jsonl", tmp_path / "dev", num_mel_bins=40)
    with pytest.raises(DataError) as err:
        len(_workload(tmp_path / "dev", mel_bins=80).train)
    assert str(err.value) == (f"{tmp_path / 'dev' / INDEX}: features of 40 mel bins, but the spec's "
                              "features.num_mel_bins is 80; run `chorus features --mel-bins 80` or change the spec")
    assert len(_workload(tmp_path / "dev", mel_bins=40).train) == 20


def test_test_time_warps_refuse_a_features_folder_as_a_test_split_before_the_job_starts(corpus, tmp_path):
    write_shards(corpus / "dev.jsonl", tmp_path / "dev")
    spec = {"train": corpus / "train.jsonl", "dev": tmp_path / "dev", "test": tmp_path / "dev"}
    warped = AsrWorkload(WorkloadConfig(data=spec, decoding={"warps": [0.9, 1.1]}), seed=0)
    with pytest.raises(DataError) as err:
        warped.check_data()
    assert str(err.value) == ("decoding.warps reads each utterance's audio through warped filterbanks: data.test "
                              f"({tmp_path / 'dev'}) is a features folder; set decoding.warps to null (chorus eval: "
                              "--no-warps) or name the audio's manifest")
    AsrWorkload(WorkloadConfig(data={**spec, "test": corpus / "test.jsonl"}, decoding={"warps": [0.9, 1.1]}),
                seed=0).check_data()  # dev (evaluated unwarped while training) may be one


def test_a_shard_cut_short_skips_its_utterances_naming_them_and_the_rest_train(corpus, tmp_path):
    write_shards(corpus / "dev.jsonl", tmp_path / "dev", shard_mb=0.2)
    index = json.loads((tmp_path / "dev" / INDEX).read_text())
    last = max(r["shard"] for r in index["utterances"])
    cut = [r for r in index["utterances"] if r["shard"] == last]
    shard = tmp_path / "dev" / f"shard-{last:05d}.bin"
    shard.write_bytes(shard.read_bytes()[:cut[0]["offset"] + 10])  # the first of its utterances cut mid-way
    corpus_ = _workload(tmp_path / "dev").train
    features = [corpus_.features(i) for i in range(len(corpus_))]
    assert sum(f is None for f in features) == len(cut)
    assert corpus_.skipped.counts == {"truncated feature shard": len(cut)}
    first = sorted(cut, key=lambda r: r["id"])[0]
    assert any(what.startswith(f"utterance {first['id']} in {shard} (10 of ") for what, _ in corpus_.skipped.items)


def test_a_folder_without_its_index_is_not_a_features_folder(corpus, tmp_path):
    write_shards(corpus / "dev.jsonl", tmp_path / "dev")
    assert is_features_folder(tmp_path / "dev")
    (tmp_path / "dev" / INDEX).write_text("{not json")
    with pytest.raises(DataError, match=f"^{tmp_path / 'dev' / INDEX}: not a features index"):
        FeatureShards(tmp_path / "dev")


def test_chorus_features_writes_a_folder_a_spec_can_name(corpus, tmp_path):
    done = run_cli("features", str(corpus / "test.jsonl"), "--out", str(tmp_path / "test"), "--mel-bins", "40")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["utterances"] == 20 and summary["out"] == str(tmp_path / "test")
    assert len(FeatureShards(tmp_path / "test", num_mel_bins=40).utterances) == 20


def _features_folder(tmp_path, utterances: int = 3):
    rows = []
    for i in range(utterances):
        (tmp_path / f"u{i}.wav").write_bytes(audio_bytes(0.3 + 0.1 * i, seed=i))
        rows.append(json.dumps({"audio_filepath": f"u{i}.wav", "text": "go", "duration": 0.0}))
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    write_shards(tmp_path / "m.jsonl", tmp_path / "features", num_mel_bins=40)
    return tmp_path / "features", json.loads((tmp_path / "features" / INDEX).read_text())


def test_index_entries_that_are_malformed_or_whose_frames_outlast_their_duration_are_skipped(tmp_path):
    """A row's fields were used unchecked: a missing one was a KeyError, an offset past 2^63 an
    OverflowError, frames of an hour a read of that many bytes."""
    folder, index = _features_folder(tmp_path)
    rows = index["utterances"]
    index["utterances"] = rows + [
        {**rows[0], "id": "no-text", "text": None}, {k: v for k, v in rows[0].items() if k != "duration"},
        {**rows[0], "id": "far", "offset": 2**70}, {**rows[0], "id": "long", "frames": 360_000},
        {**rows[0], "id": "neg", "shard": -1}, "a row", None]
    (folder / INDEX).write_text(json.dumps(index))
    shards = FeatureShards(folder, num_mel_bins=40, max_seconds=60)
    assert dict(shards.skipped.counts) == {MALFORMED_ENTRY: 5, LONGER_THAN_STATED: 1}
    assert sorted(u.id for u in shards.utterances) == ["far", "u0", "u1", "u2"]
    ids = [u.id for u in shards.utterances]
    with pytest.raises(AudioError, match=r"truncated feature shard \(0 of \d+ bytes at offset 1180591620717411303424"):
        shards.read(ids.index("far"))
    assert shards.read(ids.index("u0")).shape == (31, 40)


@pytest.mark.parametrize("change", [{"num_mel_bins": -4}, {"num_mel_bins": "80"}, {"utterances": {"a": 1}},
                                    {"skipped": 3}])
def test_an_index_that_is_not_one_is_one_line(tmp_path, change):
    folder, index = _features_folder(tmp_path, utterances=1)
    (folder / INDEX).write_text(json.dumps({**index, **change}))
    with pytest.raises(DataError, match=rf"^{folder / INDEX}: not a features index \(its utterances, skipped or "
                                        r"num_mel_bins are not what `chorus features` writes\)$"):
        FeatureShards(folder)
