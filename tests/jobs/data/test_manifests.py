import io
import json
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from jobs.data.corpus import Corpus
from jobs.data.manifests import SkipReport, load_audio, read_corpus, shard_batches
from jobs.features.filterbanks import Fbank
from jobs.tokenizer import CharTokenizer
from tests.jobs.data.hostile import audio_bytes

pytestmark = pytest.mark.unit


def test_both_formats_yield_the_same_utterances(corpus):
    for split in ("train", "test-unseen"):
        from_jsonl, skipped_j = read_corpus(corpus / f"{split}.jsonl")
        from_dir, skipped_d = read_corpus(corpus / split)
        assert skipped_j.total == skipped_d.total == 0
        assert len(from_jsonl) > 0
        assert [(u.id, u.path.resolve(), u.text) for u in from_jsonl] == \
               [(u.id, u.path.resolve(), u.text) for u in from_dir]
        assert np.allclose([u.duration for u in from_jsonl], [u.duration for u in from_dir])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_shards_cover_every_utterance_once_per_epoch(world_size):
    durations = np.random.default_rng(0).uniform(0.5, 6.0, size=203)
    for epoch in range(3):
        seen = []
        for rank in range(world_size):
            batches = shard_batches(durations, 20.0, epoch, seed=1, rank=rank, world_size=world_size)
            for b in batches:
                assert len(b) * durations[b].max() <= 20.0 or len(b) == 1
            seen += [i for b in batches for i in b]
        assert sorted(seen) == list(range(203))


def test_shards_balanced_reshuffled_and_world_size_may_change():
    durations = np.random.default_rng(1).uniform(0.5, 6.0, size=100)
    sizes = [sum(map(len, shard_batches(durations, 30.0, 0, 2, r, 3))) for r in range(3)]
    assert max(sizes) - min(sizes) <= 1
    e0 = shard_batches(durations, 30.0, 0, 2, 0, 2)
    e1 = shard_batches(durations, 30.0, 1, 2, 0, 2)
    assert {i for b in e0 for i in b} != {i for b in e1 for i in b}  # reshuffled per epoch
    assert e0 == shard_batches(durations, 30.0, 0, 2, 0, 2)  # deterministic
    # the world grows 2 -> 5 -> 3 between epochs: each epoch still covers everything once
    for epoch, world in enumerate([2, 5, 3]):
        seen = sorted(i for r in range(world) for b in shard_batches(durations, 30.0, epoch, 2, r, world) for i in b)
        assert seen == list(range(100))
    with pytest.raises(ValueError, match="rank 3"):
        shard_batches(durations, 30.0, 0, 2, rank=3, world_size=3)


def test_weighted_shards_follow_the_weights_and_keep_the_global_batch():
    durations = np.random.default_rng(2).uniform(0.5, 6.0, size=400)
    weights = [3.0, 1.0, 1.0, 1.0]  # one learner three times as fast as the others
    shards = [shard_batches(durations, 20.0, 0, 5, r, 4, weights=weights) for r in range(4)]
    seen = sorted(i for shard in shards for b in shard for i in b)
    assert seen == list(range(400))  # still every utterance once
    sizes = [sum(map(len, shard)) for shard in shards]
    assert abs(sizes[0] - 200) <= 2 and all(abs(n - 67) <= 2 for n in sizes[1:]), sizes
    for r, shard in enumerate(shards):  # batch budgets scale with the share: 40 s for rank 0, 13.3 s else
        budget = 20.0 * 4 * weights[r] / sum(weights)
        over = 0 if r == 0 else 1  # the others (under half rank 0's budget) may go over by an utterance
        assert all((len(b) - over) * durations[b].max() <= budget + 1e-9 or len(b) == 1 for b in shard)
    for step, batches in enumerate(zip(*shards, strict=False)):  # aligned: a step's batches have similar lengths
        longest = [durations[b].max() for b in batches]
        assert max(longest) - min(longest) < 0.5, (step, longest)
    counts = [len(shard) for shard in shards]  # about as many steps each
    assert max(counts) <= 1.25 * min(counts), counts
    # a rank of weight 0 (sitting out) gets nothing, the others still cover everything
    shards = [shard_batches(durations, 20.0, 0, 5, r, 4, weights=[1.0, 0.0, 1.0, 1.0]) for r in range(4)]
    assert shards[1] == [] and sorted(i for shard in shards for b in shard for i in b) == list(range(400))
    with pytest.raises(ValueError, match="4 numbers >= 0, not all 0"):
        shard_batches(durations, 20.0, 0, 5, 0, 4, weights=[1.0, -1.0, 1.0, 1.0])


def test_eight_khz_stereo_wav_is_resampled_and_downmixed(tmp_path):
    t = np.arange(8000) / 8000
    left, right = np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 440 * t) * 0.5
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1).astype(np.float32), 8000)
    wav = load_audio(path)
    assert wav.ndim == 1 and abs(len(wav) - 16000) <= 2
    assert abs(float(wav.abs().max()) - 0.75) < 0.05  # mean of the channels
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": "stereo.wav", "duration": 1.0, "text": "go"}) + "\n")
    utts, skipped = read_corpus(manifest)
    assert len(utts) == 1 and skipped.total == 0 and abs(utts[0].duration - 1.0) < 1e-6


@pytest.fixture
def damaged(corpus, tmp_path):
    """A copy of the train split with a corrupt FLAC, a missing FLAC, a missing transcript line
    and an empty (zero-byte) FLAC."""
    root = tmp_path / "train"
    shutil.copytree(corpus / "train", root)
    flacs = sorted(root.rglob("*.flac"))
    bad = dict(zip(["corrupt", "missing", "untranscribed", "empty"], flacs[:4], strict=True))
    bad["corrupt"].write_bytes(b"this is not a flac file" * 10)
    bad["missing"].unlink()
    u = bad["untranscribed"]
    trans = u.parent / f"{'-'.join(u.stem.split('-')[:2])}.trans.txt"
    trans.write_text("\n".join(line for line in trans.read_text().splitlines() if not line.startswith(u.stem)) + "\n")
    bad["empty"].write_bytes(b"")
    return root, bad


def test_damaged_corpus_is_skipped_and_counted_not_fatal(damaged):
    root, bad = damaged
    utts, skipped = read_corpus(root)
    assert not {p.stem for p in bad.values()} & {u.id for u in utts}
    assert len(utts) == 160 - 4
    assert skipped.counts == {"unreadable audio file": 1, "missing audio file": 1, "no transcript": 1,
                              "empty audio file": 1}
    for path in bad.values():  # every skip names its file
        assert any(path.name in where or path.stem in where for where, _ in skipped.items)


def test_file_lost_after_indexing_is_dropped_from_its_batch_counted_and_logged_once(corpus, tmp_path, caplog):
    root = tmp_path / "dev"
    shutil.copytree(corpus / "dev", root)
    c = Corpus(root, Fbank(), CharTokenizer)
    gone = c.utterances[0].path
    gone.unlink()  # e.g. a network share losing the file mid-run
    caplog.clear()
    for _ in range(2):
        batch = c.collate([0, 1, 2])
        assert batch.ids == [c.utterances[1].id, c.utterances[2].id]
        assert batch.feats.shape[0] == 2
    assert c.collate([0]) is None
    assert c.skipped.total == 1
    assert sum(gone.name in r.getMessage() for r in caplog.records) == 1


def test_jsonl_problems_are_reported_with_line_numbers(corpus, tmp_path):
    lines = (corpus / "dev.jsonl").read_text().splitlines()[:4]
    rows = [json.loads(line) for line in lines]
    for row in rows:
        row["audio_filepath"] = str(corpus / row["audio_filepath"])
    rows[1]["text"] = ""
    rows[2]["audio_filepath"] = str(tmp_path / "nowhere.flac")
    manifest = tmp_path / "dev.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    utts, skipped = read_corpus(manifest)
    assert len(utts) == 2
    assert skipped.counts == {"no transcript": 1, "missing audio file": 1,
                              "malformed manifest line (needs JSON with audio_filepath)": 1}
    assert any(where.endswith("dev.jsonl:5") for where, _ in skipped.items)


def test_skip_report_logs_each_path_once(caplog):
    report = SkipReport()
    for _ in range(3):
        report.skip("/x/a.flac", "missing audio file")
    assert report.total == 3
    assert sum("/x/a.flac" in r.getMessage() for r in caplog.records) == 1


def test_features_shape_normalization_and_specaugment_only_in_training(corpus):
    from jobs.features.filterbanks import SpecAugment
    from jobs.sections import FeatureConfig

    utts, _ = read_corpus(corpus / "dev.jsonl")
    feats = Fbank(80)(load_audio(utts[0].path))
    assert feats.shape[1] == 80
    assert abs(feats.shape[0] - utts[0].duration * 100) <= 2
    assert torch.allclose(feats.mean(0), torch.zeros(80), atol=1e-4)
    assert torch.allclose(feats.std(0), torch.ones(80), atol=1e-3)
    batch = feats.unsqueeze(0).repeat(4, 1, 1)
    masked = SpecAugment(FeatureConfig(freq_mask=10, time_mask=10))(batch)
    assert masked.shape == batch.shape and (masked == 0).any() and not torch.equal(masked, batch)
    assert torch.equal(SpecAugment(FeatureConfig(freq_mask=0, time_mask=0))(batch), batch)


def test_lines_that_are_not_utf8_are_skipped_and_counted_with_file_and_line(corpus, tmp_path):
    rows = [json.loads(line) for line in (corpus / "dev.jsonl").read_text().splitlines()[:3]]
    for row in rows:
        row["audio_filepath"] = str(corpus / row["audio_filepath"])
    lines = [json.dumps(r).encode() for r in rows]
    lines[1] = lines[1].replace(b'"text": "', b'"text": "caf\xe9 ')  # Latin-1, not UTF-8
    manifest = tmp_path / "dev.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    utts, skipped = read_corpus(manifest)
    assert len(utts) == 2 and skipped.counts == {"line not UTF-8": 1}
    assert skipped.items[0][0] == f"{manifest}:2"

    root = tmp_path / "dev"
    shutil.copytree(corpus / "dev", root)
    trans = sorted(root.rglob("*.trans.txt"))[0]
    first, *rest = trans.read_bytes().splitlines()
    utt_id = first.split(b" ")[0].decode()
    trans.write_bytes(b"\n".join([first + b" na\xefve", *rest]) + b"\n")
    utts, skipped = read_corpus(root)
    assert len(utts) == 20 - 1 and utt_id not in {u.id for u in utts}
    assert skipped.counts == {"line not UTF-8": 1}  # one utterance, counted once (not also "no transcript")
    assert f"{trans}:1" in skipped.items[0][0]


def test_an_utterance_longer_than_the_limit_is_skipped_without_loading_it(tmp_path, monkeypatch, caplog):
    from jobs.data.manifests import AudioError
    from jobs.sections import DataConfig

    assert DataConfig(train=tmp_path).max_utterance_seconds == 60.0
    long = tmp_path / "two-hours.flac"
    with sf.SoundFile(long, "w", samplerate=1000, channels=1, format="FLAC") as f:  # silence compresses to ~nothing
        for _ in range(72):
            f.write(np.zeros(100_000, dtype=np.int16))
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(16000, dtype=np.float32), 16000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": p.name, "duration": 1.0, "text": "go"}) + "\n"
                                for p in (long, short)))

    def no_reading(*args, **kwargs):
        raise AssertionError("a file over the limit was read")

    monkeypatch.setattr(sf.SoundFile, "read", no_reading)
    monkeypatch.setattr(sf, "read", no_reading)
    utts, skipped = read_corpus(manifest, max_seconds=60.0)
    assert [u.path for u in utts] == [short]
    assert skipped.counts == {"longer than data.max_utterance_seconds": 1}
    assert any("two-hours.flac" in r.getMessage() and "7200 s > 60 s" in r.getMessage() for r in caplog.records)
    with pytest.raises(AudioError, match="longer than data.max_utterance_seconds"):
        load_audio(long, max_seconds=60.0)  # a file that grew after indexing is not loaded either


def test_audio_with_samples_that_are_not_finite_or_a_rate_too_costly_to_resample_is_unreadable(tmp_path):
    """A float WAV of NaNs made features of NaNs (a non-finite loss, rollbacks, a stopped job);
    a header's 96,001 Hz had torchaudio build a kernel of 1.5 G taps (the process was killed), its
    1 Hz made a few bytes of file millions of samples."""
    from jobs.data.manifests import MAX_RESAMPLE_TAPS, ODD_RATE, UNREADABLE, AudioError

    nan = np.zeros((1600, 1), dtype=np.float32)
    nan[100] = np.nan
    cases = {"nan.wav": audio_bytes(samples=nan, subtype="FLOAT"), "odd.wav": audio_bytes(0.1, rate=96_001),
             "prime.wav": audio_bytes(0.1, rate=7919), "slow.wav": audio_bytes(samples=np.zeros((60, 1)), rate=1)}
    found = {}
    for name, data in cases.items():
        with pytest.raises(AudioError) as caught:
            load_audio(io.BytesIO(data))
        found[name] = (caught.value.reason, caught.value.detail)
    assert found == {"nan.wav": (UNREADABLE, "samples that are not finite numbers"), "odd.wav": (ODD_RATE, "96001 Hz"),
                     "prime.wav": (ODD_RATE, "7919 Hz"), "slow.wav": (ODD_RATE, "1 Hz")}
    assert 7919 * 16_000 > MAX_RESAMPLE_TAPS
    for rate in (8000, 11_025, 22_050, 44_100, 48_000, 96_000, 5512):  # the usual ones resample as before
        assert load_audio(io.BytesIO(audio_bytes(0.1, rate=rate))).shape == (1600,)


def test_audio_shorter_than_a_filterbank_window_is_skipped_when_listed_and_refused_when_read(tmp_path):
    """The fuzzer's find: a WAV of 150 samples passed the manifest's checks, and its filterbank
    (a 25 ms window, reflect-padded) raised a RuntimeError that stopped the job."""
    from jobs.data.manifests import TOO_SHORT, AudioError

    for name, seconds in [("tick.wav", 150 / 16_000), ("fine.wav", 0.05)]:
        (tmp_path / name).write_bytes(audio_bytes(seconds))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"audio_filepath": name, "text": "go"}) + "\n"
                                              for name in ("tick.wav", "fine.wav")))
    utterances, skipped = read_corpus(tmp_path / "m.jsonl")
    assert [u.id for u in utterances] == ["fine"] and skipped.counts == {TOO_SHORT: 1}
    with pytest.raises(AudioError, match=r"^shorter than 50 ms \(9 ms\)$"):
        load_audio(tmp_path / "tick.wav")
    assert Fbank()(load_audio(tmp_path / "fine.wav")).shape == (6, 80)
