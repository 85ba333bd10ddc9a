"""Audio shards (jobs/data/audio_shards.py, `chorus shards`): a manifest packed into tar shards at a
folder reads back as the same utterances, texts, durations and samples (and, written with
features, their log-mel power), shard by shard, from the index's names alone, ids with dots
included; a location without shards, or one that cannot be opened, is one line. What a stranger's
bucket may hold is never trusted: index entries that name paths or are malformed are left out and
counted, an index that is none is one line, a member with unusable JSON is read as such, and an
utterance decodes to no more than its stated duration allows."""

import json

import numpy as np
import pytest
import torch

from jobs.data.audio_shards import (
    INDEX,
    NOT_PLAIN,
    UNREADABLE_FEATURES,
    AudioShards,
    ShardUtterance,
    UnusableMember,
    write_audio_shards,
)
from jobs.data.manifests import (
    LONGER_THAN_STATED,
    MALFORMED_ENTRY,
    TOO_LONG,
    TOO_SHORT,
    AudioError,
    DataError,
    load_audio,
    read_corpus,
)
from jobs.features.filterbanks import Fbank
from tests.jobs.data.hostile import audio_bytes, shards_folder, tar_of, utterance_members

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


# -- what a stranger's bucket may hold -------------------------------------------------------------
def test_ids_with_dots_and_audio_without_an_extension_read_back_as_written(tmp_path):
    """Members were split at an id's first dot, so `a.b.c` (its JSON `a.b.c.json`) was dropped unread."""
    rows = []
    for i, name in enumerate(["spk.1.utt.7.wav", "plain.flac", "noextension"]):
        (tmp_path / name).write_bytes(audio_bytes(0.2 + 0.1 * i, fmt="FLAC" if name.endswith(".flac") else "WAV"))
        rows.append(json.dumps({"audio_filepath": name, "text": f"text {i}", "duration": 0.0}))
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    write_audio_shards(tmp_path / "m.jsonl", tmp_path / "shards")
    shards = AudioShards(tmp_path / "shards")
    read = {u.id: u for name in shards.names for u in shards.read(name)}
    assert sorted(read) == ["noextension", "plain", "spk.1.utt.7"] and shards.utterances == 3
    for utt in read_corpus(tmp_path / "m.jsonl")[0]:
        assert read[utt.id].text == utt.text and torch.equal(read[utt.id].waveform, load_audio(utt.path))


def test_index_entries_that_name_paths_or_are_malformed_are_left_out_and_counted(tmp_path):
    outside = tmp_path / "escape.tar"  # a shard beside the folder, which no entry may reach
    outside.write_bytes(tar_of(utterance_members("stolen", {"text": "x", "duration": 0.3}, audio_bytes())))
    entries = [{"name": "good.tar", "utterances": 1}, {"name": "../escape.tar", "utterances": 1},
               {"name": str(outside), "utterances": 1}, {"name": "a/b.tar", "utterances": 1},
               {"name": "good.tar", "utterances": 1}, {"name": "x.tar", "utterances": -1},
               {"name": "y.tar", "utterances": "1"}, {"utterances": 1}, "z.tar", {"name": 7, "utterances": 1}]
    root = shards_folder(tmp_path / "shards", {"good.tar": utterance_members("u", {"text": "go", "duration": 0.3},
                                                                             audio_bytes())}, entries)
    shards = AudioShards(root)
    assert shards.names == ["good.tar"] and shards.utterances == 1
    assert dict(shards.skipped.counts) == {NOT_PLAIN: 3, MALFORMED_ENTRY: 6}
    assert sorted(shards.skipped.keys) == sorted(f"{INDEX}#{i}" for i in range(1, 10))
    assert any("shard '../escape.tar'" in what for what, _ in shards.skipped.items)
    assert any("shard 4 (listed twice)" in what for what, _ in shards.skipped.items)
    assert any("shard 5 (utterances: Input should be greater than or equal to 0)" in what
               for what, _ in shards.skipped.items)


@pytest.mark.parametrize("index", [
    b"{not json", b"\xff\xfe", pytest.param(b"[" * 100_000, id="nested-too-deep"), b"[]",
    b'{"format": "chorus-audio-shards"}',
    b'{"format": "chorus-audio-shards", "version": 1, "shards": {"a": 1}}',
    b'{"format": "chorus-audio-shards", "version": 1, "shards": [], "mel_bins": "80"}',
])
def test_an_index_that_is_not_one_is_one_line_naming_it(tmp_path, index):
    (tmp_path / INDEX).write_bytes(index)
    with pytest.raises(DataError) as caught:
        AudioShards(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}/{INDEX}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("meta, detail", [
    ({"duration": 0.3}, "text: Field required"),
    ({"text": "go"}, "duration: Field required"),
    ({"text": 7, "duration": 0.3}, "text: Input should be a valid string"),
    ({"text": "go", "duration": "0.3"}, "duration: Input should be a valid number"),
    ({"text": "go", "duration": True}, "duration: Input should be a valid number"),
    ({"text": "go", "duration": -1}, "duration: Input should be greater than or equal to 0"),
    ({"text": "go", "duration": float("nan")}, "duration: Input should be a finite number"),
    ({"text": "go", "duration": 0.3, "frames": 1.5}, "frames: Input should be a valid integer"),
    (["go", 0.3], "not a JSON object"),
    (b"\xff not json", "its JSON is not JSON"),
    pytest.param(b"[" * 100_000, "its JSON is not JSON", id="nested-too-deep"),  # a RecursionError
])
def test_a_member_whose_json_lacks_a_field_or_has_one_of_the_wrong_type_is_read_as_unusable(tmp_path, meta, detail):
    """It raised KeyError or TypeError where the stream catches neither: the job aborted, and again on resume."""
    members = (utterance_members("bad", meta, audio_bytes())
               + utterance_members("good", {"text": "go", "duration": 0.3}, audio_bytes()))
    shards = AudioShards(shards_folder(tmp_path / "shards", {"s.tar": members}))
    bad, good = shards.read("s.tar")
    assert bad == UnusableMember("bad", detail)
    assert isinstance(good, ShardUtterance) and good.text == "go"


def test_an_utterance_decodes_to_no_more_than_its_stated_duration_or_the_readers_bound(tmp_path):
    """Decoding trusted the JSON: a member that says 0.5 s decoded whatever its audio held."""
    members = (utterance_members("lies", {"text": "go", "duration": 0.5}, audio_bytes(3.0))
               + utterance_members("long", {"text": "go", "duration": 3.0}, audio_bytes(3.0))
               + utterance_members("fine", {"text": "go", "duration": 3.0}, audio_bytes(3.0)))
    shards = AudioShards(shards_folder(tmp_path / "shards", {"s.tar": members}))
    lies, long, fine = shards.read("s.tar", max_seconds=4.0)
    with pytest.raises(AudioError) as caught:
        lies.waveform  # noqa: B018
    assert caught.value.reason == LONGER_THAN_STATED and "its JSON says 0.5 s" in str(caught.value)
    assert fine.waveform.shape == (48_000,)
    _, long, _ = shards.read("s.tar", max_seconds=2.0)
    with pytest.raises(AudioError) as caught:
        long.waveform  # noqa: B018
    assert caught.value.reason == TOO_LONG


def test_features_of_another_size_lying_frames_or_not_finite_are_unreadable(tmp_path):
    def member(utt_id: str, frames: int, values: np.ndarray, duration: float = 0.3):
        meta = {"text": "go", "duration": duration, "frames": frames, "power": 0.1}
        audio, json_member = utterance_members(utt_id, meta, audio_bytes())
        return [audio, (f"{utt_id}.mel", values.astype(np.float16).tobytes()), json_member]

    good = np.zeros((31, 40))
    odd = member("odd", 10, np.zeros(3))
    members = (member("ok", 31, good) + member("bins", 31, np.zeros((31, 80))) + [odd[0], ("odd.mel", b"\0" * 801),
               odd[2]] + member("nan", 31, np.full((31, 40), np.nan)) + member("lies", 600, np.zeros((600, 40)))
               + member("one", 1, np.zeros((1, 40))))  # one frame: normalized, it was NaN (and the loss)
    shards = AudioShards(shards_folder(tmp_path / "shards", {"s.tar": members}, mel_bins=40))
    ok, *bad = shards.read("s.tar")
    assert ok.log_mel.shape == (31, 40)
    reasons = []
    for utt in bad:
        with pytest.raises(AudioError) as caught:
            utt.log_mel  # noqa: B018
        reasons.append(caught.value.reason)
    assert reasons == [UNREADABLE_FEATURES] * 3 + [LONGER_THAN_STATED, TOO_SHORT]
