"""Audio shards: a corpus's audio and transcripts packed into WebDataset-style tar files at a local
folder or a URI that `pyarrow.fs` opens (`s3://bucket/corpus?endpoint_override=...`), streamed
back one shard at a time (`chorus shards MANIFEST --out URI --shard-mb N`).

The folder holds `shards.json` (the index: format version, each shard's name, utterance count and
seconds, the totals, and what was skipped) and `shard-<n>.tar` files, each a sequence of
`<id>.<audio extension>` (the source file's bytes, unchanged) and `<id>.json` ({"text",
"duration"}) members, about `shard_mb` of audio each. Whoever plans who reads what needs only the
index (names and counts); a reader holds one member at a time, never a whole shard.

Example:
    >>> write_audio_shards("data/tiny/train.jsonl", "s3://bucket/tiny-train?endpoint_override=127.0.0.1:9000")
    {'utterances': 2000, 'shards': 4, ...}
    >>> shards = AudioShards("s3://bucket/tiny-train?endpoint_override=127.0.0.1:9000")
    >>> next(shards.read(shards.names[0])).text
    'go left'
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from jobs.data import DataError, load_audio, read_corpus

INDEX = "shards.json"
FORMAT = "chorus-audio-shards"
VERSION = 1


@dataclass(frozen=True)
class ShardUtterance:
    id: str
    text: str
    duration: float
    waveform: torch.Tensor  # mono float32 at 16 kHz


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


def write_audio_shards(manifest: str | Path, out: str | Path, shard_mb: float = 64.0) -> dict:
    """Pack MANIFEST's readable utterances into shards at `out`; returns the index's totals."""
    utterances, skipped = read_corpus(manifest)
    if not utterances:
        raise DataError(f"no usable utterances in {manifest}: {skipped.describe()}")
    fs, root = _filesystem(out)
    fs.create_dir(root, recursive=True)
    shards, current, size = [], None, 0.0

    def close() -> None:
        if current is not None:
            current[1].close()
            current[2].close()

    for utt in utterances:
        if current is None or size >= shard_mb * 2**20:
            close()
            name = f"shard-{len(shards):06d}.tar"
            stream = fs.open_output_stream(f"{root}/{name}")
            current, size = (name, tarfile.open(fileobj=stream, mode="w|"), stream), 0.0
            shards.append({"name": name, "utterances": 0, "seconds": 0.0})
        audio = Path(utt.path).read_bytes()
        meta = json.dumps({"text": utt.text, "duration": utt.duration}, allow_nan=False).encode()
        for member, data in ((f"{utt.id}{Path(utt.path).suffix}", audio), (f"{utt.id}.json", meta)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            current[1].addfile(info, io.BytesIO(data))
        size += len(audio)
        shards[-1]["utterances"] += 1
        shards[-1]["seconds"] = round(shards[-1]["seconds"] + utt.duration, 3)
    close()
    index = {"format": FORMAT, "version": VERSION, "source": str(manifest), "shards": shards,
             "utterances": len(utterances), "hours": round(sum(u.duration for u in utterances) / 3600, 3),
             "skipped": dict(skipped.counts)}
    with fs.open_output_stream(f"{root}/{INDEX}") as stream:
        stream.write(json.dumps(index, indent=1, allow_nan=False).encode())
    return {k: v for k, v in index.items() if k != "shards"} | {"shards": len(shards), "out": str(out)}


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
        self.names = [s["name"] for s in index["shards"]]
        self.counts = {s["name"]: s["utterances"] for s in index["shards"]}

    def read(self, name: str) -> Iterator[ShardUtterance]:
        """The utterances of shard `name`, in order, one member in memory at a time."""
        with self.fs.open_input_stream(f"{self.root}/{name}") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            audio: tuple[str, bytes] | None = None
            for member in tar:
                data = tar.extractfile(member).read()
                key, _, ext = member.name.partition(".")
                if ext != "json":
                    audio = (key, data)
                    continue
                if audio is None or audio[0] != key:
                    raise DataError(f"{name}: {member.name} has no audio before it")
                meta = json.loads(data)
                yield ShardUtterance(key, meta["text"], meta["duration"], load_audio(io.BytesIO(audio[1])))
                audio = None
