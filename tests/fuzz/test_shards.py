"""Fuzzing the readers of audio shards, which come from anyone's bucket: the tar stream
(jobs/data/tar_stream.py), the index (`AudioShards`) and a learner's stream of batches
(`StreamCorpus`). Own errors: `tarfile.ReadError` from the tar stream; `DataError` from the index
(naming it) and from a stream none of whose utterances could be read. Everything else a shard
holds is skipped and counted by one of the stream's reasons, and every batch's features are finite."""

from __future__ import annotations

import gzip
import io
import tarfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.data import audio_shards, manifests, shard_stream
from jobs.data.audio_shards import INDEX, TEXTS
from jobs.data.manifests import DataError
from jobs.data.shard_stream import StreamCorpus
from jobs.data.tar_stream import members
from jobs.features.filterbanks import Fbank
from jobs.tokenizer import CharTokenizer
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input
from tests.jobs.data.hostile import audio_bytes, shards_folder, tar_header, tar_of, utterance_members

pytestmark = pytest.mark.unit

SKIP_REASONS = {manifests.TOO_LONG, manifests.TOO_SHORT, manifests.UNREADABLE, manifests.ODD_RATE,
                manifests.MALFORMED_ENTRY, manifests.LONGER_THAN_STATED, "empty audio file", "no features",
                audio_shards.NOT_PLAIN, audio_shards.MALFORMED_MEMBER, audio_shards.UNREADABLE_FEATURES,
                shard_stream.UNREADABLE_SHARD, shard_stream.CUT_SHORT}
AUDIO = [audio_bytes(0.2), audio_bytes(0.4, rate=8000, fmt="FLAC"), audio_bytes(2.0), audio_bytes(0.1, rate=7919),
         b"", b"RIFF....WAVEfmt "]
ARCHIVE = tar_of(utterance_members("a.b", {"text": "go", "duration": 0.2}, AUDIO[0])
                 + utterance_members("c", {"text": "stop", "duration": 0.4}, AUDIO[1], ".flac"))


HEADERS = st.builds(lambda size, kind: tar_header(b"utt.wav", size, kind),
                    st.binary(min_size=12, max_size=12) | st.integers(-2**95, 2**95 - 1).map(
    lambda n: n.to_bytes(12, "big", signed=True)) | st.integers(-99, 10**11).map(lambda n: f"{n:011o}\0".encode()),
    st.sampled_from([b"0", b"x", b"L", b"g", b"5"]))


@fuzzed(300)
@given(data=st.one_of(edited(ARCHIVE, 6), st.binary(max_size=2048),
                      st.tuples(HEADERS, st.binary(max_size=1024)).map(b"".join)))
@example(data=tar_header(b"utt.wav", b"\x80" + b"\xff" * 11))  # 2^88 bytes: was an OverflowError
@example(data=tar_header(b"utt.wav", b"-0000000001\0") + b"x" * 600)  # octal -1: was "read the rest of the stream"
@example(data=tar_header(b"utt.wav", b"00000000004\0", b"L") + b"\xff\xfe\0\0" + b"\0" * 508
         + ARCHIVE)  # a GNU long name not UTF-8
def test_the_tar_stream_yields_members_or_raises_read_error(data):
    with one_input(tarfile.ReadError):
        for name, member in members(io.BytesIO(data)):
            assert isinstance(name, str) and len(member) <= len(data)


def _utterance(draw) -> list[tuple[str, bytes]]:
    utt_id = draw(st.sampled_from(["u", "a.b", "x.json", "..", "ü", ""]) | st.text(max_size=6))
    meta = draw(st.fixed_dictionaries({"text": st.sampled_from(["go left", "stop"]), "duration": st.floats(0, 3)})
                | st.fixed_dictionaries({}, optional={k: JSON_VALUES for k in ("text", "duration", "frames", "power")})
                | JSON_VALUES | st.binary(max_size=12))
    audio = draw(st.sampled_from(AUDIO) | edited(AUDIO[0]))
    found = utterance_members(utt_id, meta if isinstance(meta, dict | bytes) else _json(meta), audio,
                              draw(st.sampled_from([".wav", ".flac", ".mel", "", ".json"])))
    if draw(st.booleans()):  # log-mel power too, as `chorus shards --features 8` writes it (of some shape)
        frames, bins = draw(st.integers(0, 40)), draw(st.sampled_from([8, 8, 3]))
        values = draw(st.sampled_from([0.0, -3.5, np.nan, np.inf, 6e4]))
        found.insert(1, (f"{utt_id}.mel", np.full((frames, bins), values, np.float16).tobytes()
                         + draw(st.sampled_from([b"", b"\0"]))))
        if isinstance(meta, dict) and draw(st.booleans()):
            found[-1] = (found[-1][0], _json({**meta, "frames": frames, "power": 0.01}))
    return draw(st.permutations(found)) if draw(st.booleans()) else found


def _json(value) -> bytes:
    import json

    return json.dumps(value).encode()


@st.composite
def shard_folders(draw) -> dict:
    """A folder's shards (name -> bytes as stored) and its index's entries."""
    shards, entries = {}, []
    for i in range(draw(st.integers(1, 3))):
        archive = tar_of([m for _ in range(draw(st.integers(0, 4))) for m in _utterance(draw)])
        name = f"shard-{i}.tar" + (".gz" if draw(st.booleans()) else "")
        stored = gzip.compress(archive) if name.endswith(".gz") else archive
        shards[name] = draw(st.just(stored) | edited(stored, 3))
        entries.append({"name": name, "utterances": draw(st.integers(0, 6) | JSON_VALUES)})
    extra = st.fixed_dictionaries({"name": st.sampled_from(["../escape.tar", "/etc/hostname", "a/../b", "shard-0.tar"])
                                   | st.text(max_size=8), "utterances": st.integers(-2, 3)}) | JSON_VALUES
    entries += draw(st.lists(extra, max_size=2))
    return {"shards": shards, "entries": draw(st.permutations(entries)),
            "mel_bins": draw(st.sampled_from([None, 8]) | JSON_VALUES),
            "texts": draw(st.sampled_from([b"go\nstop\n", b""]) | st.binary(max_size=40))}


@fuzzed(30)
@given(folder=shard_folders(), shard_features=st.booleans())
@example(folder={"shards": {"s.tar": tar_of(utterance_members("u", {"duration": 0.2}, AUDIO[0]))},
                 "entries": [{"name": "s.tar", "utterances": 1}], "mel_bins": None},
         shard_features=False)  # a JSON without text: was a KeyError in the stream (the job aborted)
@example(folder={"shards": {"s.tar": tar_of(utterance_members("a.b", {"text": "go", "duration": 0.1}, AUDIO[2]))},
                 "entries": [{"name": "s.tar", "utterances": 1}, {"name": "../escape.tar", "utterances": 1}],
                 "mel_bins": None}, shard_features=False)  # 2 s of audio stated as 0.1 s, a dotted id, a path
@example(folder={"shards": {"s.tar": tar_of(utterance_members("u", {"text": "go", "duration": 0.1}, AUDIO[3]))},
                 "entries": [{"name": "s.tar", "utterances": 1}], "mel_bins": None},
         shard_features=False)  # 7,919 Hz: was 6 s of resampling a second of audio
@example(folder={"shards": {}, "entries": [{"name": "s.tar", "utterances": -1}], "mel_bins": None},
         shard_features=False)  # was "ValueError: __len__() should return >= 0"
@example(folder={"shards": {}, "entries": [{"name": "s.tar", "utterances": 2**64}], "mel_bins": None},
         shard_features=False)  # was an OverflowError (numpy's cumulative counts, len())
@example(folder={"shards": {}, "entries": [{"utterances": 1}, None, {"name": "s.tar", "utterances": None}],
                 "mel_bins": None}, shard_features=False)  # were a KeyError and TypeErrors
@example(folder={"shards": {"s.tar": tar_of(utterance_members("u", {"text": "go", "duration": 0.0}, AUDIO[0][:200]))},
                 "entries": [{"name": "s.tar", "utterances": 1}], "mel_bins": None},
         shard_features=False)  # 78 samples: the filterbank's RuntimeError stopped the stream
@example(folder={"shards": {}, "entries": [], "mel_bins": None, "texts": b"go \xff\n"},
         shard_features=False)  # texts.txt not UTF-8: was a UnicodeDecodeError (the lexicon's, uncaught)
def test_a_stream_of_any_shards_trains_on_what_it_can_and_counts_the_rest(tmp_path, folder, shard_features):
    with Sandbox(tmp_path) as box, one_input(DataError):
        root = shards_folder(box.run / "shards", {}, folder["entries"], folder["mel_bins"])
        for name, stored in folder["shards"].items():
            (root / name).write_bytes(stored)
        (root / TEXTS).write_bytes(folder.get("texts", b"go\n"))
        corpus = StreamCorpus(root, Fbank(8), lambda: CharTokenizer(), max_seconds=1.0, shard_features=shard_features)
        assert all(isinstance(text, str) for text in corpus.texts() + corpus.tokenizer_texts())
        for batch in corpus.batches(0, 1, 0, seed=0, data=SimpleNamespace(max_batch_seconds=2.0, prefetch_batches=0)):
            assert batch.size and torch.isfinite(batch.feats).all() and batch.feats.shape[-1] == 8
        assert set(corpus.skipped.counts) <= SKIP_REASONS, corpus.skipped.counts


@fuzzed(150)
@given(index=edited(b'{"format": "chorus-audio-shards", "version": 1, "shards": [{"name": "s.tar", "utterances": 2}], '
                    b'"mel_bins": 8}', 5) | st.binary(max_size=64) | JSON_VALUES.map(_json))
@example(index=b"0")  # JSON, but no object: was an AttributeError
@example(index=b"\x00\x00\x00\x00\x00")  # json took it for UTF-32: was a UnicodeDecodeError
@example(index=b"")  # was a JSONDecodeError's traceback
def test_an_index_is_read_or_refused_in_one_line_naming_it(tmp_path, index):
    (tmp_path / INDEX).write_bytes(index)
    with one_input(DataError, starts=f"{tmp_path}/{INDEX}: "):
        shards = audio_shards.AudioShards(tmp_path)
        assert all(audio_shards.PLAIN_NAME.fullmatch(name) for name in shards.names)
        assert shards.utterances == sum(shards.counts.values()) >= 0
