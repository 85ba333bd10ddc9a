"""What measured speeds and hosts imply for a group: each allreduce learner's share of a step's
batch (`batch_shares`) and the gossip ring order (`ring_by_speed`, `ring_by_host`). Pure functions
of the speeds and hosts."""

from __future__ import annotations

SIT_OUT_SHARE = 0.5  # x an equal share: below it, a learner that still straggles sits out
NEAR_PROPORTIONAL = 1.25  # ... or under it by speed, and its share now at most this x that
STRAGGLING = 1.1  # ... "straggles": its compute per step exceeds the others' slowest by this factor


def batch_shares(speeds: list[float], current: list[float] | None = None,
                 step_compute_s: list[float] | None = None) -> list[float]:
    """Each learner's share of an allreduce step's global batch (and of the epoch's data):
    proportional to its measured speed, so fast and slow learners finish a step together.

    Proportional shares assume a step's cost grows with its batch. A step also has a fixed cost
    (kernel launches, the recurrent layers' time steps, the optimizer), and a learner slow at
    that too may straggle however small its batch. So, given the `current` shares and each
    learner's mean compute seconds per step at them, a learner whose steps take more than 1.1x
    the slowest of the others' gets share 0 when it has had a small share already: its current
    share is under half an equal one, or its proportional share is and it has about that
    (within 25%) now. It sits out, keeping its replica in step (it takes part in every
    all-reduce without a batch), until the shares are planned afresh (the membership changes).
    At least one learner always keeps a share.

    Example:
        >>> batch_shares([60.0, 60.0, 60.0, 20.0])
        [0.3, 0.3, 0.3, 0.1]
        >>> batch_shares([60.0, 60.0, 60.0, 9.0], current=[0.3, 0.3, 0.3, 0.1],
        ...              step_compute_s=[0.17, 0.18, 0.17, 0.27])
        [0.3333, 0.3333, 0.3333, 0.0]
        >>> batch_shares([53.0, 51.0, 50.0, 19.0], current=[0.28, 0.3, 0.29, 0.13],
        ...              step_compute_s=[0.2, 0.21, 0.21, 0.48])
        [0.3442, 0.3312, 0.3247, 0.0]
    """
    if not speeds or any(s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {speeds}")
    out = [float(s) for s in speeds]
    if current is not None and step_compute_s is not None:
        n, small = len(speeds), SIT_OUT_SHARE / len(speeds)
        proportional = [s / sum(out) for s in out]
        for i in range(n):
            others = [step_compute_s[j] for j in range(n) if j != i and current[j] > 0]
            had_small = current[i] < small or (proportional[i] < small
                                               and current[i] <= NEAR_PROPORTIONAL * proportional[i])
            sits_out = current[i] == 0 or (had_small and others and step_compute_s[i] > STRAGGLING * max(others))
            if sits_out and sum(1 for v in out if v > 0) > 1:
                out[i] = 0.0
    total = sum(out)
    return [round(s / total, 4) for s in out]


def ring_by_speed(speeds: dict[int, float]) -> list[int]:
    """A gossip ring order (learner ids) with the fastest learners at the active, even positions
    and the slowest at the passive ones: an active learner mixes once per own step, so a slow
    one would mix rarely, while a passive learner is averaged by both neighbours every step
    they take; and no active learner waits on a passive one that is busy being slow.

    Example:
        >>> ring_by_speed({0: 50.0, 1: 20.0, 2: 55.0, 3: 52.0})
        [2, 0, 3, 1]
    """
    by_speed = sorted(speeds, key=lambda i: -speeds[i])
    half = (len(by_speed) + 1) // 2
    actives, passives = by_speed[:half], by_speed[half:]
    return [(actives if k % 2 == 0 else passives).pop(0) for k in range(len(by_speed))]


def ring_by_host(hosts: dict[int, str], speeds: dict[int, float] | None = None) -> list[int]:
    """A gossip ring order (learner ids) in which the learners of one host (`hosts`: learner id ->
    host) sit next to each other, hosts in the order of their lowest learner id: a ring crosses
    between hosts only once per host, so most pairs of partners are on one host. With `speeds`,
    the faster learners of each host take its active (even) positions.

    Example:
        >>> ring_by_host({0: "a", 1: "b", 2: "a", 3: "b"})
        [0, 2, 1, 3]
        >>> ring_by_host({0: "a", 1: "a", 2: "b", 3: "b"}, {0: 10.0, 1: 30.0, 2: 20.0, 3: 5.0})
        [1, 0, 2, 3]
    """
    by_host: dict[str, list[int]] = {}
    for learner_id in sorted(hosts):
        by_host.setdefault(hosts[learner_id], []).append(learner_id)
    order: list[int] = []
    for members in by_host.values():
        if speeds is not None:
            members = sorted(members, key=lambda i: -speeds[i])
            slots = list(range(len(order), len(order) + len(members)))
            even = [k for k in slots if k % 2 == 0]  # active positions take the fastest first
            placed = dict(zip(even + [k for k in slots if k % 2 == 1], members, strict=True))
            members = [placed[k] for k in slots]
        order.extend(members)
    return order
