"""Lhotse corpora (jobs/data/lhotse_corpora.py): a CutSet manifest and a Shar directory made with Lhotse
from a synthesized corpus give the JSONL manifest's utterances (ids, texts, audio), each once an
epoch; Shar streams from the S3 server on loopback; `chorus shards --format lhotse-shar` writes Shar
that Lhotse reads back; a bad cut line, a tar that does not match its cuts or is cut short, are
skipped and counted, never a crash; learners train on both, every utterance once across a resume
and a resize."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from jobs.data.lhotse_corpora import MALFORMED_CUT, SharShards, is_shar
from jobs.data.manifests import load_audio, read_corpus
from jobs.data.shard_stream import UNREADABLE_SHARD
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload
from orchestrator.testing.s3 import local_s3, uri
from tests.builders import run_cli

pytestmark = pytest.mark.xdist_group("lhotse-s3")  # one worker runs them all: they share the module's S3 server


@pytest.fixture(scope="module")
def s3():
    with local_s3() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def lhotse_corpus(corpus, tmp_path_factory):
    """The session corpus's train split as Lhotse makes it: `cuts.jsonl.gz` and `shar/` (4 shards of
    40 cuts, FLAC), through Lhotse's own API."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    out = tmp_path_factory.mktemp("lhotse")
    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    ids = [Path(r["audio_filepath"]).stem for r in rows]
    recordings = RecordingSet.from_recordings(Recording.from_file(corpus / r["audio_filepath"], recording_id=i)
                                              for r, i in zip(rows, ids, strict=True))
    supervisions = SupervisionSet.from_segments(SupervisionSegment(id=i, recording_id=i, start=0.0,
                                                                   duration=r["duration"], text=r["text"])
                                                for r, i in zip(rows, ids, strict=True))
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions).trim_to_supervisions().to_eager()
    cuts.to_file(out / "cuts.jsonl.gz")
    (out / "shar").mkdir()
    cuts.to_shar(out / "shar", fields={"recording": "flac"}, shard_size=40)
    return out


def _workload(train, **data) -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": train, "max_batch_seconds": 10, "prefetch_batches": 0, **data}),
                       seed=0)


def _epoch_ids(train, world_size: int, epoch: int = 0) -> list[list[str]]:
    workload = _workload(train)
    return [[i for batch in workload.batches(rank, world_size, epoch) for i in batch.ids] for rank in range(world_size)]


@pytest.mark.unit
def test_a_cutset_gives_the_manifests_utterances_texts_and_audio(corpus, lhotse_corpus):
    manifest, _ = read_corpus(corpus / "train.jsonl")
    cuts, skipped = read_corpus(lhotse_corpus / "cuts.jsonl.gz")
    assert skipped.total == 0
    assert [(u.id, u.text) for u in cuts] == [(u.id, u.text) for u in manifest]
    assert [round(u.duration, 3) for u in cuts] == [round(u.duration, 3) for u in manifest]
    assert torch.equal(_workload(lhotse_corpus / "cuts.jsonl.gz").train.features(7),
                       _workload(corpus / "train.jsonl").train.features(7))  # Lhotse loaded the same samples
    ranks = _epoch_ids(lhotse_corpus / "cuts.jsonl.gz", 2)
    assert sorted(ranks[0] + ranks[1]) == sorted(u.id for u in manifest) and set(ranks[0]).isdisjoint(ranks[1])


@pytest.mark.unit
def test_shar_streams_every_utterance_once_an_epoch_from_a_folder_and_from_s3(corpus, lhotse_corpus, s3):
    import pyarrow.fs

    manifest = {u.id: u for u in read_corpus(corpus / "train.jsonl")[0]}
    at_s3 = uri(s3, "lhotse/shar")
    pyarrow.fs.copy_files(str(lhotse_corpus / "shar"), "chorus/lhotse/shar",
                          destination_filesystem=pyarrow.fs.S3FileSystem(endpoint_override=s3, scheme="http"))
    assert is_shar(lhotse_corpus / "shar") and is_shar(at_s3) and not is_shar(uri(s3, "lhotse/none"))
    for source in (lhotse_corpus / "shar", at_s3):
        shards = SharShards(source)
        assert shards.counts == {f"{k:06d}": 40 for k in range(4)} and sorted(shards.texts()) == sorted(
            u.text for u in manifest.values())
        for epoch in (0, 1):
            ranks = _epoch_ids(source, 3, epoch)
            assert sorted(sum(ranks, [])) == sorted(manifest) and sum(map(len, ranks)) == 160, (source, epoch)
    first = next(SharShards(at_s3).read("000002", skip=5))
    assert torch.equal(first.waveform, load_audio(manifest[first.id].path)) and first.text == manifest[first.id].text


@pytest.mark.unit
def test_chorus_shards_writes_shar_that_lhotse_reads_back(corpus, tmp_path, s3):
    from lhotse import CutSet

    proc = run_cli("shards", str(corpus / "dev.jsonl"), "--out", str(tmp_path / "shar"), "--format", "lhotse-shar",
                   "--shard-mb", "0.2")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    assert written["format"] == "lhotse-shar" and written["utterances"] == 20 and written["shards"] >= 2
    cuts = CutSet.from_shar(in_dir=tmp_path / "shar")
    manifest = {u.id: u for u in read_corpus(corpus / "dev.jsonl")[0]}
    read_back = {cut.id: (cut.supervisions[0].text, cut.load_audio().shape[1]) for cut in cuts}
    assert read_back == {i: (u.text, len(load_audio(u.path))) for i, u in manifest.items()}
    remote = run_cli("shards", str(corpus / "dev.jsonl"), "--out", uri(s3, "written/shar"), "--format", "lhotse-shar")
    assert remote.returncode == 0, remote.stderr
    assert sum(1 for s in SharShards(uri(s3, "written/shar")).names) == json.loads(remote.stdout)["shards"]


@pytest.mark.unit
def test_a_bad_cut_line_and_a_shar_tar_cut_short_or_mismatched_are_skipped_and_counted(lhotse_corpus, tmp_path):
    lines = gzip.decompress((lhotse_corpus / "cuts.jsonl.gz").read_bytes()).decode().splitlines()
    broken = tmp_path / "cuts.jsonl.gz"
    broken.write_bytes(gzip.compress("\n".join([lines[0], '{"id": 3, "type": "MonoCut"}', "[1, 2",
                                                *lines[1:5]]).encode()))
    cuts, skipped = read_corpus(broken)
    assert len(cuts) == 5 and dict(skipped.counts) == {MALFORMED_CUT: 2}
    shar = tmp_path / "shar"
    shar.mkdir()
    for f in (lhotse_corpus / "shar").iterdir():
        (shar / f.name).write_bytes(f.read_bytes())
    tar = (shar / "recording.000001.tar").read_bytes()
    (shar / "recording.000001.tar").write_bytes(tar[: len(tar) // 2])  # cut short: its second half lost
    swapped = gzip.decompress((shar / "cuts.000003.jsonl.gz").read_bytes()).decode().splitlines()
    swapped[10], swapped[11] = swapped[11], swapped[10]  # cuts in another order than the tar's audio
    (shar / "cuts.000003.jsonl.gz").write_bytes(gzip.compress("\n".join(swapped).encode()))
    workload = _workload(shar)
    trained = [i for rank in range(2) for batch in workload.batches(rank, 2, 0) for i in batch.ids]
    assert len(trained) == len(set(trained)) and 40 + 40 + 10 < len(trained) < 160
    assert dict(workload.train.skipped.counts) == {UNREADABLE_SHARD: 2}


@pytest.mark.slow
def test_learners_train_on_a_cutset_and_on_shar_from_s3_every_utterance_once_across_a_resume_and_a_resize(
        ray_session, corpus, lhotse_corpus, s3, tmp_path):
    """2 learners a CutSet for an epoch; 2 learners Shar from S3 for 2 epochs, resumed with 3 for 2
    more: every utterance once an epoch, none skipped, the curve goes on, nothing left behind."""
    from orchestrator.driver.job import TrainingJob
    from tests.builders import assert_nothing_left, make_spec

    at_s3 = uri(s3, "lhotse/train")
    import pyarrow.fs

    pyarrow.fs.copy_files(str(lhotse_corpus / "shar"), "chorus/lhotse/train",
                          destination_filesystem=pyarrow.fs.S3FileSystem(endpoint_override=s3, scheme="http"))

    def spec(train: str, learners: int, epochs: int):
        return make_spec(corpus, name="lhotse", learners=learners, group={"kind": "allreduce", "balance": False},
                         budget__epochs=epochs, data__train=train, data__dev=str(corpus / "dev.jsonl"))

    cutset = TrainingJob(spec(str(lhotse_corpus / "cuts.jsonl.gz"), 2, 1), tmp_path / "cutset").run()
    assert cutset["samples"] == 160 and cutset["skipped_utterances"] == {}
    first = TrainingJob(spec(at_s3, 2, 2), tmp_path / "shar").run()
    assert first["samples"] == 2 * 160 and first["skipped_utterances"] == {}
    resumed = TrainingJob(spec(at_s3, 3, 4), tmp_path / "shar", resume=True)
    summary = resumed.run()
    assert summary["samples"] == 4 * 160 and summary["skipped_utterances"] == {}
    assert [r["epoch"] for r in resumed.evals] == [1, 2, 3, 4] and summary["learners"] == 3
    assert_nothing_left("lhotse-", within=30.0)


@pytest.mark.unit
def test_a_cutset_is_transcribed_with_its_supervisions_as_references(corpus, lhotse_corpus):
    from jobs.transcription import ClipTranscriber
    from tests.builders import checkpoint_state

    state = checkpoint_state(corpus)
    records, skipped = ClipTranscriber.read_inputs([lhotse_corpus / "cuts.jsonl.gz"], state)
    assert len(records) == 160 and skipped.total == 0 and all("cut" in r and r["reference"] for r in records)
    done = ClipTranscriber.from_checkpoint(state, device="cpu")(records[:6])
    assert [r["id"] for r in done] == [r["id"] for r in records[:6]]
    assert all(set(r) == {"id", "path", "duration", "text", "reference"} for r in done)  # no cut in the output


@pytest.mark.unit
def test_chorus_shards_packs_a_cutset_in_either_format(corpus, lhotse_corpus, tmp_path):
    from jobs.data.audio_shards import AudioShards

    manifest = {u.id: u for u in read_corpus(corpus / "train.jsonl")[0]}
    for shard_format in ("chorus", "lhotse-shar"):
        out = tmp_path / shard_format
        proc = run_cli("shards", str(lhotse_corpus / "cuts.jsonl.gz"), "--out", str(out), "--format", shard_format)
        assert proc.returncode == 0, proc.stderr
        shards = AudioShards(out) if shard_format == "chorus" else SharShards(out)
        read = [utt for name in shards.names for utt in shards.read(name)]
        assert sorted(u.id for u in read) == sorted(manifest) and all(u.text == manifest[u.id].text for u in read)
        sample = read[3]
        assert torch.equal(sample.waveform, load_audio(manifest[sample.id].path))  # FLAC: the samples themselves
