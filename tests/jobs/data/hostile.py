"""Data as a stranger's bucket may hold it, built for tests (`from tests.jobs.data.hostile import ...`):
audio of a chosen rate and content written by soundfile, tar archives of chosen members, and a
shards folder (`shards.json` and its tar files) whose index and members say whatever a test wants."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import soundfile as sf

from jobs.data.audio_shards import FORMAT, INDEX, TEXTS, VERSION


def audio_bytes(seconds: float = 0.3, rate: int = 16_000, fmt: str = "WAV", subtype: str | None = None,
                channels: int = 1, seed: int = 0, samples: np.ndarray | None = None) -> bytes:
    """A tone with a little noise (or `samples`, frames x channels) as the bytes of a sound file."""
    if samples is None:
        t = np.arange(max(1, round(seconds * rate))) / rate
        rng = np.random.default_rng(seed)
        mono = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.01 * rng.standard_normal(len(t))
        samples = np.repeat(mono[:, None], channels, axis=1).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, samples, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    """An archive (PAX format, as `chorus shards` writes) of these (name, bytes) members, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def utterance_members(utt_id: str, meta, audio: bytes, extension: str = ".wav") -> list[tuple[str, bytes]]:
    """An utterance's members as `chorus shards` writes them: its audio, then its JSON (`meta`: a
    dict, or the member's raw bytes)."""
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return [(f"{utt_id}{extension}", audio), (f"{utt_id}.json", raw)]


def tar_header(name: bytes, size_field: bytes, kind: bytes = b"0") -> bytes:
    """A ustar header block with this name, raw size field and entry type, its checksum right
    (whatever size it claims: a forged header)."""
    header = bytearray(512)
    header[:len(name)] = name
    header[124:136] = size_field
    header[156:157] = kind
    header[257:263] = b"ustar\0"
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return bytes(header)


def tar_then(members: list[tuple[str, bytes]], tail: bytes) -> bytes:
    """An archive of `members` that goes on with `tail` where its end-of-archive blocks were."""
    archive = tar_of(members)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        last = tar.getmembers()[-1]
    return archive[:last.offset_data + -(-last.size // 512) * 512] + tail


def shards_folder(root: Path, shards: dict[str, list[tuple[str, bytes]] | bytes], entries: list | None = None,
                  mel_bins: int | None = None) -> Path:
    """`root` as a shards folder: each of `shards` (name -> its members, archived, gzipped if the
    name ends in .gz; or bytes, written as they are) indexed by `entries` (default: each shard's
    name with its count of JSON members, or of None for bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in shards.items():
        if not isinstance(content, bytes):
            content = gzip.compress(tar_of(content)) if name.endswith(".gz") else tar_of(content)
        (root / name).write_bytes(content)
    if entries is None:
        entries = [{"name": name, "utterances": None if isinstance(content, bytes) else
                    sum(member.endswith(".json") for member, _ in content)} for name, content in shards.items()]
    index = {"format": FORMAT, "version": VERSION, "shards": entries, "utterances": 0, "mel_bins": mel_bins}
    (root / INDEX).write_text(json.dumps(index))
    (root / TEXTS).write_text("go\n")
    return root
