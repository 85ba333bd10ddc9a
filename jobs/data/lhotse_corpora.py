"""Lhotse's corpus formats as Chorus corpora, parsed by Lhotse's own readers:

- a CutSet manifest (`*.jsonl.gz`: one cut a line, as Lhotse's recipes write them) as a split's
  utterances (`read_cutset`): each cut's transcript is its supervisions' text, and its audio is
  loaded by Lhotse (the recording's file, the cut's offset and channels: `cut_audio`), then brought
  to 16 kHz mono as every input is;
- a Lhotse Shar directory (`cuts.NNNNNN.jsonl.gz` beside `recording.NNNNNN.tar`), local or at a URI
  that `pyarrow.fs` opens, as training shards (`SharShards`: what `jobs.data.shard_stream` streams,
  with the interface of `jobs.data.audio_shards.AudioShards`): each Shar shard is one shard of the
  epoch's plan, its cuts counted from its manifest, its tar read member by member with Lhotse's
  tar parsing (`iterate_tarfile_pairwise`, `fill_shar_placeholder`) over Chorus's own streams;
- `write_shar`: a manifest's utterances written as Shar by Lhotse's `SharWriter` (to a URI: written
  here, then uploaded).

Nothing in a file is trusted: a cut line Lhotse cannot read is skipped and counted by `file:line`;
a shard whose tar does not match its cuts stops at that point and is counted as unreadable.

Example:
    >>> utterances, skipped = read_cutset(Path("corpus/cuts_train.jsonl.gz"), SkipReport())  # doctest: +SKIP
    >>> shards = SharShards("s3://bucket/shar?endpoint_override=127.0.0.1:9000")  # doctest: +SKIP
    >>> next(shards.read(shards.names[0])).text  # doctest: +SKIP
    'go left'
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from jobs.data.audio_shards import UnusableMember, filesystem
from jobs.data.manifests import (
    SHORTEST_S,
    TOO_LONG,
    TOO_SHORT,
    UNREADABLE,
    AudioError,
    DataError,
    SkipReport,
    Utterance,
    first_line,
    mono_16k,
    read_corpus,
)

CUTSET_SUFFIX = ".jsonl.gz"
SHAR_CUTS = re.compile(r"^cuts\.(\d{6})\.jsonl\.gz$")
FIRST_SHAR_CUTS = "cuts.000000.jsonl.gz"
MALFORMED_CUT = "malformed cut"
UNREADABLE_SHARD = "unreadable shard"  # (`jobs.data.shard_stream`'s reason for the same)
UNREADABLE_MANIFEST = "unreadable manifest"
NO_TRANSCRIPT = "no transcript"
MAX_CUTS_FILE = 256 << 20  # bytes of a shard's cuts manifest read at most (decompressed)
MAX_MEMBER = 256 << 20  # bytes of a Shar tar member read at most (as `jobs.data.tar_stream`)
NO_SHELL = "LibsndfileBackend"  # Lhotse's audio backend here: libsndfile alone. Lhotse's default picks one by the
# file's name, and reads `.sph` (sph2pipe) and `.opus` (ffmpeg) through a shell with the path unquoted


def _lhotse():
    """Lhotse, its audio read by libsndfile only (`NO_SHELL`), for every thread of this process."""
    import lhotse
    from lhotse.audio.backend import set_current_audio_backend

    set_current_audio_backend(NO_SHELL)
    return lhotse


def is_cutset(source) -> bool:
    return "://" not in str(source) and str(source).endswith(CUTSET_SUFFIX)


def is_shar(source) -> bool:
    """Whether `source` (a folder or URI) holds a Lhotse Shar directory."""
    if "://" not in str(source):
        return (Path(source) / FIRST_SHAR_CUTS).is_file()
    fs, root = filesystem(source)
    import pyarrow.fs

    try:
        return fs.get_file_info(f"{root}/{FIRST_SHAR_CUTS}").type == pyarrow.fs.FileType.File
    except OSError:
        return False


def _cut(line: str, sources: tuple[str, ...] = ("file",)):
    """The cut a manifest line holds (Lhotse's deserialization), or None with why not: a single
    recording's cut (a MonoCut) whose audio sources are all of `sources`' types (a file; never
    Lhotse's `command` or `url` sources, which would run a shell command or reach the network)."""
    _lhotse()
    from lhotse.cut import MonoCut
    from lhotse.serialization import deserialize_item

    try:
        cut = deserialize_item(json.loads(line))
        if not isinstance(cut, MonoCut) or cut.recording is None:
            return None, f"a {type(cut).__name__} without one recording", 0.0
        kinds = {source.type for source in cut.recording.sources}
        if not kinds or not kinds <= set(sources):
            return None, f"audio sources of type {', '.join(sorted(map(str, kinds))) or 'none'}", 0.0
        text = " ".join(s.text for s in cut.supervisions if isinstance(s.text, str)).strip().lower()
        duration = float(cut.duration)
        return (cut, text, duration) if math.isfinite(duration) else (None, "duration not finite", 0.0)
    except Exception as exc:  # noqa: BLE001 - whatever Lhotse raises for a line it cannot read
        return None, first_line(exc), 0.0


def read_cutset(manifest: Path, report: SkipReport, max_seconds: float = math.inf,
                need_text: bool = True) -> list[Utterance]:
    """The utterances of a CutSet manifest, one a cut with a usable duration and (`need_text`) a transcript."""
    utterances, line_no = [], 0
    try:
        with gzip.open(manifest, "rt", encoding="utf-8", errors="replace") as lines:
            for line_no, line in enumerate(lines, start=1):
                if line.strip():
                    _listed(line, f"{manifest}:{line_no}", manifest, report, max_seconds, utterances, need_text)
    except (OSError, EOFError, zlib.error) as exc:  # not gzip, or cut short
        report.skip(f"{manifest} from line {line_no + 1} ({first_line(exc)})", UNREADABLE_MANIFEST, str(manifest))
    return utterances


def _listed(line: str, where: str, manifest: Path, report: SkipReport, max_seconds: float,
            utterances: list[Utterance], need_text: bool) -> None:
    """A CutSet line's utterance appended to `utterances`, or skipped and counted."""
    cut, text, duration = _cut(line)
    if cut is None:
        report.skip(f"{where} ({text})", MALFORMED_CUT, where)
    elif not text and need_text:
        report.skip(f"cut {cut.id} ({where})", NO_TRANSCRIPT, where)
    elif not SHORTEST_S <= duration <= max_seconds:
        report.skip(f"cut {cut.id} ({where}, {duration:.2f} s)", TOO_SHORT if duration < SHORTEST_S else TOO_LONG,
                    where)
    else:
        utterances.append(Utterance(str(cut.id), manifest, duration, text, cut=cut.to_dict()))


def cut_audio(cut, max_seconds: float = math.inf) -> torch.Tensor:
    """A cut's audio (a cut, or its dict) as Lhotse loads it, mono at 16 kHz; an AudioError when
    Lhotse cannot load it or it is longer than `max_seconds` (or than the cut says)."""
    _lhotse()
    if isinstance(cut, dict):
        from lhotse.serialization import deserialize_item

        cut = deserialize_item(cut)
    if cut.duration > max_seconds:
        raise AudioError(TOO_LONG, f"{cut.duration:.0f} s > {max_seconds:g} s")
    try:
        samples = cut.load_audio()  # (channels, samples) at the cut's rate
    except Exception as exc:  # noqa: BLE001 - whatever Lhotse and its audio backends raise
        raise AudioError(UNREADABLE, first_line(exc)) from None
    return mono_16k(samples.T, int(cut.sampling_rate))


@dataclass(frozen=True)
class SharUtterance:
    """A cut of a Shar shard with its audio in memory (what `SharShards.read` yields)."""

    id: str
    text: str
    duration: float
    cut: object
    max_seconds: float = math.inf
    power: float = 0.0

    @property
    def waveform(self) -> torch.Tensor:
        return cut_audio(self.cut, self.max_seconds)

    @property
    def log_mel(self) -> torch.Tensor:
        raise AudioError(UNREADABLE, "Lhotse Shar carries no Chorus features")


class SharShards:
    """A Lhotse Shar directory at a folder or URI, as `jobs.data.audio_shards.AudioShards` is read:
    `names` (the shards' numbers), `counts` (cuts each, from its manifest), `texts`, `read`."""

    mel_bins = None  # no Chorus features: data.shard_features is refused

    def __init__(self, location: str | Path):
        self.location = str(location)
        self.fs, self.root = filesystem(location)
        self.skipped, self.counts, self._texts = SkipReport(), {}, []
        for name in self._shard_numbers():
            try:
                manifest = self._read_text(f"cuts.{name}.jsonl.gz")
            except (OSError, EOFError, ValueError) as exc:  # not gzip, cut short, too large: not planned
                self.skipped.skip(f"{self.location.split('?')[0]}/cuts.{name}.jsonl.gz ({first_line(exc)})",
                                  UNREADABLE_SHARD, name)
                continue
            count = 0
            for line in manifest.splitlines():
                if line.strip():
                    count += 1
                    cut, text, _ = _cut(line, sources=("shar",))
                    if cut is not None and text:
                        self._texts.append(text)
            self.counts[name] = count
        if not self.counts:
            raise DataError(f"{self.location.split('?')[0]}: no Lhotse Shar shards there ({FIRST_SHAR_CUTS}, ...)")
        self.names = list(self.counts)
        self.utterances = sum(self.counts.values())

    def _shard_numbers(self) -> list[str]:
        import pyarrow.fs

        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.root, allow_not_found=True))
        return sorted(m.group(1) for i in infos if (m := SHAR_CUTS.match(i.base_name)))

    def _read_text(self, name: str) -> str:
        """A shard's cuts manifest, decompressed (pyarrow reads `.gz` so), at most MAX_CUTS_FILE bytes of it."""
        with self.fs.open_input_stream(f"{self.root}/{name}") as stream:
            text = stream.read(MAX_CUTS_FILE + 1)
        if len(text) > MAX_CUTS_FILE:
            raise DataError(f"{self.location.split('?')[0]}/{name}: over {MAX_CUTS_FILE >> 20} MB decompressed")
        return text.decode("utf-8", errors="replace")

    def texts(self, limit: int | None = None) -> list[str]:
        return self._texts[:limit]

    def read(self, name: str, skip: int = 0, max_seconds: float = math.inf
             ) -> Iterator[SharUtterance | UnusableMember]:
        """Shard `name`'s cuts in order after its first `skip` (their audio read past, not decoded);
        a cut without a transcript comes as an `UnusableMember`. A cut line or tar member Lhotse
        cannot read, a tar that does not match the cuts or holds a member over MAX_MEMBER bytes
        raises ValueError (its reader counts the rest of the shard as unreadable)."""
        lines = [line for line in self._read_text(f"cuts.{name}.jsonl.gz").splitlines() if line.strip()]
        with self.fs.open_input_stream(f"{self.root}/recording.{name}.tar") as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:  # a Shar tar is not compressed
            members = _member_pairs(tar)
            for n, line in enumerate(lines):
                try:
                    pair = next(members, None)
                    if pair is None:
                        return  # the tar ended first: its reader counts the shard as cut short
                    if n < skip:
                        continue
                    cut, text = _filled(line, *pair)
                except (tarfile.TarError, OSError, EOFError):
                    raise
                except Exception as exc:  # noqa: BLE001 - what a hostile shard makes Lhotse raise
                    raise ValueError(f"cut {n} of shard {name}: {first_line(exc)}") from None
                yield SharUtterance(cut.id, text, float(cut.duration), cut, max_seconds) if text else \
                    UnusableMember(str(cut.id), NO_TRANSCRIPT)


def _member_pairs(tar: tarfile.TarFile) -> Iterator[tuple[tuple[bytes | None, Path], tuple[bytes | None, Path]]]:
    """A Shar tar's (data, its path), (metadata, its path) pairs, as Lhotse's `iterate_tarfile_pairwise`
    gives them, each member a file of at most MAX_MEMBER bytes."""
    pending = []
    for info in tar:
        if not info.isfile() or info.size > MAX_MEMBER:
            raise ValueError(f"member {info.name!r} is not a file of at most {MAX_MEMBER >> 20} MB")
        path = Path(info.name)
        pending.append((None if path.suffix in (".nodata", ".nometa") else tar.extractfile(info).read(), path))
        if len(pending) == 2:
            yield pending[0], pending[1]
            pending = []


def _filled(line: str, data_part: tuple[bytes | None, Path], meta_part: tuple[bytes | None, Path]):
    """The cut of a Shar manifest line with its audio from its tar members (Lhotse's parsing), and its text."""
    from lhotse.serialization import decode_json_line, deserialize_item
    from lhotse.shar.utils import fill_shar_placeholder

    (data, data_path), (meta, _) = data_part, meta_part
    cut, why, _ = _cut(line, sources=("shar",))  # a placeholder, filled from the tar below
    if cut is None:
        raise ValueError(why)
    if data is None or meta is None or str(data_path.parent / data_path.stem) != cut.id:
        raise ValueError(f"member {data_path} is not cut {cut.id}'s audio")
    recording = deserialize_item(decode_json_line(meta.decode("utf-8")))
    fill_shar_placeholder(manifest=recording, data=data, tarpath=data_path)
    cut.recording = recording
    return cut, " ".join(s.text for s in cut.supervisions if isinstance(s.text, str)).strip().lower()


def write_shar(manifest: str | Path, out: str, shard_mb: float = 64.0) -> dict:
    """`manifest`'s utterances (a JSONL manifest, LibriSpeech folder or CutSet) as Lhotse Shar at
    `out` (a folder or URI), shards of about `shard_mb` of audio, the audio as FLAC; a summary."""
    _lhotse()
    from lhotse import CutSet, Recording, SupervisionSegment
    from lhotse.cut import MonoCut
    from lhotse.serialization import deserialize_item
    from lhotse.shar.writers.shar import SharWriter

    utterances, skipped = read_corpus(manifest)
    if not utterances:
        raise DataError(f"no usable utterances in {manifest}: {skipped.describe()}")

    def cut_of(u: Utterance) -> MonoCut:
        if u.cut is not None:
            return deserialize_item(u.cut)
        recording = Recording.from_file(u.path, recording_id=u.id)
        return MonoCut(id=u.id, start=0.0, duration=recording.duration, channel=0, recording=recording,
                       supervisions=[SupervisionSegment(id=u.id, recording_id=u.id, start=0.0,
                                                        duration=recording.duration, text=u.text)])

    cuts = CutSet.from_cuts(cut_of(u) for u in utterances)
    mean_bytes = sum(u.duration * 32_000 if u.cut else u.path.stat().st_size for u in utterances) / len(utterances)
    per_shard = max(1, int(shard_mb * 2**20 / max(mean_bytes, 1)))
    with tempfile.TemporaryDirectory(prefix="chorus-shar-") as local:
        folder = Path(out) if "://" not in str(out) else Path(local)
        folder.mkdir(parents=True, exist_ok=True)
        with SharWriter(str(folder), fields={"recording": "flac"}, shard_size=per_shard) as writer:
            for cut in cuts:
                writer.write(cut)
        files = sorted(p.name for p in folder.iterdir())
        if "://" in str(out):
            _upload(folder, out, files)
    return {"format": "lhotse-shar", "out": str(out).split("?")[0], "utterances": len(utterances),
            "shards": sum(1 for f in files if SHAR_CUTS.match(f)), "skipped": skipped.total}


def _upload(folder: Path, out: str, files: list[str]) -> None:
    fs, root = filesystem(out)
    for name in files:
        with open(folder / name, "rb") as src, fs.open_output_stream(f"{root}/{name}") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)


