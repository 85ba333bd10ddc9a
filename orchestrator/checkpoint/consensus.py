"""The group's averaged model, computed where the weights are: the learners add their models up in
a binary tree (each sum is a call on a learner whose arguments are other learners' results, so
the tensors go learner to learner through Ray's object store and never through the driver), and
each learner measures its own distance to the mean. The driver only wires the calls: O(log N)
depth, N - 1 additions, no model bytes in its process.

Learners whose weights are equal by construction (allreduce; DiLoCo once settled) skip the tree:
one replica is the average, and equal digests of their weights stand for distances of 0.
"""

from __future__ import annotations


def model_sum(handles: list) -> tuple[object, list]:
    """(a ref to the sum of the learners' flat model states, the refs of each learner's own
    state, in `handles`' order). Level by level, pairs are added by the learner that produced
    the pair's left half, so the work spreads over the learners."""
    leaves = [h.model_vector.remote() for h in handles]
    level = list(zip(leaves, handles, strict=True))
    while len(level) > 1:
        pairs = [level[i:i + 2] for i in range(0, len(level), 2)]
        level = [(left[1].add_vectors.remote(left[0], right[0]), left[1]) if right else (left[0], left[1])
                 for left, right in ((p[0], p[1] if len(p) > 1 else None) for p in pairs)]
    return level[0][0], leaves


def distances(handles: list, total, count: int) -> list:
    """Refs of each learner's L2 distance (trainable weights) to the mean `total / count`."""
    return [h.distance_to.remote(total, count) for h in handles]


def digests_equal(runtime, handles: list) -> bool:
    """Whether every learner's weights have the same digest (`weights_digest`: a few bytes each,
    where a distance moves the whole model to every node). False where one failed to answer: the
    distances then fail with it, and the snapshot is taken again."""
    try:
        return len(set(runtime.get([h.weights_digest.remote() for h in handles]))) == 1
    except Exception as exc:  # noqa: BLE001 - a learner died meanwhile
        if not runtime.failed_remotely(exc):
            raise
        return False
