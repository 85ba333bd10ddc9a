"""Speech data: manifests in two formats, audio loading, and duration-bucketed sharded batches.

A corpus is either a LibriSpeech-layout directory (`<speaker>/<chapter>/*.flac` with
`<speaker>-<chapter>.trans.txt`) or a NeMo-style JSONL manifest (`audio_filepath`, `duration`,
`text`; relative paths resolve against the manifest's folder). Both yield `Utterance`s keyed by
the audio file's stem, so the same corpus reads the same either way.

Bad input never stops training: a missing, unreadable or empty audio file, a malformed manifest
line or an utterance without a transcript is skipped, counted in a `SkipReport` and logged once
with its path.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

SAMPLE_RATE = 16_000
log = logging.getLogger("chorus.data")
_reported: set[tuple[str, str]] = set()


class DataConfig(BaseModel):
    """Args:
    train, dev, test, test_unseen: a `.jsonl` manifest or a LibriSpeech-layout directory each;
        all but `train` may be left out.
    max_batch_seconds: padded audio seconds per batch (utterances x longest in the batch).
    """

    model_config = ConfigDict(extra="forbid")
    train: Path
    dev: Path | None = None
    test: Path | None = None
    test_unseen: Path | None = None
    max_batch_seconds: float = 60.0

    @field_validator("train", "dev", "test", "test_unseen")
    @classmethod
    def _exists(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        if path is None or not (info.context or {}).get("check_paths", True):  # paths of another machine
            return path
        if not path.exists():
            raise ValueError(f"no such manifest or directory: '{path}'")
        if path.is_file() and path.suffix != ".jsonl":
            raise ValueError(f"'{path}' is neither a .jsonl manifest nor a LibriSpeech-layout directory")
        return path

    @field_validator("max_batch_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v


@dataclass(frozen=True)
class Utterance:
    id: str
    path: Path
    duration: float
    text: str


@dataclass
class SkipReport:
    """What was left out, by reason, with the paths."""

    counts: Counter = field(default_factory=Counter)
    items: list[tuple[str, str]] = field(default_factory=list)

    def skip(self, where: str, reason: str) -> None:
        self.counts[reason] += 1
        self.items.append((where, reason))
        if (where, reason) not in _reported:
            _reported.add((where, reason))
            log.warning("skipped %s: %s", where, reason)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class AudioError(Exception):
    pass


def load_audio(path: str | Path) -> torch.Tensor:
    """Mono float32 waveform at 16 kHz: stereo is averaged, other rates resampled."""
    try:
        wav, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several types for unreadable files
        raise AudioError(f"unreadable audio ({exc})") from exc
    if wav.shape[0] == 0:
        raise AudioError("empty audio")
    mono = torch.from_numpy(wav.mean(axis=1))
    if rate != SAMPLE_RATE:
        mono = torchaudio.functional.resample(mono, rate, SAMPLE_RATE)
    return mono


def _probe(path: Path, where: str, report: SkipReport) -> float | None:
    """Duration in seconds, or None (skipped) when the file is missing, unreadable or empty."""
    if not path.is_file():
        report.skip(where, "missing audio file")
        return None
    if path.stat().st_size == 0:
        report.skip(where, "empty audio file")
        return None
    try:
        info = sf.info(str(path))
    except Exception:
        report.skip(where, "unreadable audio file")
        return None
    if info.frames == 0:
        report.skip(where, "empty audio file")
        return None
    return info.frames / info.samplerate


def read_corpus(source: str | Path) -> tuple[list[Utterance], SkipReport]:
    """Utterances of a JSONL manifest or a LibriSpeech-layout directory, sorted by id."""
    source = Path(source)
    report = SkipReport()
    if source.is_dir():
        utts = _read_librispeech(source, report)
    elif source.suffix == ".jsonl":
        utts = _read_jsonl(source, report)
    else:
        raise ValueError(f"{source}: expected a .jsonl manifest or a LibriSpeech-layout directory")
    return sorted(utts, key=lambda u: u.id), report


def _read_jsonl(manifest: Path, report: SkipReport) -> list[Utterance]:
    utts = []
    for line_no, line in enumerate(manifest.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{manifest}:{line_no}"
        try:
            row = json.loads(line)
            rel = row["audio_filepath"]
        except (json.JSONDecodeError, KeyError, TypeError):
            report.skip(where, "malformed manifest line (needs JSON with audio_filepath)")
            continue
        path = Path(rel) if Path(rel).is_absolute() else manifest.parent / rel
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            report.skip(f"{path} ({where})", "no transcript")
            continue
        duration = _probe(path, f"{path} ({where})", report)
        if duration is not None:
            utts.append(Utterance(path.stem, path, duration, text.strip().lower()))
    return utts


def _read_librispeech(root: Path, report: SkipReport) -> list[Utterance]:
    transcripts: dict[str, str] = {}
    for trans in root.rglob("*.trans.txt"):
        for line in trans.read_text().splitlines():
            utt_id, _, text = line.strip().partition(" ")
            if utt_id and text.strip():
                transcripts[utt_id] = text.strip().lower()
    utts = []
    seen = set()
    for path in sorted(root.rglob("*.flac")):
        seen.add(path.stem)
        if path.stem not in transcripts:
            report.skip(str(path), "no transcript")
            continue
        duration = _probe(path, str(path), report)
        if duration is not None:
            utts.append(Utterance(path.stem, path, duration, transcripts[path.stem]))
    for utt_id in sorted(set(transcripts) - seen):
        report.skip(f"{root} ({utt_id})", "missing audio file")
    return utts


def shard_batches(durations: list[float] | np.ndarray, max_batch_seconds: float, epoch: int, seed: int,
                  rank: int = 0, world_size: int = 1, weights: list[float] | None = None) -> list[list[int]]:
    """Rank `rank`'s batches (indices into `durations`) for one epoch.

    Over all ranks of one epoch every utterance appears exactly once. Utterances are sorted by
    duration and dealt to ranks in random order, group by group, so each shard has the same mix
    of lengths and sizes differ by at most one utterance. The sorted utterances are then cut into
    steps: consecutive runs in which every rank's part — one batch of similar durations — has a
    padded size (utterances x longest) within `max_batch_seconds` (an utterance longer than the
    budget gets a batch of its own). Every rank has the same steps in the same (shuffled) order,
    so at each step all ranks work on utterances of about the same length and a synchronous
    group's members finish their batches together. The result depends only on (seed, epoch,
    rank, world_size, weights), so the world size may change between epochs.

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
    if weights is None:
        owner = np.empty(len(order), dtype=np.int64)
        for start in range(0, len(order), world_size):
            group = order[start:start + world_size]
            owner[group] = rng.permutation(world_size)[: len(group)]
        budgets = np.full(world_size, float(max_batch_seconds))
    else:
        share = _shares(weights, world_size)
        owner = _deal_by_share(order, share, rng)
        budgets = max_batch_seconds * world_size * share
    # the ranks with the larger budgets set the steps; one under half the largest budget may go
    # over its own by an utterance (its boundaries are coarse: it would cut every step short)
    pacing = budgets >= budgets.max() / 2
    steps, complete = [], []  # rank `rank`'s part of each step; whether every rank with a share has one
    parts, longest = [[] for _ in range(world_size)], np.zeros(world_size)

    def close_step():
        steps.append(parts[rank])
        complete.append(all(parts[r] for r in range(world_size) if budgets[r] > 0))

    for i in order:
        r, d = owner[i], durations[i]
        if parts[r] and pacing[r] and (len(parts[r]) + 1) * max(longest[r], d) > budgets[r]:
            close_step()  # some rank's batch is full: the step ends for every rank
            parts, longest = [[] for _ in range(world_size)], np.zeros(world_size)
        parts[r].append(int(i))
        longest[r] = max(longest[r], d)
    if any(parts):
        close_step()
    shuffled = np.random.default_rng([seed, epoch, world_size]).permutation(len(steps))  # the same on every rank
    # steps that some rank has no part of go last, so skipping them shifts no rank out of step
    ordered = [j for j in shuffled if complete[j]] + [j for j in shuffled if not complete[j]]
    return [steps[j] for j in ordered if steps[j]]


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
