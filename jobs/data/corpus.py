"""A corpus as the ASR workload trains on it: its utterances (from a manifest or a features
folder), each one's features computed on first use, kept in a byte-bounded cache, augmented per
epoch or left for the learner's device to compute; and one shard's batches of one epoch, prepared
in the learner's process, a background thread or worker processes, resumable from a position.

Example:
    >>> corpus = Corpus("corpus/train.jsonl", Fbank(), tokenizer=lambda: CharTokenizer())  # doctest: +SKIP
    >>> batch = corpus.collate([0, 1, 2])  # a padded batch of clean features  # doctest: +SKIP
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from jobs.data.batch import Batch, padded_batch
from jobs.data.feature_shards import FeatureShards, is_features_folder
from jobs.data.manifests import AudioError, DataError, Utterance, read_corpus, shard_batches, utterance_audio
from jobs.data.pipeline import FeatureCache, Prefetcher
from jobs.data.worker_batches import WorkerBatches, default_workers
from jobs.features.augment import Augment, Draws
from jobs.features.device import AudioBatch
from jobs.features.filterbanks import Fbank
from jobs.tokenizer import BpeTokenizer, CharTokenizer

WARPS_NEED_AUDIO = "decoding.warps reads each utterance's audio through warped filterbanks"
WARPS_ADVICE = "set decoding.warps to null (chorus eval: --no-warps) or name the audio's manifest"


class Corpus:
    """A corpus's utterances with their features computed on first use (or read from a features
    folder's shards, `jobs.data.feature_shards`) and kept in `cache` (a `FeatureCache`, shared by the
    workload's corpora; none: an unbounded cache of its own). `tokenizer` is asked for the
    tokenizer when a batch is made (a BPE one is trained on first use). With an enabled `augment`,
    a batch of an epoch (`collate(..., epoch=)`) is made from the cached clean waveforms, augmented;
    without an epoch (evaluation), from the clean features. With `on_device` (and audio), a batch of
    an epoch carries the clean waveforms and augmentation draws instead, for the learner's device
    to compute its features (`Batch.featurized`)."""

    def __init__(self, source: str | Path, fbank: Fbank, tokenizer: Callable[[], CharTokenizer | BpeTokenizer],
                 max_seconds: float = math.inf, cache: FeatureCache | None = None, augment: Augment | None = None,
                 on_device: bool = False):
        self.source = Path(source)
        self.shards = FeatureShards(source, fbank.num_mel_bins, max_seconds) if is_features_folder(source) else None
        self.utterances, self.skipped = ((self.shards.utterances, self.shards.skipped) if self.shards
                                         else read_corpus(source, max_seconds))
        self.fbank, self.tokenizer, self.max_seconds = fbank, tokenizer, max_seconds
        self.augment = augment if augment is not None and augment.enabled else None
        if self.augment is not None and self.shards is not None:
            raise DataError(f"augment needs audio, and {source} is a features folder: switch augmentation off or "
                            f"train from the audio's manifest")
        self.cache = cache if cache is not None else FeatureCache(None)
        self._key = str(self.source.resolve())
        self.on_device = on_device and self.shards is None
        self._bad: set[int] = set()
        self._workers: WorkerBatches | None = None

    def in_workers(self, workers: int, depth: int) -> WorkerBatches | None:
        """This corpus's batches prepared in `workers` processes (`data.workers`; None for 0),
        started on first use, once its tokenizer exists (so no worker trains one of its own)."""
        if workers and self._workers is None:
            self.tokenizer()
            self._workers = WorkerBatches(self, workers, depth)
        return self._workers

    def close(self) -> None:
        """Stop its worker processes, if it started any (`in_workers`)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def unreadable(self) -> set[int]:
        """The utterances found unreadable so far (a copy)."""
        return set(self._bad)

    def note_unreadable(self, skips: dict[str, str], indices: set[int]) -> None:
        """What another process's reads of this corpus found unreadable (a worker's): counted once
        here, and not read again here."""
        self.skipped.merge(skips)
        self._bad |= indices

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def durations(self) -> list[float]:
        return [u.duration for u in self.utterances]

    def texts(self) -> list[str]:
        return [u.text for u in self.utterances]

    def tokenizer_texts(self) -> list[str]:
        """Transcripts to learn units from: all of them (they are in memory already)."""
        return self.texts()

    def batches(self, rank: int, world_size: int, epoch: int, seed: int, data, start: int = 0,
                weights: list[float] | None = None) -> ShardBatches:
        """Rank `rank`'s batches of `epoch` (`data`: the spec's data section), from planned batch
        `start` on (`jobs.data.manifests.shard_batches`)."""
        plan = shard_batches(self.durations, data.max_batch_seconds, epoch, seed, rank, world_size, weights)
        workers = self.in_workers(default_workers() if data.workers is None else data.workers, data.prefetch_batches)
        return ShardBatches(self, plan, start, data.prefetch_batches, epoch, workers)

    def tried(self, i: int) -> bool:
        """Whether utterance `i`'s features are in the cache, or its audio proved unreadable."""
        return i in self._bad or (self._key, i, "features") in self.cache

    def features(self, i: int, epoch: int | None = None, warp: float = 1.0) -> torch.Tensor | None:
        """Utterance `i`'s features: clean, or with `epoch` and an augmentation, augmented for that epoch,
        or read through a filterbank warped by `warp` (test-time augmentation, `decoding.warps`)."""
        if warp != 1.0:  # read once, at the end of a job: not kept
            if self.shards is not None:
                raise DataError(f"{WARPS_NEED_AUDIO}: {self.source} is a features folder; {WARPS_ADVICE}")
            return self._cached(i, f"features@{warp:g}", lambda utt: self.fbank(
                utterance_audio(utt, self.max_seconds), warp=warp), keep=False)
        if self.augment is not None and epoch is not None:
            waveform = self._cached(i, "waveform", lambda utt: utterance_audio(utt, self.max_seconds))
            if waveform is None:
                return None
            return self.fbank(self.augment(waveform, epoch, i), warp=self.augment.warp(epoch, i))
        return self._cached(i, "features", lambda utt: self.shards.read(i) if self.shards
                            else self.fbank(utterance_audio(utt, self.max_seconds)))

    def _cached(self, i: int, what: str, read: Callable[[Utterance], torch.Tensor],
                keep: bool = True) -> torch.Tensor | None:
        """`read(utterance i)` through the cache (under `what`; kept there if `keep`); None, the
        utterance skipped, when unreadable."""
        if i in self._bad:
            return None
        key = (self._key, i, what)
        value = self.cache.get(key)
        if value is None:
            utt: Utterance = self.utterances[i]
            try:
                value = read(utt)
            except AudioError as exc:
                self._bad.add(i)
                where = f"utterance {utt.id} in {utt.path}" if self.shards else str(utt.path)
                self.skipped.skip(f"{where} ({exc.detail})" if exc.detail else where, exc.reason,
                                  f"{utt.path}:{utt.id}" if self.shards else str(utt.path))
                return None
            if keep:
                self.cache.put(key, value)
        return value

    def collate(self, indices: list[int], epoch: int | None = None) -> Batch | None:
        if self.on_device and epoch is not None:
            return self._audio_batch(indices, epoch)
        return self._batch([(i, f) for i in indices if (f := self.features(i, epoch)) is not None])

    def _audio_batch(self, indices: list[int], epoch: int) -> Batch | None:
        """The readable utterances of `indices` as clean waveforms with their draws for `epoch`."""
        items = [(i, w) for i in indices if (w := self._cached(
            i, "waveform", lambda utt: utterance_audio(utt, self.max_seconds))) is not None]
        draws = [self.augment.draws(epoch, i, len(w)) if self.augment else Draws() for i, w in items]
        return self._batch(items, AudioBatch.of([w for _, w in items], draws) if items else None)

    def warped(self, indices: list[int], warps: list[float]) -> list[Batch] | None:
        """A batch per warp of `warps` (test-time augmentation, `decoding.warps`) of the utterances
        of `indices` readable at every warp, the same ones in the same order in each; None if none is."""
        readings = [(i, [self.features(i, warp=warp) for warp in warps]) for i in indices]
        readable = [(i, feats) for i, feats in readings if all(f is not None for f in feats)]
        if not readable:
            return None
        return [self._batch([(i, feats[k]) for i, feats in readable]) for k in range(len(warps))]

    def _batch(self, items: list[tuple[int, torch.Tensor]], audio: AudioBatch | None = None) -> Batch | None:
        """(utterance index, features) pairs as a padded batch, or with `audio` (index, waveform)
        pairs, their features left to compute; None for none."""
        utts = [self.utterances[i] for i, _ in items]
        return padded_batch([f for _, f in items], [u.text for u in utts], [u.id for u in utts], self.tokenizer(),
                            audio)


class ShardBatches:
    """One shard's batches of one epoch, from planned batch `start` on; `len()` is known before any
    audio is read. A batch whose every utterance turns out unreadable is left out. `position` is
    the number of planned batches handed out (or left out) so far, counted from the epoch's start,
    so a resumed learner can carry on from there. With `workers` (a `WorkerBatches`), batches are
    prepared in its worker processes; else, with `prefetch` > 0, that many are prepared ahead in a
    background thread (`jobs.data.pipeline.Prefetcher`); `position` still counts only those handed out."""

    def __init__(self, corpus: Corpus, plan: list[list[int]], start: int = 0, prefetch: int = 0, epoch: int = 0,
                 workers: WorkerBatches | None = None):
        self.corpus, self.plan, self.position, self.prefetch, self.epoch = corpus, plan, start, prefetch, epoch
        self.workers = workers

    def __len__(self) -> int:
        return len(self.plan)

    def _prepared(self) -> Iterator[tuple[int, Batch | None]]:
        for position in range(self.position, len(self.plan)):
            yield position, self.corpus.collate(self.plan[position], self.epoch)

    def __iter__(self) -> Iterator[Batch]:
        whole_epoch, trained = self.position == 0, False
        if self.workers is not None:
            prepared = self.workers.prepared(self.plan, self.position, self.epoch)
        else:
            prepared = Prefetcher(self._prepared(), self.prefetch) if self.prefetch else self._prepared()
        try:
            for position, batch in prepared:
                self.position = position + 1
                if batch is not None:
                    trained = True
                    yield batch
        finally:
            if isinstance(prepared, Prefetcher):
                prepared.close()
        if whole_epoch and self.plan and not trained:  # training on nothing, silently, is no training
            n = sum(map(len, self.plan))
            raise DataError(f"none of the {n} utterances of this learner's shard of {self.corpus.source} could be "
                            f"read on host {socket.gethostname()} ({self.corpus.skipped.describe()})")
