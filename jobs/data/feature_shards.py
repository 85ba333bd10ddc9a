"""Precomputed features: a corpus's filterbanks written once into shard files that learners read
utterance by utterance, instead of decoding audio and computing filterbanks in every epoch.

A features folder (`chorus features MANIFEST --out DIR`) holds `features.json` (the index: format
version, mel bins, the source it was made from, each utterance's id, text, duration, shard, byte
offset and frames, and what was skipped) and `shard-<n>.bin` files of raw float16 frames,
utterance after utterance, about `shard_mb` each. Reading one utterance is one seek and one read
of its bytes (no memory map: a learner's memory stays the bounded feature cache's); float16
halves the bytes per frame, and the filterbanks are already normalized per utterance.

A folder with `features.json` is a corpus source wherever a manifest is (`data.train: DIR`).

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

from jobs.data.manifests import TOO_LONG, AudioError, DataError, SkipReport, Utterance, load_audio, read_corpus
from jobs.features.filterbanks import Fbank

INDEX = "features.json"
FORMAT_VERSION = 1
DTYPE = np.float16


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
                frames = fbank(load_audio(utt.path, max_seconds)).numpy().astype(DTYPE)
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
        try:
            index = json.loads((self.folder / INDEX).read_text())
            rows, self.num_mel_bins = index["utterances"], int(index["num_mel_bins"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{self.folder / INDEX}: not a features index ({exc})") from exc
        if index.get("version") != FORMAT_VERSION:
            raise DataError(f"{self.folder / INDEX}: format version {index.get('version')!r}, this Chorus reads "
                            f"{FORMAT_VERSION}; run `chorus features` again")
        if num_mel_bins is not None and num_mel_bins != self.num_mel_bins:
            raise DataError(f"{self.folder / INDEX}: features of {self.num_mel_bins} mel bins, but the spec's "
                            f"features.num_mel_bins is {num_mel_bins}; run `chorus features --mel-bins "
                            f"{num_mel_bins}` or change the spec")
        self.skipped = SkipReport()
        for item in index.get("skipped", []):
            self.skipped.skip(item["what"], item["reason"], item["what"])
        for r in (r for r in rows if r["duration"] > max_seconds):
            self.skipped.skip(f"{r['id']} in {self.folder} ({r['duration']:.0f} s > {max_seconds:g} s)", TOO_LONG,
                              f"{self.folder}:{r['id']}")
        rows = sorted((r for r in rows if r["duration"] <= max_seconds), key=lambda r: r["id"])
        self._where = [(r["shard"], r["offset"], r["frames"]) for r in rows]
        self.utterances = [Utterance(r["id"], self.shard_path(r["shard"]), r["duration"], r["text"]) for r in rows]

    def shard_path(self, shard: int) -> Path:
        return self.folder / f"shard-{shard:05d}.bin"

    def read(self, i: int) -> torch.Tensor:
        shard, offset, frames = self._where[i]
        size = frames * self.num_mel_bins * np.dtype(DTYPE).itemsize
        try:
            with open(self.shard_path(shard), "rb") as f:
                f.seek(offset)
                data = f.read(size)
        except OSError as exc:
            raise AudioError("unreadable feature shard", str(exc)) from exc
        if len(data) != size:
            raise AudioError("truncated feature shard", f"{len(data)} of {size} bytes at offset {offset}")
        return torch.from_numpy(np.frombuffer(data, dtype=DTYPE).astype(np.float32)).view(frames, self.num_mel_bins)
