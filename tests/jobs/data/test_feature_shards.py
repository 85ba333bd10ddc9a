"""Precomputed features (jobs/data/feature_shards.py, `chorus features`): a features folder reads as the
corpus it was made from (same utterances, texts and durations, the same filterbanks to float16's
precision, the same batches); a spec whose mel bins differ, a shard cut short, an unfinished
folder and test-time warps (which need audio) each give one line naming the file (the utterance,
the split)."""

from __future__ import annotations

import json

import pytest
import torch

from jobs.data.feature_shards import INDEX, FeatureShards, is_features_folder, write_shards
from jobs.data.manifests import DataError
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from tests.builders import run_cli

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
