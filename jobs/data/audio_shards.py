"""Audio shards: a corpus's audio and transcripts packed into WebDataset-style tar files at a local
folder or a URI that `pyarrow.fs` opens (`s3://bucket/corpus?endpoint_override=...`), streamed
back one shard at a time (`chorus shards MANIFEST --out URI --shard-mb N`).

The folder holds `shards.json` (the index: format version, each shard's name, utterance count and
seconds, the totals, the log-mel channels carried if any, and what was skipped) and `shard-<n>.tar`
files, each a sequence of `<id>.<audio extension>` (the source file's bytes, unchanged; `.audio`
for a file without one), optionally `<id>.mel` (its log-mel power, float16, `--features`) and
`<id>.json` ({"text", "duration"}; with features also "frames" and "power", the mean sample power)
members, about `shard_mb` of audio each. A member's id is its name up to the last dot (ids may hold
dots). Whoever plans who reads what needs only the index (names and counts); a reader holds one
member at a time, never a whole shard.

Shards may come from anyone's bucket, so nothing read is trusted: an index that is not one is a
`DataError`; an index entry whose name is not a plain file name of the folder (`../x`, `/x`) or
that is malformed is left out (`AudioShards.skipped`); a member whose JSON lacks a field or has one
of the wrong type is read as an `UnusableMember`; and an utterance decodes to no more audio (or
features) than its stated duration allows, nor than the reader's `max_seconds`.

Example:
    >>> write_audio_shards("data/tiny/train.jsonl", "s3://bucket/tiny-train?endpoint_override=127.0.0.1:9000")
    {'utterances': 2000, 'shards': 4, ...}
    >>> shards = AudioShards("s3://bucket/tiny-train?endpoint_override=127.0.0.1:9000")
    >>> next(shards.read(shards.names[0])).text
    'go left'
    >>> next(shards.read(shards.names[0])).waveform.shape
    torch.Size([12800])
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from jobs.data import tar_stream
from jobs.data.manifests import (
    LONGER_THAN_STATED,
    MALFORMED_ENTRY,
    SHORTEST_S,
    STATED_SLACK_S,
    TOO_LONG,
    TOO_SHORT,
    AudioError,
    DataError,
    Record,
    SkipReport,
    load_audio,
    read_corpus,
)
from jobs.features.filterbanks import Fbank, frames_in

INDEX = "shards.json"
TEXTS = "texts.txt"
READ_BUFFER = 16 << 20  # bytes a shard's reader asks the store for at once (one buffer a learner: one shard is open
# at a time); fewer, larger requests cost the store less (bench/README, "Shards at scale", has the measurements)
FORMAT = "chorus-audio-shards"
VERSION = 1
MAX_INDEX = 64 << 20  # bytes of an index read at most (~60 a shard: a million shards fit); more is not one of ours
MAX_UTTERANCES = 1 << 31  # a shard's count at most (a tar of that many utterances would be terabytes); 2^64 was an
# OverflowError in the stream's arithmetic
NO_EXTENSION = ".audio"  # an audio member's extension when its file had none
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a shard's name: a file of the shards' folder, no path
NOT_PLAIN = "shard name not a plain file name"
MALFORMED_MEMBER = "malformed shard member"
UNREADABLE_FEATURES = "unreadable features"


class _Meta(Record):
    """A member's JSON."""
    text: str
    duration: float = Field(ge=0)
    frames: int = Field(0, ge=0)
    power: float = Field(0.0, ge=0)


class _Entry(Record):
    """A shard of the index."""
    name: str
    utterances: int = Field(ge=0, le=MAX_UTTERANCES)


@dataclass(frozen=True)
class UnusableMember:
    """A member whose JSON is not a usable one: `detail` says why (its skip reason: MALFORMED_MEMBER)."""
    id: str
    detail: str


@dataclass(frozen=True)
class ShardUtterance:
    id: str
    text: str
    duration: float
    audio: bytes  # the audio file's bytes, as the manifest's file held them
    mel: bytes | None = None  # its log-mel power, float16 (frames, bins), when the shards carry features
    frames: int = 0
    power: float = 0.0  # its mean sample power (for noise at an SNR in the log-mel domain)
    mel_bins: int | None = None  # the channels of its log-mel power (the index's)
    max_seconds: float = math.inf  # the longest it may decode to (whoever reads it says)

    @property
    def allowed_seconds(self) -> float:
        """What it may decode to: its stated duration (and a little), and at most `max_seconds`."""
        return min(self.max_seconds, self.duration + STATED_SLACK_S)

    @property
    def waveform(self) -> torch.Tensor:
        """Mono float32 at 16 kHz (`jobs.data.manifests.load_audio`: raises AudioError when unreadable
        or longer than `allowed_seconds`, whatever the JSON said)."""
        try:
            return load_audio(io.BytesIO(self.audio), self.allowed_seconds)
        except AudioError as exc:
            if exc.reason == TOO_LONG and self.allowed_seconds < self.max_seconds:
                raise AudioError(LONGER_THAN_STATED, f"{exc.detail}; its JSON says {self.duration:g} s") from None
            raise

    @property
    def log_mel(self) -> torch.Tensor:
        """The precomputed log-mel power (frames, bins), float32 (`Fbank.log_mel` of the audio)."""
        if self.mel is None:
            raise AudioError("no features", "these shards carry audio only (write them with --features)")
        if self.frames < frames_in(SHORTEST_S):  # (normalizing one frame divides by a deviation of NaN)
            raise AudioError(TOO_SHORT, f"{self.frames} frames")
        frames_allowed = frames_in(self.allowed_seconds)
        if self.frames > frames_allowed:
            reason = TOO_LONG if self.allowed_seconds == self.max_seconds else LONGER_THAN_STATED
            raise AudioError(reason, f"{self.frames} frames, over the {frames_allowed:.0f} of "
                                     f"{self.allowed_seconds:g} s")
        bins = self.mel_bins or len(self.mel) // (2 * self.frames)
        if not bins or len(self.mel) != 2 * self.frames * bins:
            raise AudioError(UNREADABLE_FEATURES, f"{len(self.mel)} bytes are not {self.frames} frames of "
                             f"{bins} float16 channels")
        values = np.frombuffer(self.mel, dtype=np.float16).reshape(self.frames, bins)
        if not np.isfinite(values).all():
            raise AudioError(UNREADABLE_FEATURES, "values that are not finite numbers")
        return torch.from_numpy(values.astype(np.float32))


def filesystem(location: str | Path):
    """(pyarrow filesystem, root path) of a local folder or a URI; a URI it cannot open is one line."""
    import pyarrow.fs

    location = str(location)
    if "://" not in location:
        return pyarrow.fs.LocalFileSystem(), str(Path(location).resolve())
    try:
        return pyarrow.fs.FileSystem.from_uri(location)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors vary by scheme
        raise DataError(f"{location.split('?')[0]}: cannot open it ({str(exc).splitlines()[0]})") from None


def write_audio_shards(manifest: str | Path, out: str | Path, shard_mb: float = 64.0, seed: int = 0,
                       mel_bins: int | None = None) -> dict:
    """Pack MANIFEST's readable utterances into shards at `out`; returns the index's totals. The
    utterances are dealt to shards in an order shuffled by `seed` (each shard a sample of the whole
    corpus), and each shard holds its own in order of duration (a learner streaming it cuts batches
    of similar lengths without sorting). `texts.txt` holds every transcript, a line each, for the
    tokenizer and the lexicon (no learner reads the audio for them). With `mel_bins`, each
    utterance also carries its log-mel power of that many channels (`<id>.mel`, float16)."""
    utterances, skipped = read_corpus(manifest)
    if not utterances:
        raise DataError(f"no usable utterances in {manifest}: {skipped.describe()}")
    fs, root = filesystem(out)
    fs.create_dir(root, recursive=True)
    shards, dealt = [], _deal(utterances, shard_mb * 2**20, seed)
    fbank = Fbank(mel_bins) if mel_bins else None
    for members in dealt:
        name = f"shard-{len(shards):06d}.tar"
        with fs.open_output_stream(f"{root}/{name}") as stream, tarfile.open(fileobj=stream, mode="w|") as tar:
            for utt in members:
                for member, data in _members(utt, fbank):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append({"name": name, "utterances": len(members),
                       "seconds": round(sum(u.duration for u in members), 3)})
    with fs.open_output_stream(f"{root}/{TEXTS}") as stream:
        stream.write("".join(f"{u.text}\n" for members in dealt for u in members).encode())
    index = {"format": FORMAT, "version": VERSION, "source": str(manifest), "shards": shards,
             "utterances": len(utterances), "hours": round(sum(u.duration for u in utterances) / 3600, 3),
             "mel_bins": mel_bins, "skipped": dict(skipped.counts)}
    with fs.open_output_stream(f"{root}/{INDEX}") as stream:  # last: a folder without it was never finished
        stream.write(json.dumps(index, indent=1, allow_nan=False).encode())
    return {k: v for k, v in index.items() if k != "shards"} | {"shards": len(shards), "out": str(out)}


def _members(utt, fbank: Fbank | None) -> list[tuple[str, bytes]]:
    """An utterance's tar members: its audio file, its log-mel power (with `fbank`), its json."""
    audio, suffix = _audio_file(utt)
    meta, members = {"text": utt.text, "duration": utt.duration}, [(f"{utt.id}{suffix}", audio)]
    if fbank is not None:
        waveform = load_audio(io.BytesIO(audio))
        mel = fbank.log_mel(waveform).numpy().astype(np.float16)
        meta.update(frames=mel.shape[0], power=float(waveform.pow(2).mean()))
        members.append((f"{utt.id}.mel", mel.tobytes()))
    return members + [(f"{utt.id}.json", json.dumps(meta, allow_nan=False).encode())]


def _audio_file(utt) -> tuple[bytes, str]:
    """An utterance's audio as a file's bytes and extension: its file's, or for a Lhotse cut (a
    segment of a recording, perhaps) its samples as Lhotse loads them, written as 16 kHz FLAC."""
    if utt.cut is None:
        return Path(utt.path).read_bytes(), Path(utt.path).suffix or NO_EXTENSION
    import soundfile

    from jobs.data.manifests import utterance_audio

    out = io.BytesIO()
    soundfile.write(out, utterance_audio(utt).numpy(), 16_000, format="FLAC")
    return out.getvalue(), ".flac"


def _size(utt) -> float:
    """An utterance's bytes in a shard, for sizing shards: its file's, or a cut's as 16-bit audio."""
    return Path(utt.path).stat().st_size if utt.cut is None else utt.duration * 32_000


def _deal(utterances: list, shard_bytes: float, seed: int) -> list[list]:
    """The utterances in shards of about `shard_bytes` of audio each (by file size): taken in an
    order shuffled by `seed`, each shard sorted by duration."""
    order = np.random.default_rng(seed).permutation(len(utterances))
    shards, size = [[]], 0
    for i in order.tolist():
        if shards[-1] and size >= shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(utterances[i])
        size += _size(utterances[i])
    return [sorted(members, key=lambda u: (u.duration, u.id)) for members in shards]


class AudioShards:
    """The shards at a folder or URI: `names` and `counts` from the index alone (its unusable
    entries left out, counted in `skipped`); `read(name)` streams one shard's utterances."""

    def __init__(self, location: str | Path):
        self.location = str(location)
        self.fs, self.root = filesystem(location)
        where = f"{self.location.split('?')[0]}/{INDEX}"
        index = self._index(where)
        self.mel_bins = index.get("mel_bins")  # the log-mel channels each utterance carries; None: audio only
        if self.mel_bins is not None and (type(self.mel_bins) is not int or self.mel_bins < 1):
            raise DataError(f"{where}: mel_bins is {self.mel_bins!r}, not a number of channels")
        self.skipped, self.counts = SkipReport(), {}
        for i, item in enumerate(index["shards"]):
            entry, problem = _Entry.checked(item)
            if entry is not None and not PLAIN_NAME.fullmatch(entry.name):
                self.skipped.skip(f"{where}: shard {entry.name!r}", NOT_PLAIN, f"{INDEX}#{i}")
            elif entry is None or entry.name in self.counts:
                self.skipped.skip(f"{where}: shard {i} ({problem or 'listed twice'})", MALFORMED_ENTRY,
                                  f"{INDEX}#{i}")
            else:
                self.counts[entry.name] = entry.utterances
        self.names = list(self.counts)
        self.utterances = sum(self.counts.values())

    def _index(self, where: str) -> dict:
        """The index, checked to be one of ours with a list of shards; else a DataError."""
        try:
            with self.fs.open_input_stream(f"{self.root}/{INDEX}") as stream:
                raw = stream.read(MAX_INDEX + 1)
        except OSError:  # FileNotFoundError too
            raise DataError(f"{self.location.split('?')[0]}: no {INDEX} there (write shards with "
                            f"`chorus shards MANIFEST --out URI`)") from None
        try:
            index = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
            index = None
        if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION \
                or not isinstance(index.get("shards"), list):
            raise DataError(f"{where}: not a version-{VERSION} {FORMAT} index")
        return index

    def read(self, name: str, skip: int = 0, max_seconds: float = math.inf
             ) -> Iterator[ShardUtterance | UnusableMember]:
        """The utterances of shard `name`, in order, after its first `skip` (passed over
        undecoded), one member in memory at a time; each decodes to at most `max_seconds`. A
        member whose JSON is unusable comes as an `UnusableMember`. A shard that cannot be opened
        or read raises OSError or tarfile.TarError; one that ends early just ends (its reader counts)."""
        with self.fs.open_input_stream(f"{self.root}/{name}", buffer_size=READ_BUFFER) as stream:
            parts: dict[str, bytes] = {}  # the current utterance's members before its json: audio (and mel)
            key = None
            for member, data in tar_stream.members(stream):
                name_key, _, ext = member.rpartition(".") if "." in member else (member, "", "")
                if ext != "json":
                    if name_key != key:
                        parts, key = {}, name_key
                    parts["mel" if ext == "mel" else "audio"] = data
                    continue
                if name_key != key or "audio" not in parts:
                    raise tarfile.ReadError(f"{member!r} has no audio before it")
                if skip > 0:
                    skip -= 1
                else:
                    yield self._utterance(key, data, parts, max_seconds)
                parts, key = {}, None

    def _utterance(self, key: str, data: bytes, parts: dict[str, bytes],
                   max_seconds: float) -> ShardUtterance | UnusableMember:
        try:
            meta, problem = _Meta.checked(json.loads(data))
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
            meta, problem = None, "its JSON is not JSON"
        if meta is None:
            return UnusableMember(key, problem)
        return ShardUtterance(key, meta.text, meta.duration, parts["audio"], parts.get("mel"), meta.frames,
                              meta.power, self.mel_bins, max_seconds)

    def texts(self, limit: int | None = None) -> list[str]:
        """The corpus's transcripts (`texts.txt`, in the order the shards were dealt: any first
        `limit` of them are a random sample of the corpus; what is not UTF-8 is replaced)."""
        lines = []
        with self.fs.open_input_stream(f"{self.root}/{TEXTS}") as stream:
            for line in io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8", errors="replace"):
                if limit is not None and len(lines) >= limit:
                    break
                lines.append(line.rstrip("\n"))
        return lines
