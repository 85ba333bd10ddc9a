"""Precomputed features: a corpus's filterbanks written once into shard files that learners read
utterance by utterance, instead of decoding audio and computing filterbanks in every epoch.

A features folder (`chorus features MANIFEST --out DIR`) holds `features.json` (the index: format
version, mel bins, the source it was made from, each utterance's id, text, duration, shard, byte
offset and frames, and what was skipped) and `shard-<n>.bin` files of raw float16 frames,
utterance after utterance, about `shard_mb` each. Reading one utterance is one seek and one read
of its bytes (no memory map: a learner's memory stays the bounded feature cache's); float16
halves the bytes per frame, and the filterbanks are already normalized per utterance.

A folder with `features.json` is a corpus source wherever a manifest is (`data.train: DIR`). An
index that is not one is a `DataError`; an entry of it that is malformed, or whose frames are more
than its duration holds, is skipped and counted; a shard shorter than an entry says is an
`AudioError` for it (nothing is read past a shard's end).

Example:
    >>> write_shards("data/tiny/train.jsonl", "data/tiny-features/train", num_mel_bins=80)
    {'utterances': 2000, 'shards': 3, ...}
    >>> shards = FeatureShards("data/tiny-features/train")
    >>> shards.read(0).shape
    torch.Size([412, 80])
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from jobs.data.manifests import (
    LONGER_THAN_STATED,
    MALFORMED_ENTRY,
    STATED_SLACK_S,
    TOO_LONG,
    AudioError,
    DataError,
    Record,
    SkipReport,
    Utterance,
    first_line,
    read_corpus,
    utterance_audio,
)
from jobs.features.filterbanks import Fbank, frames_in

INDEX = "features.json"
FORMAT_VERSION = 1
DTYPE = np.float16


class _Row(Record):
    """An utterance of the index."""
    id: str
    text: str
    duration: float = Field(ge=0)
    shard: int = Field(ge=0)
    offset: int = Field(ge=0)
    frames: int = Field(ge=1)


class _Skipped(Record):
    """What the index says was skipped when it was written."""
    what: str
    reason: str


def is_features_folder(source: str | Path) -> bool:
    return (Path(source) / INDEX).is_file()


def write_shards(source: str | Path, out: str | Path, num_mel_bins: int = 80, shard_mb: float = 64.0,
                 max_seconds: float = math.inf) -> dict:
    """Compute the filterbanks of every usable utterance of `source` (a manifest or a LibriSpeech
    folder) into shards in `out`; returns counts for a summary line. `features.json` is written
    last (atomically): a folder without it was never finished and is not a corpus."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    utterances, report = read_corpus(source, max_seconds)
    fbank, limit = Fbank(num_mel_bins), shard_mb * 2**20
    rows, shard, offset, shards = [], None, 0, 0
    try:
        for utt in utterances:
            try:
                frames = fbank(utterance_audio(utt, max_seconds)).numpy().astype(DTYPE)
            except AudioError as exc:
                report.skip(str(utt.path), exc.reason, str(utt.path))
                continue
            if shard is None or offset >= limit:
                if shard is not None:
                    shard.close()
                shard, offset, shards = open(out / f"shard-{shards:05d}.bin", "wb"), 0, shards + 1
            shard.write(frames.tobytes())
            rows.append({"id": utt.id, "text": utt.text, "duration": utt.duration, "shard": shards - 1,
                         "offset": offset, "frames": len(frames)})
            offset += frames.nbytes
    finally:
        if shard is not None:
            shard.close()
    index = {"version": FORMAT_VERSION, "num_mel_bins": num_mel_bins, "dtype": "float16",
             "source": str(Path(source).resolve()), "utterances": rows,
             "skipped": [{"what": what, "reason": reason} for what, reason in report.items]}
    tmp = out / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index, allow_nan=False))
    os.replace(tmp, out / INDEX)
    return {"utterances": len(rows), "skipped": report.total, "shards": shards,
            "hours": round(sum(r["duration"] for r in rows) / 3600, 3),
            "bytes": sum(p.stat().st_size for p in out.glob("shard-*.bin")), "out": str(out)}


class FeatureShards:
    """A features folder, read: `utterances` (as a manifest's, in id order, their `path` the shard
    file) and `read(i)`, utterance `i`'s frames as float32. A shard that is missing or shorter than
    the index says is an `AudioError` for the utterances in it (skipped like unreadable audio)."""

    def __init__(self, folder: str | Path, num_mel_bins: int | None = None, max_seconds: float = math.inf):
        self.folder = Path(folder)
        index = self._index(num_mel_bins)
        self.skipped = SkipReport()
        for item in index.get("skipped", []):
            skipped, _ = _Skipped.checked(item)
            if skipped is not None:
                self.skipped.skip(skipped.what, skipped.reason, skipped.what)
        rows = [row for i, item in enumerate(index["utterances"]) if (row := self._usable(i, item, max_seconds))]
        rows.sort(key=lambda r: r.id)
        self._where = [(r.shard, r.offset, r.frames) for r in rows]
        self.utterances = [Utterance(r.id, self.shard_path(r.shard), r.duration, r.text) for r in rows]

    def _index(self, num_mel_bins: int | None) -> dict:
        """The index, checked to be one of this version with the spec's mel bins; else a DataError."""
        where = self.folder / INDEX
        try:
            index = json.loads(where.read_text())
            rows, self.num_mel_bins = index["utterances"], index["num_mel_bins"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise DataError(f"{where}: not a features index ({first_line(exc)})") from None
        if index.get("version") != FORMAT_VERSION:
            raise DataError(f"{where}: format version {index.get('version')!r}, this Chorus reads "
                            f"{FORMAT_VERSION}; run `chorus features` again")
        if not isinstance(rows, list) or not isinstance(index.get("skipped", []), list) \
                or type(self.num_mel_bins) is not int or self.num_mel_bins < 1:
            raise DataError(f"{where}: not a features index (its utterances, skipped or num_mel_bins are "
                            "not what `chorus features` writes)")
        if num_mel_bins is not None and num_mel_bins != self.num_mel_bins:
            raise DataError(f"{where}: features of {self.num_mel_bins} mel bins, but the spec's "
                            f"features.num_mel_bins is {num_mel_bins}; run `chorus features --mel-bins "
                            f"{num_mel_bins}` or change the spec")
        return index

    def _usable(self, i: int, item, max_seconds: float) -> _Row | None:
        """Entry `i` of the index, or None, skipped and counted, when it is malformed or too long."""
        row, problem = _Row.checked(item)
        if row is None:
            self.skipped.skip(f"utterance {i} of {self.folder / INDEX} ({problem})", MALFORMED_ENTRY,
                              f"{self.folder}:#{i}")
        elif row.duration > max_seconds:
            self.skipped.skip(f"{row.id} in {self.folder} ({row.duration:.0f} s > {max_seconds:g} s)", TOO_LONG,
                              f"{self.folder}:{row.id}")
        elif row.frames > frames_in(row.duration + STATED_SLACK_S):
            self.skipped.skip(f"{row.id} in {self.folder} ({row.frames} frames; its duration is "
                              f"{row.duration:g} s)", LONGER_THAN_STATED, f"{self.folder}:{row.id}")
        else:
            return row
        return None

    def shard_path(self, shard: int) -> Path:
        return self.folder / f"shard-{shard:05d}.bin"

    def read(self, i: int) -> torch.Tensor:
        shard, offset, frames = self._where[i]
        size = frames * self.num_mel_bins * np.dtype(DTYPE).itemsize
        try:
            with open(self.shard_path(shard), "rb") as f:
                held = os.fstat(f.fileno()).st_size - offset  # what the shard holds from the offset on
                if held < size:
                    raise AudioError("truncated feature shard", f"{max(held, 0)} of {size} bytes at offset {offset}")
                f.seek(offset)
                data = f.read(size)
        except OSError as exc:
            raise AudioError("unreadable feature shard", str(exc)) from exc
        if len(data) != size:
            raise AudioError("truncated feature shard", f"{len(data)} of {size} bytes at offset {offset}")
        return torch.from_numpy(np.frombuffer(data, dtype=DTYPE).astype(np.float32)).view(frames, self.num_mel_bins)
