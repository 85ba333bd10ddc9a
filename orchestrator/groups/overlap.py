"""An allreduce step's gradient traffic overlapped with its backward pass, as DDP does: the flat
gradient buffer is cut into buckets of consecutive parameters (last parameters first, the order
backward produces their gradients), and a bucket's asynchronous all-reduce starts from a gradient
hook as soon as its last gradient is accumulated, while backward goes on with earlier layers.

Opt-in (`AllreduceMember(bucket_bytes=...)`; bench/transport.py measures it), not the default:
after a kill, survivors can stay in their buckets' collectives until the collective timeout
(bench/scale.py: hierarchical-32's node groups re-formed after 121 s in all 5 events at 453f17c
and at 7cb3943, where every bucket was settled before the group was shut down; allreduce-32
after 207 s in 1 of 5 events at 7cb3943's buckets without that change). The cause is not found
yet: with one collective after backward, the same kills re-form in 1.3-3.4 s.

Buckets start in one fixed order on every member (a bucket waits for the ones before it), so the
collectives match across members whatever order the hooks fire in. A bucket whose parameters got
no gradient this step (unused, or a member without a batch) starts after backward. Each gradient
is scaled by the member's batch size before its bucket starts (the size-weighted sum of
`allreduce.py`). Like DDP, a parameter must get its gradient once per backward pass (no weight
sharing across two uses).
"""

from __future__ import annotations

import torch.distributed as dist

# gradient bytes per bucket, by backend (what bench/transport.py uses). nccl: DDP's default
# bucket_cap_mb (not measured here, no GPU). gloo: measured with bench/transport.py's 5-layer
# model, 2 learners on this machine's 2 cores: exposed / raw all-reduce 0.58 (10M parameters)
# and 0.38 (30M) with 4 MB buckets, 0.52 and 0.34 with 1 MB, 0.95 and 0.60 with 25 MB.
BUCKET_BYTES = {"gloo": 4 * 2**20, "nccl": 25 * 2**20}


class GradientBuckets:
    """The allreduce's gradient buckets, started while backward runs.

    Args:
    params: the learner's trainable parameters, whose gradients are views of `grads` in order.
    grads: the learner's flat gradient buffer (its tail slots are not bucketed).
    bucket_bytes: the most bytes of gradients per bucket (a larger parameter gets its own).
    collective: runs a torch.distributed call, raising GroupBroken when a member is gone
        (`allreduce.collective`); a bucket that fails inside backward ends that backward pass.
    """

    def __init__(self, params: list, grads, bucket_bytes: int, collective):
        self.grads, self.buckets = grads, []  # (start, end) slices of `grads`, in launch order
        self._collective = collective
        offsets, offset = [], 0
        for p in params:
            offsets.append(offset)
            offset += p.numel()
        self.bucket_of: dict[int, int] = {}  # parameter index -> its bucket
        end, size = offset, 0
        for i in reversed(range(len(params))):
            nbytes = params[i].numel() * params[i].element_size()
            if size and size + nbytes > bucket_bytes:
                self.buckets.append((offsets[i + 1], end))
                end, size = offsets[i + 1], 0
            self.bucket_of[i] = len(self.buckets)
            size += nbytes
        if params:
            self.buckets.append((0, end))
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]
        self._waiting: list[set[int]] = []
        self._scale, self._next, self.works = 1.0, len(self.buckets), []

    def begin(self, scale: float) -> None:
        """A backward pass follows whose gradients are to be all-reduced times `scale`."""
        self._waiting = [set() for _ in self.buckets]
        for i, b in self.bucket_of.items():
            self._waiting[b].add(i)
        self._scale, self._next, self.works = float(scale), 0, []

    def finish(self, tail) -> None:
        """After backward: start the buckets still waiting, then `tail`'s all-reduce, and wait for all."""
        for waiting in self._waiting[self._next:]:
            waiting.clear()
        self._start_ready()
        self.works.append(self._collective(dist.all_reduce, tail, async_op=True))
        works, self.works = self.works, []
        for work in works:
            self._collective(work.wait)

    def abandon(self) -> None:
        """The step failed (a member is gone): start nothing more until the next `begin`."""
        self._next, self.works = len(self.buckets), []

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def _hook(self, index: int):
        def ready(param) -> None:
            if self._next < len(self.buckets):  # inside begin() .. finish() only
                self._waiting[self.bucket_of[index]].discard(index)
                self._start_ready()
        return ready

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and not self._waiting[self._next]:
            start, end = self.buckets[self._next]
            bucket = self.grads[start:end]
            if self._scale != 1.0:
                bucket.mul_(self._scale)
            self.works.append(self._collective(dist.all_reduce, bucket, async_op=True))
            self._next += 1
