"""Fuzzing the readers of manifests (`jobs.data.manifests.read_corpus`): NeMo-style JSONL lines of
any JSON, text or bytes, and LibriSpeech-layout folders whose transcripts and audio are anything;
and `chorus lm`'s reading of a manifest's transcripts (`jobs.ngram.write_lm`). A manifest's bad
lines and files are skipped and counted, never raised: no own error but `write_lm`'s ValueError
(one line naming the manifest, and its line). What is listed is an audio file that is there, with
a transcript and a duration within the bound."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.data import manifests
from jobs.data.manifests import read_corpus
from jobs.ngram import write_lm
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input
from tests.jobs.data.hostile import audio_bytes

pytestmark = pytest.mark.unit

SKIP_REASONS = {"missing audio file", "empty audio file", "no transcript", manifests.UNREADABLE, manifests.TOO_LONG,
                manifests.TOO_SHORT, manifests.NOT_UTF8, "malformed manifest line (needs JSON with audio_filepath)"}
AUDIO = {"a.wav": audio_bytes(0.2), "b.flac": audio_bytes(0.3, fmt="FLAC"), "long.wav": audio_bytes(1.5),
         "tick.wav": audio_bytes(0.002), "junk.wav": b"RIFF\0\0\0\0WAVE", "empty.wav": b""}
PATHS = st.sampled_from([*AUDIO, "missing.wav", "", ".", "..", "../beside.txt", "sub", "a.wav\0x", "é.wav"])


def _line(row) -> bytes:
    return row if isinstance(row, bytes) else json.dumps(row).encode()


LINES = st.lists(
    st.fixed_dictionaries({"audio_filepath": PATHS | JSON_VALUES}, optional={"text": st.text(max_size=10) | JSON_VALUES,
                                                                            "duration": JSON_VALUES})
    | JSON_VALUES | st.binary(max_size=20) | st.text(max_size=20).map(str.encode), max_size=6)


def _write_audio(folder) -> None:
    (folder / "sub").mkdir()
    for name, data in AUDIO.items():
        (folder / name).write_bytes(data)


@fuzzed(80)
@given(lines=LINES, max_seconds=st.sampled_from([math.inf, 1.0]), ending=st.sampled_from([b"\n", b"\r\n"]))
@example(lines=[{"audio_filepath": "tick.wav", "text": "go"}], max_seconds=math.inf, ending=b"\n")  # 2 ms: was
# listed, and its filterbank's RuntimeError stopped the job
@example(lines=[b"\xff\xfe", {"audio_filepath": 7, "text": "go"}, {"audio_filepath": "a.wav", "text": ["go"]}],
         max_seconds=1.0, ending=b"\n")
@example(lines=[{"audio_filepath": None}], max_seconds=math.inf, ending=b"\n")  # was a TypeError
def test_a_jsonl_manifest_lists_usable_utterances_and_counts_the_rest(tmp_path, lines, max_seconds, ending):
    with Sandbox(tmp_path) as box, one_input(()):
        _write_audio(box.run)
        manifest = box.run / "m.jsonl"
        manifest.write_bytes(ending.join(_line(row) for row in lines))
        utterances, skipped = read_corpus(manifest, max_seconds)
        _check(utterances, skipped, max_seconds)


def _check(utterances, skipped, max_seconds: float) -> None:
    assert set(skipped.counts) <= SKIP_REASONS, skipped.counts
    for utt in utterances:
        assert utt.path.is_file() and utt.text.strip() and utt.text == utt.text.lower()
        assert manifests.SHORTEST_S <= utt.duration <= max_seconds


@st.composite
def librispeech(draw) -> dict[str, bytes]:
    """A LibriSpeech-layout folder's files (relative path -> bytes): transcripts and audio of any content."""
    ids = draw(st.lists(st.sampled_from(["1-2-0001", "1-2-0002", "3-4-0001", "x", ""]) | st.text(max_size=6),
                        max_size=4, unique=True))
    files = {}
    for utt_id in ids:
        if draw(st.booleans()) and utt_id and "/" not in utt_id and "\0" not in utt_id and utt_id not in (".", ".."):
            files[f"1/2/{utt_id}.flac"] = draw(st.sampled_from(sorted(AUDIO.values())) | edited(AUDIO["b.flac"], 2))
    lines = [f"{utt_id} {draw(st.text(max_size=10))}".encode() for utt_id in ids]
    files["1/2/1-2.trans.txt"] = draw(st.just(b"\n".join(lines)) | edited(b"\n".join(lines), 3))
    return files


@fuzzed(40)
@given(files=librispeech(), max_seconds=st.sampled_from([math.inf, 1.0]))
def test_a_librispeech_folder_lists_usable_utterances_and_counts_the_rest(tmp_path, files, max_seconds):
    with Sandbox(tmp_path) as box, one_input(()):
        for name, data in files.items():
            (box.run / name).parent.mkdir(parents=True, exist_ok=True)
            (box.run / name).write_bytes(data)
        utterances, skipped = read_corpus(box.run, max_seconds)
        _check(utterances, skipped, max_seconds)


@fuzzed(60)
@given(lines=LINES)
@example(lines=[{"audio_filepath": "a.wav", "text": "go left"}, "not an object"])  # was an AttributeError
@example(lines=[b"{not json"])  # was json's message, naming neither the file nor the line
@example(lines=[b"0"])  # JSON, but no object: was an AttributeError
def test_chorus_lm_reads_a_manifests_transcripts_or_names_its_bad_line(tmp_path, lines):
    with Sandbox(tmp_path) as box:
        manifest = box.run / "m.jsonl"
        manifest.write_bytes(b"\n".join(_line(row) for row in lines))
        with one_input(ValueError, starts=""):
            try:
                summary = write_lm(manifest, box.run / "lm.arpa", order=2)
            except ValueError as exc:
                assert str(exc).startswith(f"{manifest}:") or str(exc) == "no words to estimate a language model from"
                raise
            assert summary["sentences"] >= 1 and (box.run / "lm.arpa").is_file()
