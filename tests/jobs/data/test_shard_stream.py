"""Training from audio shards (jobs/data/shard_stream.py): each epoch's shards dealt to the ranks from
the index alone, every utterance once per epoch; batches with the manifest's utterances, texts and
features; a resumed stream carrying on from its position; a shard cut short, one that cannot be
read and an unreadable member skipped, counted by name, and passed over."""

import gzip
import io
import tarfile

import pytest
import torch

from jobs.data.audio_shards import (
    INDEX,
    MALFORMED_MEMBER,
    NOT_PLAIN,
    AudioShards,
    ShardUtterance,
    write_audio_shards,
)
from jobs.data.manifests import LONGER_THAN_STATED, DataError
from jobs.data.shard_stream import CUT_SHORT, UNREADABLE_SHARD, plan_shards
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from tests.jobs.data.hostile import audio_bytes, shards_folder, tar_header, tar_of, tar_then, utterance_members


def _workload(train, **data) -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": train, "max_batch_seconds": 10, "prefetch_batches": 0, **data}),
                       seed=0)


@pytest.fixture(scope="module")
def shards(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "train"
    write_audio_shards(corpus / "train.jsonl", out, shard_mb=0.3)
    return out


@pytest.mark.unit
def test_every_shard_is_dealt_to_one_rank_an_epoch_by_share():
    counts = [50, 40, 60, 10, 30, 45, 55, 20, 35]
    for world_size in (1, 2, 3, 4):
        for epoch in range(3):
            plans = [plan_shards(counts, epoch, 7, r, world_size) for r in range(world_size)]
            assert sorted(i for plan in plans for i in plan) == list(range(len(counts)))
            loads = [sum(counts[i] for i in plan) for plan in plans]
            assert max(loads) - min(loads) <= max(counts)  # greedy by load: within one shard of each other
    assert plan_shards(counts, 0, 7, 0, 2) != plan_shards(counts, 1, 7, 0, 2)  # a new order every epoch
    weighted = [plan_shards(counts, 0, 7, r, 3, [2.0, 1.0, 0.0]) for r in range(3)]
    assert weighted[2] == [] and sum(counts[i] for i in weighted[0]) > sum(counts[i] for i in weighted[1])
    assert sorted(weighted[0] + weighted[1]) == list(range(len(counts)))


@pytest.mark.unit
def test_streamed_batches_hold_the_manifests_utterances_texts_and_features_once_an_epoch(corpus, shards):
    streamed, listed = _workload(shards), _workload(corpus / "train.jsonl")
    manifest = listed.train
    by_id = {u.id: i for i, u in enumerate(manifest.utterances)}
    assert len(streamed.train) == len(manifest) == 160
    assert sorted(streamed.train.texts()) == sorted(u.text for u in manifest.utterances)
    for epoch in range(2):
        seen = []
        for rank in range(2):
            stream = streamed.batches(rank, 2, epoch)
            for batch in stream:
                assert batch.feats.shape[1] * batch.size <= 10 * 100 + batch.feats.shape[1]  # within the budget
                for row, utt_id in enumerate(batch.ids):
                    expected = manifest.features(by_id[utt_id])
                    assert batch.texts[row] == manifest.utterances[by_id[utt_id]].text
                    assert torch.equal(batch.feats[row, :len(expected)], expected)
                seen += batch.ids
            assert stream.position == len(stream)
        assert sorted(seen) == sorted(by_id)  # every utterance once, over the ranks


@pytest.mark.unit
def test_a_resumed_stream_carries_on_from_its_position(shards):
    workload = _workload(shards, prefetch_batches=2)
    whole = [b.ids for b in workload.batches(0, 2, 1)]
    stream = workload.batches(0, 2, 1)
    first = iter(stream)
    done = [next(first).ids for _ in range(len(whole) // 2)]
    resumed = workload.batches(0, 2, 1, start=stream.position)
    assert done + [b.ids for b in resumed] == whole
    assert 0 < stream.position < len(stream) and resumed.position == len(resumed)


def _rewrite(path, keep: int | None = None, spoil: str | None = None) -> list[str]:
    """Shard `path` written again with its first `keep` utterances, the audio of `spoil` replaced
    by junk; returns the ids it held."""
    members = []
    with tarfile.open(path) as tar:
        for member in tar:
            members.append((member.name, tar.extractfile(member).read()))
    ids = [name.split(".")[0] for name, _ in members if name.endswith(".json")]
    kept = [(n, b"junk" if spoil and n.startswith(spoil) and not n.endswith(".json") else data)
            for n, data in members if keep is None or n.split(".")[0] in ids[:keep]]
    with tarfile.open(path, "w") as tar:
        for name, data in kept:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return ids


@pytest.mark.unit
def test_shards_cut_short_or_unreadable_and_bad_members_are_skipped_and_counted_by_name(corpus, tmp_path):
    out = tmp_path / "shards"
    write_audio_shards(corpus / "train.jsonl", out, shard_mb=0.3)
    names = AudioShards(out).names
    short = _rewrite(out / names[0], keep=3)
    (out / names[1]).write_bytes(b"\x00garbage" * 100)
    spoilt = _rewrite(out / names[2], spoil=None)[1]
    _rewrite(out / names[2], spoil=spoilt)
    workload = _workload(out)
    counts = AudioShards(out).counts
    seen = [i for rank in range(2) for b in workload.batches(rank, 2, 0) for i in b.ids]
    skipped = workload.train.skipped
    assert dict(skipped.counts) == {CUT_SHORT: 1, UNREADABLE_SHARD: 1, "unreadable audio file": 1}
    assert sorted(skipped.keys) == sorted([names[0], names[1], f"{names[2]}:{spoilt}"])
    assert len(seen) == 160 - (counts[names[0]] - 3) - counts[names[1]] - 1
    assert set(short[:3]) <= set(seen) and not set(short[3:]) & set(seen) and spoilt not in seen
    again = [i for rank in range(2) for b in workload.batches(rank, 2, 1) for i in b.ids]
    assert sorted(again) == sorted(seen) and skipped.total == 3  # each counted once across epochs


@pytest.mark.unit
def test_shards_as_an_evaluation_split_or_at_no_location_are_one_line(corpus, shards, tmp_path):
    config = WorkloadConfig(data={"train": corpus / "train.jsonl", "dev": shards})
    with pytest.raises(DataError, match=r"audio shards are a training source; evaluate on a manifest"):
        AsrWorkload(config).check_data()
    with pytest.raises(DataError, match=r"^nosuch://bucket/x: cannot open it"):
        _workload("nosuch://bucket/x?endpoint_override=127.0.0.1:1").check_data()


@pytest.mark.ray
def test_learners_streaming_shards_train_every_utterance_once_across_a_resume_and_a_resize(
        ray_session, corpus, shards, tmp_path):
    """Two learner actors stream the shards planned for them for 2 epochs; the job resumes from
    its checkpoint with 3 learners for 2 more: every utterance once an epoch, none skipped, the
    curve goes on, nothing left behind."""
    from orchestrator.driver.job import TrainingJob
    from tests.builders import assert_nothing_left, make_spec

    def spec(learners: int, epochs: int):
        return make_spec(corpus, name="streamed", learners=learners, group={"kind": "allreduce", "balance": False},
                         budget__epochs=epochs, data__train=str(shards), data__dev=str(corpus / "dev.jsonl"))

    first = TrainingJob(spec(2, 2), tmp_path).run()
    assert first["samples"] == 2 * 160 and first["skipped_utterances"] == {}
    resumed = TrainingJob(spec(3, 4), tmp_path, resume=True)
    summary = resumed.run()
    assert summary["samples"] == 4 * 160 and summary["skipped_utterances"] == {}
    assert [r["epoch"] for r in resumed.evals] == [1, 2, 3, 4] and summary["learners"] == 3  # the curve goes on
    assert_nothing_left("streamed-", within=30.0)


@pytest.mark.unit
def test_a_stream_of_shard_features_gives_the_audios_features_without_decoding_it(corpus, tmp_path, monkeypatch):
    out = tmp_path / "mel"
    write_audio_shards(corpus / "train.jsonl", out, shard_mb=0.3, mel_bins=40)
    features = {"num_mel_bins": 40}
    listed = AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl"}, features=features)).train
    by_id = {u.id: i for i, u in enumerate(listed.utterances)}

    def no_decoding(self):
        raise AssertionError(f"{self.id}'s audio was decoded")

    monkeypatch.setattr(ShardUtterance, "waveform", property(no_decoding))
    streamed = AsrWorkload(WorkloadConfig(data={"train": out, "max_batch_seconds": 10, "prefetch_batches": 0,
                                                "shard_features": True}, features=features))
    seen = []
    for batch in streamed.batches(0, 1, 0):
        for row, utt_id in enumerate(batch.ids):
            expected = listed.features(by_id[utt_id])
            assert torch.allclose(batch.feats[row, :len(expected)], expected, atol=0.02)  # float16 log-mels
        seen += batch.ids
    assert sorted(seen) == sorted(by_id)
    augmented = AsrWorkload(WorkloadConfig(data={"train": out, "shard_features": True}, features=features,
                                           augment={"speed_factors": [0.9], "noise_prob": 0.5}))
    batch = next(iter(augmented.batches(0, 1, 0)))
    assert batch.feats.shape[1] > next(iter(streamed.batches(0, 1, 0))).feats.shape[1]  # slower: more frames


@pytest.mark.unit
def test_shard_features_asked_of_shards_without_them_or_of_another_size_are_one_line(shards, tmp_path, corpus):
    with pytest.raises(DataError, match=r"train: data.shard_features is on, but these shards carry no features "
                                        r"\(write them with `chorus shards MANIFEST --out URI --features 80`\)$"):
        _workload(shards, shard_features=True).check_data()
    write_audio_shards(corpus / "train.jsonl", tmp_path / "mel", shard_mb=0.3, mel_bins=40)
    with pytest.raises(DataError, match=r"mel: data.shard_features is on, but these shards carry 40 mel channels "
                                        r"and features.num_mel_bins is 80$"):
        _workload(tmp_path / "mel", shard_features=True).check_data()


@pytest.mark.unit
def test_hostile_shards_are_skipped_and_counted_by_reason_and_a_resume_past_them_trains_the_rest(tmp_path):
    """A bucket's shards with a member without a transcript, one whose audio is ten times what its
    JSON says, a header claiming 2^88 bytes, a gzip cut short and an index entry naming a shard outside
    the folder: each skipped and counted once, by reason; the rest trains; a learner resuming past
    them (a new process) reads on from its position."""
    def utterance(utt_id: str, seconds: float = 0.3, said: float | None = None, text="go"):
        return utterance_members(utt_id, {"text": text, "duration": said or seconds}, audio_bytes(seconds))

    good = [m for i in range(4) for m in utterance(f"g{i}")]
    (tmp_path / "escape.tar").write_bytes(tar_of(utterance("stolen")))
    forged = tar_header(b"h2.wav", b"\x80" + b"\xff" * 11)  # base-256: 2^88 - 1 bytes
    root = shards_folder(tmp_path / "shards", {
        "good.tar": good[:2] + utterance("bad", text=None) + good[2:4] + utterance("lies", 3.0, 0.3) + good[4:],
        "huge.tar": tar_then(utterance("h0") + utterance("h1"), forged + b"\0" * 4096),
        "cut.tar.gz": gzip.compress(tar_of(utterance("c0")))[:20],
    }, entries=[{"name": "good.tar", "utterances": 6}, {"name": "huge.tar", "utterances": 3},
                {"name": "cut.tar.gz", "utterances": 1}, {"name": "../escape.tar", "utterances": 1}])
    first = _workload(root, max_batch_seconds=1)
    stream, batches, positions = first.batches(0, 1, 0), [], []
    for batch in stream:
        batches.append(batch.ids)
        positions.append(stream.position)
    assert sorted(i for ids in batches for i in ids) == ["g0", "g1", "g2", "g3", "h0", "h1"]
    assert stream.position == len(stream) == 10
    skipped = first.train.skipped
    assert dict(skipped.counts) == {MALFORMED_MEMBER: 1, LONGER_THAN_STATED: 1, UNREADABLE_SHARD: 2, NOT_PLAIN: 1}
    assert sorted(skipped.keys) == sorted(["good.tar:bad", "good.tar:lies", "huge.tar", "cut.tar.gz", f"{INDEX}#3"])
    assert [b.ids for b in first.batches(0, 1, 0)] == batches and skipped.total == 5  # counted once a corpus
    for k, start in enumerate(positions[:-1]):  # a learner resuming in a new process, after each batch
        assert [b.ids for b in _workload(root, max_batch_seconds=1).batches(0, 1, 0, start=start)] == batches[k + 1:]

