"""A large value (a model, a learner's state) sent from one Ray process to another in pieces
small enough that each crosses the slowest link in a few seconds.

Ray moves an object as one transfer, and a receiver that has not got it within
`object_manager_pull_timeout_ms` (10 s by default) asks again — upon which the sender starts the
push over, every chunk resent. A 40 MB model at 5 Mbit/s takes ~64 s: its pushes repeated and
outlived the run, taking the link a group's own traffic needed (bench/README, DiLoCo). Here the
sender pickles the value and puts it into its object store as pieces of `PIECE_BYTES`; the
receiver fetches them `WINDOW` at a time and unpickles: 1 MiB in flight, 1.7 s at 5 Mbit/s and
8.4 s at 1 Mbit/s, the slowest link it is made for; on a fast link ~2 ms a pair of pieces more.

`put(value)` (in the sender; returns a small `Pieces` to return or pass on) and `take(pieces)`
(in the receiver). Without Ray (a learner in the driver's process) nothing crosses a link: the
`Pieces` holds the value itself.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

PIECE_BYTES = 1 << 19
WINDOW = 2


@dataclass(frozen=True)
class Pieces:
    """Object refs of a pickled value's pieces, in order (or, without Ray, the value itself)."""

    refs: tuple = ()
    size: int = 0
    value: Any = None

    def __repr__(self) -> str:
        return f"Pieces({len(self.refs)} of {self.size} bytes)" if self.refs else "Pieces(in process)"


def put(value, piece_bytes: int = PIECE_BYTES) -> Pieces:
    """`value` pickled into this process's object store as pieces of at most `piece_bytes`."""
    import numpy as np
    import ray

    if not ray.is_initialized():
        return Pieces(value=value)
    data = np.frombuffer(pickle.dumps(value, protocol=5), dtype=np.uint8)
    refs = tuple(ray.put(data[start:start + piece_bytes]) for start in range(0, len(data), piece_bytes))
    return Pieces(refs, len(data))


def take(pieces: Pieces, window: int = WINDOW):
    """The value `put` sent, its pieces fetched `window` at a time. Raises Ray's error when the
    sender died before they arrived."""
    import ray

    if not pieces.refs:
        return pieces.value
    refs, parts = list(pieces.refs), []
    for start in range(0, len(refs), window):
        parts.extend(ray.get(refs[start:start + window]))
    return pickle.loads(b"".join(parts))
