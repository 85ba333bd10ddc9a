"""A workload's trained model over many inputs on a Ray cluster: an ordered pool of Ray actors, each
of which builds its worker once (`make(state)`: e.g. a transcriber from the checkpoint's state,
read once from the object store), on a GPU each where asked. Inputs go out in calls of
`BATCH_RECORDS`, each to whichever actor has the fewest queued; results come back in the inputs'
order. An actor that dies is restarted by Ray and the calls it held are run again; a call's
results are handed on only once it is whole, so none comes back twice.

Why not Ray Data's `map_batches` over an actor pool: on this machine its first result came after
7.43 s against this pool's 3.17 (2 actors, 4.24 h set), its whole-command rate was a tie with 2
actors and lower with 1, and it left four detached helper actors on the cluster at ~2% of a core
each (bench/README, "Transcription"); and the GPU kit's Ray has no `ray.data`.

Example:
    >>> with OrderedPool(make, state, actors=2) as pool:  # doctest: +SKIP
    ...     for result in pool.map(records):
    ...         print(result["text"])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

BATCH_RECORDS = 256  # inputs per actor call: each call's outputs come back whole, so a smaller batch streams sooner
QUEUED = 2  # calls at an actor at once: the next is there when one ends
AHEAD = 4  # calls an actor may be sent past the oldest result not yet handed on (bounds what waits here)
RESTARTS = 4  # times an actor is restarted, and a call retried, before the run fails


class _Worker:
    """One actor of the pool: the worker `make` builds from the checkpoint's state (fetched once, at
    start), run on each call's records."""

    def __init__(self, make: Callable, boxed_state: list, threads: int):
        import ray
        import torch

        torch.set_num_threads(threads)  # its CPUs, not the node's: the pool's actors share the node
        self.work = make(ray.get(boxed_state[0]))

    def __call__(self, records: list[dict]) -> list[dict]:
        return self.work(records)


class OrderedPool:
    """`actors` Ray actors on the cluster this process is connected to, each reserving
    `cpus_per_actor` CPUs and `gpus_per_actor` GPUs and building `make(state)` once; they start
    at once, so that they load while the caller reads its inputs. Closing kills them."""

    def __init__(self, make: Callable, state: dict, actors: int, gpus_per_actor: float = 0.0,
                 cpus_per_actor: float = 1.0):
        import ray

        self._boxed = [ray.put(state)]  # in a list, so the actors get the reference and fetch it once each
        worker = ray.remote(_Worker).options(num_cpus=cpus_per_actor, num_gpus=gpus_per_actor,
                                             max_restarts=RESTARTS, max_task_retries=RESTARTS)
        self.actors = [worker.remote(make, self._boxed, max(1, math.floor(cpus_per_actor))) for _ in range(actors)]

    def map(self, records: list[dict], batch_records: int = BATCH_RECORDS) -> Iterator[dict]:
        """The workers' results for `records`, one per record, in their order."""
        import ray

        calls = [records[i:i + batch_records] for i in range(0, len(records), batch_records)]
        queued: dict = {}  # a call's result reference -> (its index, its actor's)
        load, done, sent, wanted = [0] * len(self.actors), {}, 0, 0
        while wanted < len(calls):
            while sent < len(calls) and sent - wanted < AHEAD * len(self.actors) and min(load) < QUEUED:
                actor = load.index(min(load))
                queued[self.actors[actor].__call__.remote(calls[sent])] = (sent, actor)
                load[actor] += 1
                sent += 1
            ready, _ = ray.wait(list(queued), num_returns=1)
            index, actor = queued.pop(ready[0])
            load[actor] -= 1
            done[index] = ray.get(ready[0])
            if len(done[index]) != len(calls[index]):
                raise RuntimeError(f"a worker gave {len(done[index])} results for {len(calls[index])} inputs")
            while wanted in done:
                yield from done.pop(wanted)
                wanted += 1

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def map_in_order(records: list[dict], make: Callable, state: dict, actors: int, gpus_per_actor: float = 0.0,
                 cpus_per_actor: float = 1.0, batch_records: int = BATCH_RECORDS) -> Iterator[dict]:
    """`make(state)`'s results for `records`, one per record in their order, from an `OrderedPool`
    of `actors` actors, closed when the results are all out (or the caller stops reading them)."""
    with OrderedPool(make, state, actors, gpus_per_actor, cpus_per_actor) as pool:
        yield from pool.map(records, batch_records)
