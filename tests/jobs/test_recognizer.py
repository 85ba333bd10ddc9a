"""A trained model put to use (jobs/recognizer.py, jobs/transcription.py, jobs/data/audio_inputs.py):
audio given as files, folders, manifests or arrays (any rate, stereo) transcribes to the text its
16 kHz mono reading gives; inputs keep their order and what cannot be used is counted by reason;
the module's docstring example runs."""

import doctest
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

import jobs.recognizer
from jobs.data.audio_inputs import read_inputs
from jobs.data.manifests import TOO_LONG, TOO_SHORT, UNREADABLE, AudioError, mono_16k
from jobs.recognizer import SpeechRecognizer
from jobs.transcription import ClipTranscriber
from tests.builders import checkpoint_state

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def state(corpus):
    return checkpoint_state(corpus)


def _first_audio(corpus, split="test", n=3):
    rows = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()[:n]]
    return [(corpus / row["audio_filepath"]).resolve() for row in rows], [row["text"] for row in rows]


def test_files_arrays_other_rates_and_stereo_transcribe_as_their_16k_mono_reading(state, corpus, tmp_path):
    recognizer = SpeechRecognizer.from_checkpoint(state, device="cpu")
    paths, _ = _first_audio(corpus)
    samples, rate = sf.read(paths[0], dtype="float32")
    assert rate == 16000
    stereo = np.stack([samples, samples], axis=1)
    sf.write(tmp_path / "stereo.wav", stereo, 16000)
    texts = recognizer.transcribe([paths[0], tmp_path / "stereo.wav", samples, torch.from_numpy(samples),
                                   (stereo, 16000)])
    assert texts[0] != "" and len(set(texts)) == 1, texts  # (an untrained model: letters, the same ones)
    at_48k = torchaudio.functional.resample(torch.from_numpy(samples), 16000, 48000).numpy()
    back = mono_16k(at_48k, 48000)  # what a 48 kHz array is read as: the same frames
    assert len(back) == len(samples) and float((back - torch.from_numpy(samples)).abs().max()) < 0.02
    assert isinstance(recognizer.transcribe([(at_48k, 48000)])[0], str)
    with pytest.raises(AudioError, match=TOO_SHORT):
        recognizer.transcribe([np.zeros(100, dtype=np.float32)])
    with pytest.raises(AudioError, match="not finite"):
        recognizer.transcribe([np.full(16000, np.nan, dtype=np.float32)])


def test_a_batch_transcribes_as_its_utterances_alone_in_evaluation_order(state, corpus):
    recognizer = SpeechRecognizer.from_checkpoint(state, device="cpu")
    paths, _ = _first_audio(corpus, n=6)
    together = recognizer.transcribe(paths)
    assert together == recognizer.transcribe(paths[::-1])[::-1]  # the order given does not change a text
    assert sum(t != "" for t in together) >= 5


def _mixed_inputs(corpus, tmp_path) -> tuple[list[Path], list[Path], list[str], Path]:
    """A manifest (a line not JSON), a LibriSpeech-like folder (a file not audio, a 40-sample click)
    and a 3 s file: the inputs, the corpus's files they name, those files' transcripts, the folder."""
    paths, texts = _first_audio(corpus, n=3)
    folder = tmp_path / "folder" / "1" / "2"
    folder.mkdir(parents=True)
    for path in paths[:2]:
        shutil.copy(path, folder / path.name)
    (folder / "1-2.trans.txt").write_text(f"{paths[0].stem} {texts[0].upper()}\n")
    (folder / "junk.wav").write_bytes(b"RIFF not audio")
    sf.write(folder / "click.wav", np.zeros(40, dtype=np.float32), 16000)
    sf.write(tmp_path / "long.flac", np.zeros(16000 * 3, dtype=np.float32), 16000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": str(paths[2])}) + "\n" + "{not json\n"
                        + json.dumps({"audio_filepath": str(paths[1]), "text": "Go"}) + "\n")
    return [manifest, tmp_path / "folder", tmp_path / "long.flac"], paths, texts, folder


def test_inputs_keep_their_order_take_references_and_count_what_they_skip(corpus, tmp_path):
    inputs, paths, texts, folder = _mixed_inputs(corpus, tmp_path)
    clips, report = read_inputs(inputs, max_seconds=2.5)
    assert [c.path for c in clips] == [paths[2], paths[1], folder / paths[0].name, folder / paths[1].name]
    assert [c.reference for c in clips] == [None, "go", texts[0].lower(), None]
    assert all(c.duration > 0.5 for c in clips)
    assert dict(report.counts) == {"malformed manifest line (needs JSON with audio_filepath)": 1, UNREADABLE: 1,
                                   TOO_SHORT: 1, TOO_LONG: 1}


def test_inputs_not_probed_where_read_are_probed_by_the_transcriber_and_skipped_alike(state, corpus, tmp_path):
    """On Ray the driver lists the inputs without opening them; each actor probes its clips' headers."""
    inputs, _, _, _ = _mixed_inputs(corpus, tmp_path)
    short = {**state, "spec": {**state["spec"], "data": {**state["spec"]["data"], "max_utterance_seconds": 2.5}}}
    probed, report = ClipTranscriber.read_inputs(inputs, short)
    listed, listing_report = ClipTranscriber.read_inputs(inputs, short, probe=False)
    assert [r["path"] for r in listed if r["path"] in {p["path"] for p in probed}] == [p["path"] for p in probed]
    assert all(r["duration"] is None for r in listed) and listing_report.total == 1  # the line not JSON
    transcriber = ClipTranscriber.from_checkpoint(short, device="cpu")
    out = transcriber(listed)
    assert [r["path"] for r in out] == [r["path"] for r in listed]
    assert Counter(r["skipped"] for r in out if "skipped" in r) + listing_report.counts == report.counts
    assert next(r for r in out if r["path"].endswith("long.flac"))["detail"] == "3 s > 2.5 s"
    assert [r for r in out if "skipped" not in r] == transcriber(probed)  # the same durations and texts


def test_a_clip_unusable_once_read_comes_back_skipped_in_its_place(state, corpus, tmp_path):
    paths, _ = _first_audio(corpus, n=2)
    bad = tmp_path / "nan.wav"
    sf.write(bad, np.full(16000, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    transcriber = ClipTranscriber.from_checkpoint(state, device="cpu")
    records = [{"id": p.stem, "path": str(p), "duration": 1.0} for p in (paths[0], bad, paths[1])]
    out = transcriber(records)
    assert [r["id"] for r in out] == [paths[0].stem, "nan", paths[1].stem]
    assert "text" in out[0] and "text" in out[2] and out[1]["skipped"] == UNREADABLE and "text" not in out[1]


def test_a_decoding_the_checkpoint_lacks_the_means_for_is_refused_in_one_line(state):
    with pytest.raises(ValueError, match="carries no language model"):
        SpeechRecognizer.from_checkpoint(state, decoding="lm")
    elsewhere = {**state, "spec": {**state["spec"], "data": {**state["spec"]["data"], "train": "/nowhere/train.jsonl"}}}
    with pytest.raises(ValueError, match=r"lexicon decoding: this checkpoint carries no words .* /nowhere/train.jsonl"):
        SpeechRecognizer.from_checkpoint(elsewhere, decoding="lexicon")
    assert SpeechRecognizer.from_checkpoint(state, decoding="lexicon").transcribe([])  == []  # its data is here


def test_the_modules_example_runs(state, corpus):
    paths, _ = _first_audio(corpus, n=1)
    samples, _ = sf.read(paths[0], dtype="float32")
    at_8k = samples[::2]
    globs = {"SpeechRecognizer": SpeechRecognizer, "state": state, "wav_path": paths[0], "samples": at_8k}
    results = doctest.testmod(jobs.recognizer, extraglobs=globs, raise_on_error=True)
    assert results.attempted == 3
