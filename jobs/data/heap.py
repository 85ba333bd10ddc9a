"""The C library's heap: a trimmer that hands the pages freed as batches come and go back to the
system (glibc keeps them otherwise). No torch here: it serves any process.

Example:
    >>> trim = HeapTrimmer(every=10)
    >>> for _ in range(10):
    ...     trim()  # the tenth call trims
"""

from __future__ import annotations

import ctypes
import ctypes.util


class HeapTrimmer:
    """Every `every` calls, glibc's `malloc_trim(0)`: freed heap pages go back to the system. A
    stream's batches differ in shape each step, and glibc keeps what their tensors freed, so a
    learner's resident memory climbs over an epoch without it (bench/README, "Shards at scale").
    Where the C library has no `malloc_trim` (not glibc) a call does nothing."""

    def __init__(self, every: int = 10):
        self.every, self.calls = every, 0
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        self._trim = getattr(libc, "malloc_trim", None)

    def __call__(self) -> None:
        self.calls += 1
        if self._trim is not None and self.calls % self.every == 0:
            self._trim(0)
