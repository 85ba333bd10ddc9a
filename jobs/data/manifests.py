"""Speech data: manifests in two formats, audio loading, and duration-bucketed sharded batches.

A corpus is either a LibriSpeech-layout directory (`<speaker>/<chapter>/*.flac` with
`<speaker>-<chapter>.trans.txt`) or a NeMo-style JSONL manifest (`audio_filepath`, `duration`,
`text`; relative paths resolve against the manifest's folder). Both yield `Utterance`s keyed by
the audio file's stem, so the same corpus reads the same either way.

Bad input never stops training: a missing, unreadable, empty, too short or too long audio file
(or one of samples that are not finite, or at a rate below 4 kHz or too costly to resample), a malformed or
non-UTF-8 manifest or transcript line or an utterance without a transcript is skipped, counted in
a `SkipReport` and logged once with its path (and `file:line`). What cannot train or evaluate at
all — a split left with no usable utterance — is a `DataError`. The records of the data formats
built on manifests (an index's entries, a shard member's JSON) are checked as `Record`s.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import numpy as np
import soundfile as sf
import torch
import torchaudio
from pydantic import BaseModel, ConfigDict, ValidationError

SAMPLE_RATE = 16_000
log = logging.getLogger("chorus.data")
_reported: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Utterance:
    id: str
    path: Path
    duration: float | None  # None only from read_jsonl(probe=False): not probed yet
    text: str
    cut: dict | None = field(default=None, compare=False, repr=False)  # a Lhotse cut's (`lhotse_corpora`)


def utterance_audio(utt: Utterance, max_seconds: float | None = None) -> torch.Tensor:
    """An utterance's 16 kHz mono waveform: its file's (`load_audio`), or a Lhotse cut's as Lhotse
    loads it (`jobs.data.lhotse_corpora.cut_audio`)."""
    if utt.cut is not None:
        from jobs.data.lhotse_corpora import cut_audio

        return cut_audio(utt.cut, math.inf if max_seconds is None else max_seconds)
    return load_audio(utt.path, max_seconds)


TOO_LONG = "longer than data.max_utterance_seconds"
NOT_UTF8 = "line not UTF-8"
UNREADABLE = "unreadable audio file"
ODD_RATE = "unusable sample rate"
MALFORMED_ENTRY = "malformed index entry"
LONGER_THAN_STATED = "longer than its stated duration"
TOO_SHORT = "shorter than 50 ms"
SHORTEST_S = 0.05  # no utterance is shorter; and the filterbank's 25 ms window, reflect-padded, needs over half a
# window of samples even at 2x speed (audio of 200 samples or fewer was a RuntimeError that stopped the job)
STATED_SLACK_S = 0.1  # how much longer than an index or a shard states an utterance may decode to (ours are exact)
LOWEST_RATE = 4000  # Hz: no speech is recorded at less; a header's 1 Hz made 2 KB of file 36 M samples (2 s of work)
MAX_RESAMPLE_TAPS = 2_000_000  # torchaudio's resampling kernel has (rate/g) x (16000/g) taps, g their gcd: 70,560 for
# 44.1 kHz, 1.4 M for 5,512 Hz; a header's 7,919 Hz would take 127 M (0.5 GB, 6 s a second of audio), 96,001 Hz 1.5 G
# (the process was killed)


class DataError(ValueError):
    """Data a job cannot train or evaluate on (a split with no usable utterance, a learner that can
    read none of its shard); the message is one line that names the manifest."""


@dataclass
class SkipReport:
    """What was left out, by reason, with the paths. Each skip has a key — what was skipped: an
    audio file's path, or `file:line` — by which reports of several readers of one corpus (the
    driver's, each learner's) are merged without counting a file twice."""

    counts: Counter = field(default_factory=Counter)
    items: list[tuple[str, str]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # one per item

    def skip(self, where: str, reason: str, key: str | None = None) -> None:
        self.counts[reason] += 1
        self.items.append((where, reason))
        self.keys.append(key or where)
        if (where, reason) not in _reported:
            _reported.add((where, reason))
            log.warning("skipped %s: %s", where, reason)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def since(self, start: int) -> dict[str, str]:
        """The skips after the first `start`, as key -> reason."""
        return {key: reason for key, (_, reason) in zip(self.keys[start:], self.items[start:], strict=True)}

    def merge(self, skips: dict[str, str]) -> None:
        """Add another reader's skips (key -> reason) of the same corpus, but none already here."""
        known = set(self.keys)
        for key, reason in skips.items():
            if key not in known:
                self.skip(key, reason, key)

    def describe(self) -> str:
        """One line: '5 skipped (missing audio file: 3, no transcript: 2)', or 'it lists none'."""
        if not self.total:
            return "it lists none"
        reasons = ", ".join(f"{reason}: {n}" for reason, n in self.counts.most_common())
        return f"{self.total} skipped ({reasons})"


def first_line(exc: BaseException) -> str:
    """An exception's message's first line (its type's name when it has none), what it quotes of a file escaped."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line if line.isprintable() else repr(line)[1:-1]


class Record(BaseModel):
    """A record of a data file that Chorus reads (an index's entry, a shard member's JSON): each
    field of exactly its type (a string is no number, a boolean no integer), numbers finite, other
    keys ignored. `checked` gives one, or one line on why a value is none."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, frozen=True)

    @classmethod
    def checked(cls, value) -> tuple[Self | None, str]:
        try:
            return cls.model_validate(value), ""
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(map(str, error["loc"]))
            return None, f"{field}: {error['msg']}" if field else "not a JSON object"


class AudioError(Exception):
    """An audio file that cannot be used; `reason` is its skip reason, `detail` says more."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason, self.detail = reason, detail


def load_audio(path, max_seconds: float | None = None) -> torch.Tensor:
    """Mono float32 waveform at 16 kHz of a file (a path, or a binary file object): stereo is
    averaged, other rates resampled. A file longer than `max_seconds` is refused from its header,
    before any sample is read, and no more samples than that are read whatever the header says.
    Samples that are not finite, or a rate below LOWEST_RATE or too costly to resample
    (`MAX_RESAMPLE_TAPS`), are an AudioError as well."""
    try:
        with sf.SoundFile(str(path) if isinstance(path, (str, Path)) else path) as f:
            seconds, rate = f.frames / f.samplerate, f.samplerate
            if max_seconds is not None and seconds > max_seconds:
                raise AudioError(TOO_LONG, f"{seconds:.0f} s > {max_seconds:g} s")
            _check_rate(rate)
            most = -1 if max_seconds is None or math.isinf(max_seconds) else math.floor(max_seconds * rate)
            wav = f.read(frames=most, dtype="float32", always_2d=True)
    except AudioError:
        raise
    except Exception as exc:  # soundfile raises several types for unreadable files
        detail = first_line(exc)
        raise AudioError(UNREADABLE, detail if isinstance(path, (str, Path)) else detail.rpartition(">: ")[2]) \
            from exc  # (not the file object's repr)
    return mono_16k(wav, rate)


def mono_16k(samples: np.ndarray, rate: int) -> torch.Tensor:
    """Samples of one recording, (frames, channels) as soundfile reads them (or (frames,) for
    mono), as `load_audio` returns a file's: float32, channels averaged, resampled to 16 kHz. No
    samples, samples that are not finite, an unusable rate or under 50 ms are an AudioError."""
    wav = np.asarray(samples, dtype=np.float32)
    wav = wav[:, None] if wav.ndim == 1 else wav
    if wav.ndim != 2 or wav.shape[0] == 0:
        raise AudioError("empty audio file" if wav.ndim == 2 else UNREADABLE,
                         "" if wav.ndim == 2 else f"{wav.ndim}-dimensional samples")
    if not np.isfinite(wav).all():
        raise AudioError(UNREADABLE, "samples that are not finite numbers")
    _check_rate(rate)
    mono = torch.from_numpy(np.ascontiguousarray(wav.mean(axis=1)))
    if rate != SAMPLE_RATE:
        mono = torchaudio.functional.resample(mono, rate, SAMPLE_RATE)
    if len(mono) < SHORTEST_S * SAMPLE_RATE:
        raise AudioError(TOO_SHORT, f"{len(mono) / SAMPLE_RATE * 1000:.0f} ms")
    return mono


def _check_rate(rate: int) -> None:
    """An AudioError for a sample rate below LOWEST_RATE, or whose resampling to 16 kHz would cost too much."""
    common = math.gcd(rate, SAMPLE_RATE)
    if rate < LOWEST_RATE or (rate // common) * (SAMPLE_RATE // common) > MAX_RESAMPLE_TAPS:
        raise AudioError(ODD_RATE, f"{rate} Hz")


def probe_duration(path: Path, where: str, report: SkipReport, max_seconds: float) -> float | None:
    """Duration in seconds from the header, or None (skipped) when the file is missing, unreadable,
    empty or longer than `max_seconds`."""
    key = str(path)
    if not path.is_file():
        report.skip(where, "missing audio file", key)
        return None
    if path.stat().st_size == 0:
        report.skip(where, "empty audio file", key)
        return None
    try:
        info = sf.info(str(path))
    except Exception:
        report.skip(where, UNREADABLE, key)
        return None
    if info.frames == 0:
        report.skip(where, "empty audio file", key)
        return None
    seconds = info.frames / info.samplerate
    if seconds < SHORTEST_S:
        report.skip(f"{where} ({seconds * 1000:.0f} ms)", TOO_SHORT, key)
        return None
    if seconds > max_seconds:
        report.skip(f"{where} ({seconds:.0f} s > {max_seconds:g} s)", TOO_LONG, key)
        return None
    return seconds


def read_corpus(source: str | Path, max_seconds: float = math.inf) -> tuple[list[Utterance], SkipReport]:
    """Utterances of a JSONL manifest, a LibriSpeech-layout directory or a Lhotse CutSet manifest
    (`*.jsonl.gz`, `jobs.data.lhotse_corpora`), sorted by id; those longer than `max_seconds` are skipped."""
    source = Path(source)
    report = SkipReport()
    if source.is_dir():
        utts = _read_librispeech(source, report, max_seconds)
    elif source.suffix == ".jsonl":
        utts = read_jsonl(source, report, max_seconds)
    elif source.name.endswith(".jsonl.gz"):
        from jobs.data.lhotse_corpora import read_cutset

        utts = read_cutset(source, report, max_seconds)
    else:
        raise ValueError(f"{source}: expected a .jsonl manifest, a Lhotse CutSet (.jsonl.gz) or a LibriSpeech-layout "
                         "directory")
    return sorted(utts, key=lambda u: u.id), report


def read_lines(path: Path) -> list[tuple[int, str | bytes]]:
    """(line number, text) of a text file; a line that is not UTF-8 comes as its bytes."""
    lines = []
    for line_no, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            lines.append((line_no, raw.decode("utf-8")))
        except UnicodeDecodeError:
            lines.append((line_no, raw))
    return lines


def read_jsonl(manifest: Path, report: SkipReport, max_seconds: float, need_text: bool = True,
               probe: bool = True) -> list[Utterance]:
    """A JSONL manifest's utterances in its lines' order (`need_text`: only those with a transcript;
    `probe=False`: their audio files not opened here, their durations None)."""
    utts = []
    for line_no, line in read_lines(manifest):
        where = f"{manifest}:{line_no}"
        if isinstance(line, bytes):
            report.skip(where, NOT_UTF8)
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rel = row["audio_filepath"]
        except (ValueError, KeyError, TypeError, RecursionError):
            rel = None
        if not isinstance(rel, str) or not rel:  # (a number there was a TypeError that stopped the job)
            report.skip(where, "malformed manifest line (needs JSON with audio_filepath)")
            continue
        path = Path(rel) if Path(rel).is_absolute() else manifest.parent / rel
        text = row.get("text") if isinstance(row.get("text"), str) else ""
        if need_text and not text.strip():
            report.skip(f"{path} ({where})", "no transcript", str(path))
            continue
        duration = probe_duration(path, f"{path} ({where})", report, max_seconds) if probe else None
        if duration is not None or not probe:
            utts.append(Utterance(path.stem, path, duration, text.strip().lower()))
    return utts


def _read_librispeech(root: Path, report: SkipReport, max_seconds: float) -> list[Utterance]:
    transcripts: dict[str, str] = {}
    undecodable: dict[str, str] = {}  # utterance id -> the `file:line` of its transcript that is not UTF-8
    for trans in root.rglob("*.trans.txt"):
        for line_no, line in read_lines(trans):
            if isinstance(line, bytes):  # its id is ASCII: the utterance is skipped for this reason alone
                undecodable[line.strip().split(b" ")[0].decode("ascii", "replace")] = f"{trans}:{line_no}"
                continue
            utt_id, _, text = line.strip().partition(" ")
            if utt_id and text.strip():
                transcripts[utt_id] = text.strip().lower()
    utts = []
    seen = set()
    for path in sorted(root.rglob("*.flac")):
        seen.add(path.stem)
        if path.stem not in transcripts:
            if path.stem in undecodable:
                report.skip(f"{path} ({undecodable[path.stem]})", NOT_UTF8, str(path))
            else:
                report.skip(str(path), "no transcript")
            continue
        duration = probe_duration(path, str(path), report, max_seconds)
        if duration is not None:
            utts.append(Utterance(path.stem, path, duration, transcripts[path.stem]))
    for utt_id in sorted(set(transcripts) - seen):
        report.skip(f"{root} ({utt_id})", "missing audio file")
    for utt_id in sorted(set(undecodable) - seen):
        report.skip(undecodable[utt_id], NOT_UTF8)
    return utts


def _owners_and_budgets(order: np.ndarray, max_batch_seconds: float, world_size: int,
                        weights: list[float] | None, rng) -> tuple[np.ndarray, np.ndarray]:
    """Which rank owns each utterance (dealt group by group of similar length) and each rank's
    batch budget in seconds."""
    if weights is None:
        owner = np.empty(len(order), dtype=np.int64)
        for start in range(0, len(order), world_size):
            group = order[start:start + world_size]
            owner[group] = rng.permutation(world_size)[: len(group)]
        return owner, np.full(world_size, float(max_batch_seconds))
    share = _shares(weights, world_size)
    return _deal_by_share(order, share, rng), max_batch_seconds * world_size * share


def shard_batches(durations: list[float] | np.ndarray, max_batch_seconds: float, epoch: int, seed: int,
                  rank: int = 0, world_size: int = 1, weights: list[float] | None = None) -> list[list[int]]:
    """Rank `rank`'s batches (indices into `durations`) for one epoch.

    Over all ranks of one epoch every utterance appears exactly once. Utterances are sorted by duration
    and dealt to ranks in random order, group by group, so each shard has the same mix of lengths and
    sizes differ by at most one utterance. The sorted utterances are then cut into steps: consecutive
    runs in which every rank's part — one batch of similar durations — has a padded size (utterances x
    longest) within `max_batch_seconds` (an utterance longer than the budget gets a batch of its own).
    Every rank has the same steps in the same (shuffled) order, so at each step all ranks work on
    utterances of about the same length and a synchronous group's members finish together. The result
    depends only on (seed, epoch, rank, world_size, weights), so the world size may change between epochs.

    `weights` (one per rank, e.g. measured speeds) make shards unequal: rank r gets a share
    weights[r] / sum(weights) of every length group and a batch budget of `max_batch_seconds` x
    world_size x that share, so the summed batch over ranks stays what equal shares would give;
    a rank of weight 0 gets no utterances. The ranks with at least half the largest budget set
    the steps; a smaller one's batch may go over its budget by an utterance, and a rank whose
    part of a step is empty skips it (such steps come last).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    durations = np.asarray(durations, dtype=np.float64)
    rng = np.random.default_rng([seed, epoch])
    jitter = rng.uniform(0.97, 1.03, size=len(durations))  # varies batch composition between epochs
    order = np.argsort(durations * jitter, kind="stable")
    owner, budgets = _owners_and_budgets(order, max_batch_seconds, world_size, weights, rng)
    steps, complete = _cut_steps(order, owner, durations, budgets, rank)
    shuffled = np.random.default_rng([seed, epoch, world_size]).permutation(len(steps))  # the same on every rank
    # steps that some rank has no part of go last, so skipping them shifts no rank out of step
    ordered = [j for j in shuffled if complete[j]] + [j for j in shuffled if not complete[j]]
    return [steps[j] for j in ordered if steps[j]]


def _cut_steps(order: np.ndarray, owner: np.ndarray, durations: np.ndarray, budgets: np.ndarray,
               rank: int) -> tuple[list[list[int]], list[bool]]:
    """Rank `rank`'s part of each step, the utterances taken in `order`, and whether every rank
    with a share has a part of it. The ranks with the larger budgets set the steps; one under half
    the largest budget may go over its own by an utterance (its boundaries are coarse: it would
    cut every step short). Plain Python numbers in this loop over the whole corpus (every learner
    runs it at every epoch start): with numpy scalars it took ~1.4x as long."""
    world_size = len(budgets)
    pacing, budget = (budgets >= budgets.max() / 2).tolist(), budgets.tolist()
    sharing = [r for r in range(world_size) if budget[r] > 0]
    owner_of, duration = owner.tolist(), durations.tolist()
    steps, complete = [], []
    parts, longest = [[] for _ in range(world_size)], [0.0] * world_size
    for i in order.tolist():
        r, d = owner_of[i], duration[i]
        if parts[r] and pacing[r] and (len(parts[r]) + 1) * max(longest[r], d) > budget[r]:
            steps.append(parts[rank])  # some rank's batch is full: the step ends for every rank
            complete.append(all(parts[q] for q in sharing))
            parts, longest = [[] for _ in range(world_size)], [0.0] * world_size
        parts[r].append(i)
        longest[r] = max(longest[r], d)
    if any(parts):
        steps.append(parts[rank])
        complete.append(all(parts[q] for q in sharing))
    return steps, complete


def _shares(weights: list[float], world_size: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) != world_size or not np.all(w >= 0) or not w.sum() > 0:
        raise ValueError(f"weights must be {world_size} numbers >= 0, not all 0, got {list(weights)}")
    return w / w.sum()


def _deal_by_share(order: np.ndarray, share: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Owner of each utterance when `order` (sorted by length) is dealt out so that every prefix
    gives rank r about share[r] of it (stride scheduling; ties broken at random)."""
    owner = np.empty(len(order), dtype=np.int64)
    credit = rng.uniform(0, 1e-6, size=len(share))
    credit[share == 0] = -np.inf  # a rank with share 0 gets nothing
    for i in order:
        credit += share
        r = int(np.argmax(credit))
        owner[i] = r
        credit[r] -= 1.0
    return owner
