"""Training from audio shards (`jobs.data.audio_shards`, at a folder or an `s3://` URI): which shards
each learner streams in each epoch, and its batches cut as the shards stream in.

Nothing reads the corpus to plan it: an epoch's shards are dealt to the ranks from the index's
names and counts alone (`plan_shards`), in an order shuffled by (seed, epoch), so that every shard
is read by exactly one rank per epoch. A learner then streams its shards one after the other,
each member once, with at most `prefetch` batches decoded ahead of its step: its memory is bounded
by that, whatever the corpus's size. A shard holds its utterances in order of duration, so cutting
the stream greedily (utterances x longest within `max_batch_seconds`) gives batches of similar
lengths.

A stream's `position` counts the planned utterances passed (trained, skipped, or lost with a
shard), from the epoch's start: a resumed learner passes over that many members without decoding
them. An utterance too long or unreadable is skipped and counted by `<shard>:<id>`; a shard that
cannot be opened or read, or that ends before its index's count, is skipped from there on and
counted by its name; a member with unusable JSON, or whose audio is longer than its JSON states, is
skipped and counted like an unreadable one, and so are the index's unusable entries
(`jobs.data.audio_shards`: nothing a bucket holds is trusted).
"""

from __future__ import annotations

import math
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from jobs.data.audio_shards import INDEX, MALFORMED_MEMBER, AudioShards, ShardUtterance, UnusableMember
from jobs.data.batch import Batch, padded_batch
from jobs.data.heap import HeapTrimmer
from jobs.data.lhotse_corpora import SharShards, is_shar
from jobs.data.manifests import STATED_SLACK_S, TOO_LONG, AudioError, DataError, first_line
from jobs.data.pipeline import Prefetcher
from jobs.features.augment import Augment, Draws
from jobs.features.device import AudioBatch
from jobs.features.filterbanks import Fbank, normalized
from jobs.features.mel_augment import MelAugment

TOKENIZER_SENTENCES = 10_000  # transcripts a BPE tokenizer learns from: a sample, whatever the corpus's size
# (50,000 made a 100,000-utterance corpus's jobs start 4-5 s later than a 10,000-utterance one's)
UNREADABLE_SHARD = "unreadable shard"
CUT_SHORT = "shard cut short"
BUDGET_FLOOR_S = STATED_SLACK_S  # what an utterance counts for in a batch's budget at least: as none decodes to more
# than its stated duration and this (`ShardUtterance.allowed_seconds`), no batch holds over twice its budget of audio,
# whatever durations a shard's JSON states


def is_shard_source(source) -> bool:
    """Whether a data source names shards to stream: a URI, or a folder with Chorus's index or Lhotse Shar."""
    return "://" in str(source) or (Path(source) / INDEX).is_file() or is_shar(source)


def open_shards(source) -> AudioShards | SharShards:
    """The shards at `source`: Lhotse Shar where its first cuts manifest is, else Chorus's audio shards."""
    return SharShards(source) if is_shar(source) else AudioShards(source)


def plan_shards(counts: list[int], epoch: int, seed: int, rank: int, world_size: int,
                weights: list[float] | None = None) -> list[int]:
    """The indices of the shards rank `rank` streams in `epoch`, in the order it reads them.

    The shards, in an order shuffled by (seed, epoch), go one by one to the rank with the fewest
    utterances for its share (`weights`: one per rank; none: equal shares; a rank of weight 0 gets
    none), so over the ranks each shard is read exactly once. Depends only on (counts, seed, epoch,
    world_size, weights), so the world size may change between epochs."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    share = np.full(world_size, 1.0 / world_size) if weights is None else _shares(weights, world_size)
    load, mine = np.zeros(world_size), []
    for i in np.random.default_rng([seed, epoch]).permutation(len(counts)).tolist():
        r = int(np.argmin(np.where(share > 0, (load + counts[i]) / np.where(share > 0, share, 1.0), np.inf)))
        load[r] += counts[i]
        if r == rank:
            mine.append(i)
    return mine


def _shares(weights: list[float], world_size: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) != world_size or not np.all(w >= 0) or not w.sum() > 0:
        raise ValueError(f"weights must be {world_size} numbers >= 0, not all 0, got {list(weights)}")
    return w / w.sum()


class StreamCorpus:
    """A training corpus of audio shards: its size and transcripts from the index and `texts.txt`,
    its batches streamed (`batches`). Utterance `i` of the corpus (for augmentation's draws) is
    the i-th member over the shards in the index's order. `tokenizer` is asked for the tokenizer
    when a batch is made; with `on_device`, batches carry the waveforms and augmentation draws
    for the learner's device to compute their features; with `shard_features`, features come from
    the log-mel power the shards carry (augmented by `jobs.features.mel_augment`), no audio is decoded."""

    def __init__(self, source, fbank: Fbank, tokenizer: Callable, max_seconds: float = math.inf,
                 augment: Augment | None = None, on_device: bool = False, shard_features: bool = False):
        self.source, self.shards = str(source), open_shards(source)
        self.fbank, self.tokenizer, self.max_seconds = fbank, tokenizer, max_seconds
        self.augment = augment if augment is not None and augment.enabled else None
        self.on_device, self.shard_features = on_device and not shard_features, shard_features
        if shard_features:
            self._check_features(fbank.num_mel_bins)
        self.mel_augment = MelAugment(self.augment, fbank) if shard_features and self.augment else None
        self.counts = [self.shards.counts[name] for name in self.shards.names]
        self.first = np.concatenate([[0], np.cumsum(self.counts)]).astype(int).tolist()  # each shard's first utterance
        self.skipped = self.shards.skipped  # the index's unusable entries, to begin with
        self._skipped_keys = set(self.skipped.keys)

    def __len__(self) -> int:
        return self.shards.utterances

    def _check_features(self, mel_bins: int) -> None:
        where = f"{self.source.split('?')[0]}: data.shard_features"
        if self.shards.mel_bins is None:
            raise DataError(f"{where} is on, but these shards carry no features (write them with "
                            f"`chorus shards MANIFEST --out URI --features {mel_bins}`)")
        if self.shards.mel_bins != mel_bins:
            raise DataError(f"{where} is on, but these shards carry {self.shards.mel_bins} mel channels and "
                            f"features.num_mel_bins is {mel_bins}")

    def skip(self, where: str, reason: str, key: str) -> None:
        """Count a skip once, however many epochs come across it again."""
        if key not in self._skipped_keys:
            self._skipped_keys.add(key)
            self.skipped.skip(where, reason, key)

    def texts(self) -> list[str]:
        """Every transcript (`texts.txt`): the words a lexicon decoder may output."""
        return self.shards.texts()

    def tokenizer_texts(self) -> list[str]:
        """Transcripts to learn units from: a sample of at most TOKENIZER_SENTENCES (every learner
        learns them at its start: the time must not grow with the corpus)."""
        return self.shards.texts(TOKENIZER_SENTENCES)

    def batches(self, rank: int, world_size: int, epoch: int, seed: int, data, start: int = 0,
                weights: list[float] | None = None) -> ShardStream:
        """Rank `rank`'s stream of batches of `epoch` (`data`: the spec's data section), from
        planned utterance `start` on."""
        plan = plan_shards(self.counts, epoch, seed, rank, world_size, weights)
        return ShardStream(self, plan, epoch, data.max_batch_seconds, start, data.prefetch_batches)

    def collate(self, items: list[tuple[int, ShardUtterance]], epoch: int, shard: str) -> Batch | None:
        """A batch of a shard's utterances (corpus number, utterance) for `epoch`, augmented; an
        unreadable one is skipped and counted as `<shard>:<id>`."""
        feats, waveforms, draws, kept = [], [], [], []
        for i, utt in items:
            try:
                source = utt.log_mel if self.shard_features else utt.waveform
            except AudioError as exc:
                self.skip(f"{utt.id} in {self.source}/{shard} ({exc.detail})", exc.reason, f"{shard}:{utt.id}")
                continue
            kept.append(utt)
            if self.on_device:
                waveforms.append(source)
                draws.append(self.augment.draws(epoch, i, len(source)) if self.augment else Draws())
            else:
                feats.append(self._features(source, utt.power, epoch, i))
        audio = AudioBatch.of(waveforms, draws) if self.on_device and kept else None
        return padded_batch(feats, [u.text for u in kept], [u.id for u in kept], self.tokenizer(), audio)

    def _features(self, source, power: float, epoch: int, i: int):
        """Utterance `i`'s features for `epoch` from its log-mel power (`shard_features`) or its
        waveform, augmented when augmentation is on."""
        if self.shard_features:
            return self.mel_augment(source, power, epoch, i) if self.mel_augment else normalized(source)
        if self.augment is not None:
            return self.fbank(self.augment(source, epoch, i), warp=self.augment.warp(epoch, i))
        return self.fbank(source)


class ShardStream:
    """One learner's batches of one epoch, streamed from its planned shards (`shards`: indices
    into the corpus's), from planned utterance `start` on. `len()` is the planned utterances (from
    the index); `position` the planned utterances passed by the batches handed out so far, counted
    from the epoch's start. With `prefetch` > 0 that many batches are prepared ahead in a
    background thread; `position` still counts only those handed out."""

    def __init__(self, corpus: StreamCorpus, shards: list[int], epoch: int, max_batch_seconds: float,
                 start: int = 0, prefetch: int = 0):
        self.corpus, self.shards, self.epoch, self.budget = corpus, shards, epoch, max_batch_seconds
        self.position, self.prefetch = start, prefetch

    def __len__(self) -> int:
        return sum(self.corpus.counts[i] for i in self.shards)

    def __iter__(self) -> Iterator[Batch]:
        whole_epoch, trained = self.position == 0, False
        prepared = Prefetcher(self._prepared(), self.prefetch) if self.prefetch else self._prepared()
        trim = HeapTrimmer()
        try:
            for position, batch in prepared:
                self.position = position
                if batch is not None:
                    trained = True
                    yield batch
                    trim()  # the step is done with the batch
        finally:
            if isinstance(prepared, Prefetcher):
                prepared.close()
        if whole_epoch and len(self) and not trained:  # training on nothing, silently, is no training
            raise DataError(f"none of the {len(self)} utterances of this learner's shards of {self.corpus.source} "
                            f"could be read on host {socket.gethostname()} ({self.corpus.skipped.describe()})")

    def _prepared(self) -> Iterator[tuple[int, Batch | None]]:
        """(position after it, batch) for each batch from `position` on, shard after shard."""
        passed = 0  # planned utterances before the current shard
        for i in self.shards:
            count = self.corpus.counts[i]
            if self.position < passed + count:
                for end, items in self._cut(i, max(0, self.position - passed)):
                    yield passed + end, self.corpus.collate(items, self.epoch, self.corpus.shards.names[i])
            passed += count

    def _cut(self, i: int, skip: int) -> Iterator[tuple[int, list[tuple[int, ShardUtterance]]]]:
        """Shard `i`'s batches from its member `skip` on, as (members passed after it, the batch's
        (corpus number, utterance) pairs); the last one passes the whole shard, however it ended."""
        corpus, name, count = self.corpus, self.corpus.shards.names[i], self.corpus.counts[i]
        batch, longest, n = [], 0.0, skip
        try:
            for utt in corpus.shards.read(name, skip, corpus.max_seconds):
                if isinstance(utt, UnusableMember):
                    n += 1
                    corpus.skip(f"{utt.id} in {corpus.source}/{name} ({utt.detail})", MALFORMED_MEMBER,
                                f"{name}:{utt.id}")
                    continue
                seconds = max(utt.duration, BUDGET_FLOOR_S)
                if batch and (len(batch) + 1) * max(longest, seconds) > self.budget:
                    yield n, batch
                    batch, longest = [], 0.0
                n += 1
                if utt.duration > corpus.max_seconds:
                    corpus.skip(f"{utt.id} in {corpus.source}/{name} ({utt.duration:.0f} s > "
                                        f"{corpus.max_seconds:g} s)", TOO_LONG, f"{name}:{utt.id}")
                    continue
                batch.append((corpus.first[i] + n - 1, utt))
                longest = max(longest, seconds)
        except (OSError, tarfile.TarError, EOFError, ValueError) as exc:
            corpus.skip(f"{corpus.source}/{name} from utterance {n} of {count} ({first_line(exc)})",
                                UNREADABLE_SHARD, name)
        else:
            if n < count:
                corpus.skip(f"{corpus.source}/{name} (it ends after {n} of {count} utterances)",
                                    CUT_SHORT, name)
        yield count, batch
