"""A workload's trained model over many inputs on a Ray cluster: Ray Data's `map_batches` over a pool
of actors, each of which builds its worker once (`make(state)`: e.g. a transcriber from the
checkpoint's state, read from the object store), on a GPU each where asked; results come back in
the inputs' order. An actor that dies is restarted by Ray Data and the batches it held are done
again; a batch's results are handed on only once it is whole, so none comes back twice.

Records travel as JSON text, so that inputs whose fields differ (a reference or not) make one
Arrow column.

Example:
    >>> for result in map_in_order(records, make, state, actors=2, gpus_per_actor=0):  # doctest: +SKIP
    ...     print(result["text"])
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator

BATCH_RECORDS = 256  # inputs per actor call: each call's outputs come back whole, so a smaller batch streams sooner


class _Worker:
    """One actor of the pool: the worker `make` builds from the checkpoint's state (fetched once, at
    start), run on each batch of JSON records, and the JSON of its results."""

    def __init__(self, make: Callable, boxed_state: list, threads: int):
        import ray
        import torch

        torch.set_num_threads(threads)  # its CPUs, not the node's: the pool's actors share the node
        self.work = make(ray.get(boxed_state[0]))

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        results = self.work([json.loads(text) for text in batch["record"]])
        return {"result": np.array([json.dumps(r, allow_nan=False) for r in results], dtype=object)}


def map_in_order(records: list[dict], make: Callable, state: dict, actors: int, gpus_per_actor: float = 0.0,
                 cpus_per_actor: float = 1.0, batch_records: int = BATCH_RECORDS) -> Iterator[dict]:
    """`make(state)`'s results for `records` (JSON-able dicts), one per record in their order, from a
    pool of `actors` Ray actors (each reserving `cpus_per_actor` CPUs and `gpus_per_actor` GPUs) on
    the cluster this process is connected to."""
    import ray
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # the caller shows its own
    if not records:
        return
    boxed = [ray.put(state)]  # in a list, so the actors get the reference and fetch it once each
    blocks = max(1, math.ceil(len(records) / batch_records))
    dataset = ray.data.from_items([{"record": json.dumps(r, allow_nan=False)} for r in records],
                                  override_num_blocks=blocks)
    results = dataset.map_batches(
        _Worker, fn_constructor_args=(make, boxed, max(1, math.floor(cpus_per_actor))), batch_size=batch_records,
        batch_format="numpy", concurrency=actors, num_cpus=cpus_per_actor, num_gpus=gpus_per_actor or None)
    for batch in results.iter_batches(batch_size=None, batch_format="numpy"):  # each block as it comes, whole
        for text in batch["result"]:
            yield json.loads(text)
