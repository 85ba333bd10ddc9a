"""A trained model over many inputs on Ray actors (orchestrator/service/batch_inference.py): every
input's result comes back once, in the inputs' order, though an actor of the pool is killed while
the work is under way; the pool's actors are gone afterwards, and nothing else is left."""

import os
import signal

import pytest

from jobs.transcription import ClipTranscriber
from orchestrator.service.batch_inference import map_in_order
from orchestrator.testing.cluster import wait_until
from tests.builders import checkpoint_state

pytestmark = pytest.mark.ray


def _pool(ray) -> list[dict]:
    """The pool's actors as Ray's actor table has them (state, process id, restarts)."""
    return [a for a in ray._private.state.actors().values() if "_Worker" in a["ActorClassName"]]


def test_a_killed_actors_batches_are_redone_and_every_input_comes_back_once_in_order(ray_session, corpus):
    ray = ray_session
    before = {a["ActorID"] for a in ray._private.state.actors().values() if a["State"] == "ALIVE"}
    state = checkpoint_state(corpus)
    records = ClipTranscriber.read_inputs([corpus / "train.jsonl"], state)[0]
    assert len(records) == 160

    def make(state):  # a transcriber that takes 0.3 s a batch: 20 batches outlast the kill
        import time

        transcribe = ClipTranscriber.from_checkpoint(state, device="cpu")
        return lambda batch: time.sleep(0.3) or transcribe(batch)

    results = map_in_order(records, make, state, actors=2, batch_records=8)
    got = [next(results)]
    alive = wait_until("the pool's two actors", lambda: len(p := [a for a in _pool(ray) if a["State"] == "ALIVE"])
                       == 2 and p, timeout=60)
    os.kill(alive[0]["Pid"], signal.SIGKILL)  # the actor's process dies mid-run, as on a lost node
    got += list(results)
    assert {a["ActorID"]: a["NumRestarts"] for a in _pool(ray)}[alive[0]["ActorID"]] == 1  # Ray restarted it
    assert [r["id"] for r in got] == [r["id"] for r in records]  # each once, in the inputs' order
    assert all(isinstance(r["text"], str) and "skipped" not in r for r in got)
    assert sum(r["text"] != "" for r in got) > 100
    wait_until("the pool's actors gone", lambda: all(a["State"] == "DEAD" for a in _pool(ray)), timeout=30)
    assert {a["ActorID"] for a in ray._private.state.actors().values() if a["State"] == "ALIVE"} <= before


def test_a_workers_error_or_a_short_answer_ends_the_run_and_the_pool_is_gone(ray_session):
    ray = ray_session

    def failing(state):
        return lambda batch: [r if r["x"] != 5 else {}["input 5 is bad"] for r in batch]  # a KeyError at input 5

    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        list(map_in_order([{"x": i} for i in range(10)], failing, {}, actors=2, batch_records=2))
    assert isinstance(caught.value.cause, KeyError) and "input 5 is bad" in str(caught.value.cause)
    with pytest.raises(RuntimeError, match="a worker gave 1 results for 2 inputs"):
        list(map_in_order([{"x": i} for i in range(4)], lambda state: lambda batch: batch[:1], {}, actors=1,
                          batch_records=2))
    wait_until("the pools' actors gone", lambda: all(a["State"] == "DEAD" for a in _pool(ray)), timeout=30)
