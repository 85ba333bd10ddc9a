"""The input pipeline's memory and overlap, for corpora that do not fit in memory: a feature cache
bounded in bytes (the least recently used features go first) and a prefetcher that prepares the
next batches (audio decode, filterbanks, padding) in a background thread while the step runs (the
heap trimmer that hands freed pages back as batches come and go is `heap.py`'s).

Example:
    >>> cache = FeatureCache(max_bytes=1 << 20)
    >>> cache.put(("train", 0), torch.zeros(100, 80))
    >>> cache.get(("train", 0)).shape, cache.nbytes
    (torch.Size([100, 80]), 32000)
    >>> list(Prefetcher(iter(range(3)), depth=2))
    [0, 1, 2]
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import NamedTuple

import torch


class FeatureCache:
    """Tensors by key, at most `max_bytes` of them (None: no bound); safe to share between the
    prefetch thread and the step's thread. `hits`, `misses` and `evictions` count since creation.

    A bounded cache keeps its tensors' bytes in one store of `max_bytes`, allocated once and cut
    into pages, and `get` hands out a copy: what the cache costs in memory is its bound, however
    entries come and go. (Kept as separate tensors, entries of every size freed and allocated in
    turn left the allocator's heap fragmented: a 64 MB cache cost 78 MB of a process's resident
    memory, a 32 MB one 39-40 MB.) A bounded cache's pages hold one entry each: its last page's
    unused part (half a page on average, 16 KiB pages) is capacity lost, not memory over the bound."""

    def __init__(self, max_bytes: float | None):
        self.max_bytes = max_bytes
        self._pages = None if max_bytes is None else _Pages(int(max_bytes))
        self._items: OrderedDict[Hashable, torch.Tensor | _Entry] = OrderedDict()
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
            return value if self._pages is None else self._pages.read(value)

    def put(self, key: Hashable, value: torch.Tensor) -> None:
        """Keep `value` unless it alone is over the bound (its whole pages over the store's); drop
        the least recently used to fit."""
        size = value.element_size() * value.nelement()
        if self._pages is not None:
            if self._pages.needed(size) > self._pages.count:
                return
            value = value.detach().resolve_conj().resolve_neg().contiguous()  # outside the lock
        with self._lock:
            self._drop(key)
            if self._pages is None:
                self._items[key] = value
            else:
                while self._pages.needed(size) > len(self._pages.free) and self._items:
                    self._drop(next(iter(self._items)))
                    self.evictions += 1
                self._items[key] = self._pages.write(value)
            self.nbytes += size

    def _drop(self, key: Hashable) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.nbytes -= old.element_size() * old.nelement() if self._pages is None else old.nbytes
            if self._pages is not None:
                self._pages.free.extend(old.pages)


class _Entry(NamedTuple):
    """Where a cached tensor's bytes are: its pages in the store, in order, and how to view them."""
    pages: list[int]  # not a tensor: small tensors kept for long pin the heap between large ones
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


class _Pages:
    """One store of `max_bytes` bytes in pages of a power of two (at most PAGE_BYTES, at least 64
    to a store), with the free ones' indices. The store's memory is touched only as pages are first
    written, so an unfilled cache costs what it holds (it does take `max_bytes` of address space
    at once: a limit on virtual memory, `ulimit -v`, must leave room for it). A tensor goes in and
    out in two copies (its whole pages, indexed, and the last one's part) whatever its number of
    pages."""

    PAGE_BYTES = 16 * 1024

    def __init__(self, max_bytes: int):
        self.size = 1 << max(0, min(self.PAGE_BYTES, max_bytes // 64).bit_length() - 1)
        self.count = max_bytes // self.size
        self.store = torch.empty(self.count, self.size, dtype=torch.uint8)
        self.free = list(range(self.count - 1, -1, -1))  # pop() takes the lowest first

    def needed(self, nbytes: int) -> int:
        return -(-nbytes // self.size)

    def write(self, tensor: torch.Tensor) -> _Entry:
        """`tensor` (contiguous) into free pages; on an error its pages go back to the free list."""
        data = tensor.view(-1).view(torch.uint8)
        pages = [self.free.pop() for _ in range(self.needed(data.numel()))]
        try:
            whole, tail = divmod(data.numel(), self.size)
            whole_pages = torch.tensor(pages[:whole], dtype=torch.long)
            self.store.index_copy_(0, whole_pages, data[:whole * self.size].view(whole, self.size))
            if tail:
                self.store[pages[-1], :tail] = data[whole * self.size:]
        except BaseException:
            self.free.extend(reversed(pages))
            raise
        return _Entry(pages, data.numel(), tensor.dtype, tensor.shape)

    def read(self, entry: _Entry) -> torch.Tensor:
        out = torch.empty(entry.nbytes, dtype=torch.uint8)  # exactly its bytes: no slack kept alive with it
        whole, tail = divmod(entry.nbytes, self.size)
        torch.index_select(self.store, 0, torch.tensor(entry.pages[:whole], dtype=torch.long),
                           out=out[:whole * self.size].view(whole, self.size))
        if tail:
            out[whole * self.size:] = self.store[entry.pages[-1], :tail]
        return out.view(entry.dtype).view(entry.shape)


_END = object()
CLOSE_WAIT_S = 10.0  # how long `Prefetcher.close` waits for its thread: a batch is prepared in well under this; a
# source stalled in a read (an S3 request that hangs until its own timeout, minutes) must not hold up the
# learner's exit, so the (daemon) thread is then left to end at its next item, or with the process
log = logging.getLogger("chorus.data")


class Prefetcher:
    """Iterates `source` in a daemon thread, at most `depth` items ahead of the consumer. An
    exception in `source` is raised to the consumer at the item where it happened; `close()` (also
    on garbage collection of a generator that wraps it) stops the thread without draining `source`,
    waiting at most CLOSE_WAIT_S for it."""

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
        self._thread.join(CLOSE_WAIT_S)
        if self._thread.is_alive():
            log.warning("the prefetch thread is still inside its source after %g s (a stalled read?); left to end "
                        "on its own", CLOSE_WAIT_S)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()
