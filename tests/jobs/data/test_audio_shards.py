"""Audio shards (jobs/data/audio_shards.py, `chorus shards`): a manifest packed into tar shards at a
folder reads back as the same utterances, texts, durations and samples (and, written with
features, their log-mel power), shard by shard, from the index's names alone; a location without
shards, or one that cannot be opened, is one line."""

import pytest
import torch

from jobs.data.audio_shards import AudioShards, write_audio_shards
from jobs.data.manifests import AudioError, DataError, load_audio, read_corpus
from jobs.features.filterbanks import Fbank

pytestmark = pytest.mark.unit


def test_shards_read_back_the_manifests_utterances_texts_and_samples(corpus, tmp_path):
    summary = write_audio_shards(corpus / "train.jsonl", tmp_path / "shards", shard_mb=0.5)
    utterances, _ = read_corpus(corpus / "train.jsonl")
    shards = AudioShards(tmp_path / "shards")
    assert summary["utterances"] == len(utterances) == sum(shards.counts.values()) == 160
    assert summary["shards"] == len(shards.names) > 1  # 0.5 MB each: the corpus spans several
    by_shard = [list(shards.read(name)) for name in shards.names]
    for members in by_shard:  # each shard in order of duration: a stream cuts batches of similar lengths
        assert [u.duration for u in members] == sorted(u.duration for u in members)
    read = {u.id: u for members in by_shard for u in members}
    assert sorted(read) == [u.id for u in utterances]  # each utterance once
    assert [(read[u.id].text, read[u.id].duration) for u in utterances] == [(u.text, u.duration) for u in utterances]
    for utt in utterances[::40]:
        assert torch.equal(read[utt.id].waveform, load_audio(utt.path))
    assert sorted(shards.texts()) == sorted(u.text for u in utterances) and len(shards.texts(limit=7)) == 7
    assert [u.id for u in shards.read(shards.names[1], skip=2)] == [u.id for u in by_shard[1][2:]]


def test_a_location_without_shards_or_that_cannot_be_opened_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: no shards.json there \(write shards with `chorus shards"):
        AudioShards(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"^nosuch://bucket/x: cannot open it"):
        AudioShards("nosuch://bucket/x?endpoint_override=127.0.0.1:1")


def test_shards_written_with_features_carry_each_utterances_log_mel_power(corpus, tmp_path):
    write_audio_shards(corpus / "train.jsonl", tmp_path / "plain", shard_mb=0.5)
    write_audio_shards(corpus / "train.jsonl", tmp_path / "mel", shard_mb=0.5, mel_bins=40)
    plain, mel = AudioShards(tmp_path / "plain"), AudioShards(tmp_path / "mel")
    assert (plain.mel_bins, mel.mel_bins) == (None, 40) and plain.counts == mel.counts
    read = {u.id: u for name in mel.names for u in mel.read(name)}
    fbank = Fbank(40)
    for utt in read_corpus(corpus / "train.jsonl")[0][::20]:
        waveform = load_audio(utt.path)
        assert torch.allclose(read[utt.id].log_mel, fbank.log_mel(waveform), atol=0.02)  # float16
        assert read[utt.id].power == pytest.approx(float(waveform.pow(2).mean()), rel=1e-6)
        assert torch.equal(read[utt.id].waveform, waveform)  # the audio is still there
    with pytest.raises(AudioError, match="no features"):
        next(plain.read(plain.names[0])).log_mel  # noqa: B018
