"""The input pipeline's memory and overlap, for corpora that do not fit in memory: a feature cache
bounded in bytes (the least recently used features go first) and a prefetcher that prepares the
next batches (audio decode, filterbanks, padding) in a background thread while the step runs.

Example:
    >>> cache = FeatureCache(max_bytes=1 << 20)
    >>> cache.put(("train", 0), torch.zeros(100, 80))
    >>> cache.get(("train", 0)).shape, cache.nbytes
    (torch.Size([100, 80]), 32000)
    >>> list(Prefetcher(iter(range(3)), depth=2))
    [0, 1, 2]
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator

import torch


class FeatureCache:
    """Tensors by key, at most `max_bytes` of them (None: no bound); safe to share between the
    prefetch thread and the step's thread. `hits`, `misses` and `evictions` count since creation."""

    def __init__(self, max_bytes: float | None):
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable) -> torch.Tensor | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: torch.Tensor) -> None:
        """Keep `value` unless it alone is over the bound; drop the least recently used to fit."""
        size = _bytes(value)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self.nbytes += size - (_bytes(old) if old is not None else 0)
            self._items[key] = value
            while self.max_bytes is not None and self.nbytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.nbytes -= _bytes(dropped)
                self.evictions += 1


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.element_size() * tensor.nelement()


_END = object()


class Prefetcher:
    """Iterates `source` in a daemon thread, at most `depth` items ahead of the consumer. An
    exception in `source` is raised to the consumer at the item where it happened; `close()` (also
    on garbage collection of a generator that wraps it) stops the thread without draining `source`."""

    def __init__(self, source: Iterator, depth: int):
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(source,), name="chorus-prefetch", daemon=True)
        self._thread.start()

    def _fill(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            self._put((_END, exc))

    def _put(self, entry) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item, error = self._queue.get()
        if item is _END:
            self._done = True
            self._thread.join()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
