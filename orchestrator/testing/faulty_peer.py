"""A member gone bad, for tests and benchmarks: faults installed into a learner's process from
outside (Ray's `__ray_call__` runs a function there), never switches in Chorus's own code.

Example:
    >>> ray.get(handle.__ray_call__.remote(send_nan_weights))   # doctest: +SKIP
"""

from __future__ import annotations

HEADER_BYTES = 8  # what a gossip link's active sends before its payload (`groups/links.py`)


def send_nan_weights(service) -> None:
    """Run inside a learner: from now on every payload it sends on a gossip link is NaN of the same
    size (a faulty or hostile member); its own weights stay as they are. `service` is the learner
    actor's instance (what `__ray_call__` passes); it is not used."""
    import torch

    from orchestrator.groups import channel

    send = channel.Channel.send

    def faulty(self, data) -> None:
        size = len(memoryview(data).cast("B"))
        if size > HEADER_BYTES:  # a payload, not a header
            data = torch.full((size // 4,), float("nan")).numpy().tobytes()
        send(self, data)
    channel.Channel.send = faulty
