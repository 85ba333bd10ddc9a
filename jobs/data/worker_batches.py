"""A learner's batches prepared in worker processes (`data.workers`): audio decode, augmentation,
filterbanks and padding in parallel, by torch's `DataLoader` with persistent workers.

The workers outlive epochs and shards (each keeps its own feature cache warm), so they are told
what to prepare item by item: each item is a planned batch as (position, epoch, utterance
indices), and the worker collates those utterances for that epoch. Nothing about a shard's plan
lives in a worker, so a new epoch, a resumed position or a resized shard only changes the items
asked for; batches come back in the order asked (the DataLoader's), so the batches, their
augmentation draws (seeded by seed, epoch and utterance) and a shard's `position` are those of the
thread path. Utterances a worker finds unreadable come back with their batch and are counted in
the learner's own corpus (its skip report and its set of unreadable utterances).

A new iteration (the next epoch, another shard) makes the previous one's iterator stale: it yields
nothing more (a DataLoader has one live iterator; its prefetched batches of the old items are
dropped, never handed to the new one). Each worker runs one torch thread, and keeps a feature cache
of `data.cache_mb` of its own (the learner's memory bound is per process). On a GPU learner the
batches come back in page-locked memory, so their copy to the device overlaps the step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class _PlannedItems(Sampler):
    """The items of the current iteration, set before it starts."""

    def __init__(self):
        self.items: list[tuple[int, int, tuple[int, ...]]] = []

    def __iter__(self):
        return iter(list(self.items))

    def __len__(self) -> int:
        return len(self.items)


class _Collated(Dataset):
    """Item (position, epoch, indices) -> (position, the corpus's batch of them or None, the
    skips this made: key -> reason, the utterances it found unreadable)."""

    def __init__(self, corpus):
        self.corpus = corpus

    def __getitem__(self, item):
        position, epoch, indices = item
        skipped, bad = len(self.corpus.skipped.keys), self.corpus.unreadable()
        batch = self.corpus.collate(list(indices), epoch)
        return position, batch, self.corpus.skipped.since(skipped), self.corpus.unreadable() - bad


def _as_is(item):
    return item


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)  # a worker's filterbanks are small ops: more threads only compete


def default_workers() -> int:
    """`data.workers` left unset: the learner's CPUs (its torch threads) but one when a GPU runs
    its step (CUDA is hidden from learners that reserved none), else 0."""
    return max(0, torch.get_num_threads() - 1) if torch.cuda.is_available() else 0


class WorkerBatches:
    """A shard's batches made by worker processes, handed out in order.

    Args:
    corpus: the training `Corpus` (its copy in each worker prepares batches).
    workers: worker processes (>= 1).
    depth: batches prepared ahead per worker (DataLoader's `prefetch_factor`).
    """

    def __init__(self, corpus, workers: int, depth: int = 2):
        self.corpus, self._items, self._iteration = corpus, _PlannedItems(), 0
        self._loader = DataLoader(_Collated(corpus), batch_size=None, sampler=self._items, num_workers=workers,
                                  collate_fn=_as_is, persistent_workers=True, prefetch_factor=max(1, depth),
                                  worker_init_fn=_one_thread, pin_memory=torch.cuda.is_available())

    def close(self) -> None:
        """Stop the worker processes now. Left to the garbage collector, the loader's persistent
        workers are joined whenever it runs, by whatever code is running then (in a test suite a
        later test waited 10-30 s in a model's constructor for them)."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
            self._loader._iterator = None

    def prepared(self, plan: list[list[int]], start: int, epoch: int) -> Iterator[tuple[int, object]]:
        """(position, batch or None) for positions `start`.. of `plan` in `epoch`, in order."""
        self._iteration += 1
        mine = self._iteration
        self._items.items = [(p, epoch, tuple(plan[p])) for p in range(start, len(plan))]
        if not self._items.items:
            return
        stream = iter(self._loader)
        while mine == self._iteration:
            item = next(stream, None)
            if item is None:
                return
            position, batch, skips, bad = item
            self.corpus.note_unreadable(skips, bad)
            yield position, batch
