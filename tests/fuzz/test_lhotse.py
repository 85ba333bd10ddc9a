"""Fuzzing the Lhotse readers (`jobs.data.lhotse_corpora`): a CutSet manifest of any lines (cuts with
fields changed, other JSON, bytes; gzipped or not), and a Shar directory whose cuts manifest and tar
are edited at random. What is listed or streamed is a single recording's cut of a file (never a
shell command's or a URL's audio), with a transcript and a duration within the bound, whose audio
loads or is an AudioError; the rest is skipped and counted, never raised (a Shar shard with
nothing usable: DataError, one line)."""

from __future__ import annotations

import gzip
import json
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from jobs.data import lhotse_corpora, manifests, shard_stream
from jobs.data.manifests import AudioError, DataError, read_corpus, utterance_audio
from jobs.data.shard_stream import StreamCorpus
from jobs.features.filterbanks import Fbank
from jobs.tokenizer import CharTokenizer
from tests.fuzz.fuzzing import JSON_VALUES, Sandbox, edited, fuzzed, one_input
from tests.jobs.data.hostile import audio_bytes

pytestmark = pytest.mark.unit

SKIP_REASONS = {lhotse_corpora.MALFORMED_CUT, lhotse_corpora.NO_TRANSCRIPT, lhotse_corpora.UNREADABLE_MANIFEST,
                manifests.TOO_SHORT, manifests.TOO_LONG}
STREAM_REASONS = {shard_stream.UNREADABLE_SHARD, shard_stream.CUT_SHORT, manifests.UNREADABLE, manifests.TOO_LONG,
                  manifests.TOO_SHORT}
ESCAPE = "touch escaped"  # a `command` source's shell command: run, it would write into the working directory


def _cut(cut_id: str, path: str, seconds: float, text: str | None, source_type: str = "file") -> dict:
    return {"id": cut_id, "start": 0.0, "duration": seconds, "channel": 0, "type": "MonoCut",
            "supervisions": [{"id": cut_id, "recording_id": cut_id, "start": 0.0, "duration": seconds,
                              "channel": 0, **({"text": text} if text is not None else {})}],
            "recording": {"id": cut_id, "sources": [{"type": source_type, "channels": [0],
                                                    "source": ESCAPE if source_type == "command" else path}],
                          "sampling_rate": 16000, "num_samples": int(seconds * 16000), "duration": seconds}}


@st.composite
def cut_lines(draw) -> list:
    """A manifest's lines: cuts of the sandbox's audio with some field changed, other JSON, bytes."""
    cut = _cut("a", "a.wav", 0.3, draw(st.sampled_from(["go left", "", None, "GO"])),
               draw(st.sampled_from(["file", "command", "url", "memory"])))
    if draw(st.booleans()):
        cut[draw(st.sampled_from(["duration", "type", "id", "recording", "supervisions", "start"]))] = draw(
            JSON_VALUES | st.sampled_from([1e9, -1.0, 0.001, float("nan"), "MixedCut", "PaddingCut"]))
    return draw(st.lists(st.just(cut) | JSON_VALUES | st.binary(max_size=20), max_size=4))


def _encoded(row) -> bytes:
    return row if isinstance(row, bytes) else json.dumps(row).encode()


@fuzzed(60)
@given(lines=cut_lines(), gzipped=st.booleans(), max_seconds=st.sampled_from([math.inf, 0.2]))
@example(lines=[_cut("a", "a.wav", 0.3, "go", "command")], gzipped=True, max_seconds=math.inf)  # never run
@example(lines=[_cut("a", "a.wav", 0.3, "go")], gzipped=False, max_seconds=math.inf)  # no gzip: counted, not raised
@example(lines=[_cut("a", f"x; {ESCAPE}; .sph", 0.3, "go")], gzipped=True, max_seconds=math.inf)  # Lhotse's default
# backend read a .sph file through sph2pipe in a shell, the path unquoted
def test_a_cutset_lists_cuts_of_files_with_transcripts_and_counts_the_rest(tmp_path, lines, gzipped, max_seconds):
    with Sandbox(tmp_path) as box, one_input(()):
        (box.run / "a.wav").write_bytes(audio_bytes(0.3))
        for row in lines:  # relative sources: the sandbox's audio, whatever the working directory
            if isinstance(row, dict) and isinstance(row.get("recording"), dict) and row["recording"].get("sources"):
                source = row["recording"]["sources"][0]
                if source.get("type") == "file" and source.get("source") == "a.wav":
                    source["source"] = str(box.run / "a.wav")
        data = b"\n".join(_encoded(row) for row in lines)
        manifest = box.run / "cuts.jsonl.gz"
        manifest.write_bytes(gzip.compress(data) if gzipped else data)
        utterances, skipped = read_corpus(manifest, max_seconds)
        assert set(skipped.counts) <= SKIP_REASONS, skipped.counts
        for utt in utterances:
            assert utt.text.strip() and manifests.SHORTEST_S <= utt.duration <= max_seconds
            assert {s["type"] for s in utt.cut["recording"]["sources"]} == {"file"}
            try:
                assert torch.isfinite(utterance_audio(utt, max_seconds)).all()
            except AudioError:
                pass


@pytest.fixture(scope="module")
def shar(tmp_path_factory):
    """A one-shard Shar directory of three cuts, written by Lhotse."""
    from lhotse import CutSet, Recording, SupervisionSegment
    from lhotse.cut import MonoCut

    folder = tmp_path_factory.mktemp("shar-source")
    cuts = []
    for i, seconds in enumerate([0.3, 0.4, 0.5]):
        (folder / f"{i}.wav").write_bytes(audio_bytes(seconds))
        recording = Recording.from_file(folder / f"{i}.wav", recording_id=f"u{i}")
        cuts.append(MonoCut(id=f"u{i}", start=0.0, duration=recording.duration, channel=0, recording=recording,
                            supervisions=[SupervisionSegment(id=f"u{i}", recording_id=f"u{i}", start=0.0,
                                                             duration=recording.duration, text="go left")]))
    (folder / "shar").mkdir()
    CutSet.from_cuts(cuts).to_shar(folder / "shar", fields={"recording": "flac"}, shard_size=10)
    return {p.name: p.read_bytes() for p in (folder / "shar").iterdir()}


@fuzzed(40)
@given(data=st.data())
def test_a_shar_shard_of_any_bytes_trains_on_what_it_can_and_counts_the_rest(tmp_path, shar, data):
    with Sandbox(tmp_path) as box, one_input(DataError):
        folder = box.run / "shar"
        folder.mkdir()
        cuts = gzip.decompress(shar["cuts.000000.jsonl.gz"])
        (folder / "cuts.000000.jsonl.gz").write_bytes(gzip.compress(data.draw(edited(cuts, 3))))
        (folder / "recording.000000.tar").write_bytes(data.draw(edited(shar["recording.000000.tar"], 4)))
        corpus = StreamCorpus(folder, Fbank(8), lambda: CharTokenizer(), max_seconds=1.0)
        assert all(isinstance(text, str) for text in corpus.texts() + corpus.tokenizer_texts())
        for batch in corpus.batches(0, 1, 0, seed=0, data=SimpleNamespace(max_batch_seconds=2.0, prefetch_batches=0)):
            assert batch.size and torch.isfinite(batch.feats).all() and batch.feats.shape[-1] == 8
        assert set(corpus.skipped.counts) <= STREAM_REASONS, corpus.skipped.counts
