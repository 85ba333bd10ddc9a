"""Audio shards: a corpus's audio and transcripts packed into WebDataset-style tar files at a local
folder or a URI that `pyarrow.fs` opens (`s3://bucket/corpus?endpoint_override=...`), streamed
back one shard at a time (`chorus shards MANIFEST --out URI --shard-mb N`).

The folder holds `shards.json` (the index: format version, each shard's name, utterance count and
seconds, the totals, the log-mel channels carried if any, and what was skipped) and `shard-<n>.tar`
files, each a sequence of `<id>.<audio extension>` (the source file's bytes, unchanged),
optionally `<id>.mel` (its log-mel power, float16, `--features`) and `<id>.json` ({"text",
"duration"}; with features also "frames" and "power", the mean sample power) members, about
`shard_mb` of audio each. Whoever plans who reads what needs only the index (names and counts); a
reader holds one member at a time, never a whole shard.

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
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from jobs.data import tar_stream
from jobs.data.manifests import AudioError, DataError, load_audio, read_corpus
from jobs.features.filterbanks import Fbank

INDEX = "shards.json"
TEXTS = "texts.txt"
READ_BUFFER = 16 << 20  # bytes a shard's reader asks the store for at once (one buffer a learner: one shard is open
# at a time); fewer, larger requests cost the store less (bench/README, "Shards at scale", has the measurements)
FORMAT = "chorus-audio-shards"
VERSION = 1


@dataclass(frozen=True)
class ShardUtterance:
    id: str
    text: str
    duration: float
    audio: bytes  # the audio file's bytes, as the manifest's file held them
    mel: bytes | None = None  # its log-mel power, float16 (frames, bins), when the shards carry features
    frames: int = 0
    power: float = 0.0  # its mean sample power (for noise at an SNR in the log-mel domain)

    @property
    def waveform(self) -> torch.Tensor:
        """Mono float32 at 16 kHz (`jobs.data.manifests.load_audio`: raises AudioError when unreadable)."""
        return load_audio(io.BytesIO(self.audio))

    @property
    def log_mel(self) -> torch.Tensor:
        """The precomputed log-mel power (frames, bins), float32 (`Fbank.log_mel` of the audio)."""
        if self.mel is None:
            raise AudioError("no features", "these shards carry audio only (write them with --features)")
        values = np.frombuffer(self.mel, dtype=np.float16)
        if self.frames <= 0 or values.size % self.frames:
            raise AudioError("unreadable features", f"{values.size} values are not {self.frames} frames")
        return torch.from_numpy(values.reshape(self.frames, -1).astype(np.float32))


def _filesystem(location: str | Path):
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
    fs, root = _filesystem(out)
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
    audio = Path(utt.path).read_bytes()
    meta, members = {"text": utt.text, "duration": utt.duration}, [(f"{utt.id}{Path(utt.path).suffix}", audio)]
    if fbank is not None:
        waveform = load_audio(io.BytesIO(audio))
        mel = fbank.log_mel(waveform).numpy().astype(np.float16)
        meta.update(frames=mel.shape[0], power=float(waveform.pow(2).mean()))
        members.append((f"{utt.id}.mel", mel.tobytes()))
    return members + [(f"{utt.id}.json", json.dumps(meta, allow_nan=False).encode())]


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
        size += Path(utterances[i].path).stat().st_size
    return [sorted(members, key=lambda u: (u.duration, u.id)) for members in shards]


class AudioShards:
    """The shards at a folder or URI: `names` and `counts` from the index alone; `read(name)`
    streams one shard's utterances."""

    def __init__(self, location: str | Path):
        self.location = str(location)
        self.fs, self.root = _filesystem(location)
        try:
            with self.fs.open_input_stream(f"{self.root}/{INDEX}") as stream:
                index = json.loads(stream.read())
        except (FileNotFoundError, OSError):
            raise DataError(f"{self.location.split('?')[0]}: no {INDEX} there (write shards with "
                            f"`chorus shards MANIFEST --out URI`)") from None
        if index.get("format") != FORMAT or index.get("version") != VERSION:
            raise DataError(f"{self.location.split('?')[0]}/{INDEX}: not a version-{VERSION} {FORMAT} index")
        self.mel_bins = index.get("mel_bins")  # the log-mel channels each utterance carries; None: audio only
        self.names = [s["name"] for s in index["shards"]]
        self.counts = {s["name"]: s["utterances"] for s in index["shards"]}
        self.utterances = sum(self.counts.values())

    def read(self, name: str, skip: int = 0) -> Iterator[ShardUtterance]:
        """The utterances of shard `name`, in order, after its first `skip` (passed over
        undecoded), one member in memory at a time. A shard that cannot be opened or read raises
        OSError or tarfile.TarError; one that ends early just ends (its reader counts)."""
        with self.fs.open_input_stream(f"{self.root}/{name}", buffer_size=READ_BUFFER) as stream:
            parts: dict[str, bytes] = {}  # the current utterance's members before its json: audio (and mel)
            key = None
            for member, data in tar_stream.members(stream):
                name_key, _, ext = member.partition(".")
                if ext != "json":
                    if name_key != key:
                        parts, key = {}, name_key
                    parts["mel" if ext == "mel" else "audio"] = data
                    continue
                if name_key != key or "audio" not in parts:
                    raise tarfile.ReadError(f"{member} has no audio before it")
                if skip > 0:
                    skip -= 1
                else:
                    meta = json.loads(data)
                    yield ShardUtterance(key, meta["text"], meta["duration"], parts["audio"], parts.get("mel"),
                                         meta.get("frames", 0), meta.get("power", 0.0))
                parts, key = {}, None

    def texts(self, limit: int | None = None) -> list[str]:
        """The corpus's transcripts (`texts.txt`, in the order the shards were dealt: any first
        `limit` of them are a random sample of the corpus)."""
        lines = []
        with self.fs.open_input_stream(f"{self.root}/{TEXTS}") as stream:
            for line in io.TextIOWrapper(io.BufferedReader(stream), encoding="utf-8"):
                if limit is not None and len(lines) >= limit:
                    break
                lines.append(line.rstrip("\n"))
        return lines
