"""Large values sent between Ray processes in pieces (orchestrator/base/pieces.py): whole, in
order, every piece within its size, and a sender's death an error, not a hang."""

import math

import pytest
import torch

from orchestrator.base import pieces

pytestmark = pytest.mark.ray


def _actors(ray):
    @ray.remote(num_cpus=0)
    class Sender:
        def send(self, value):
            return pieces.put(value)

    @ray.remote(num_cpus=0)
    class Receiver:
        def receive(self, sent):
            return pieces.take(sent)

    return Sender, Receiver


def _on(actor_class, node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return actor_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def test_a_state_crosses_nodes_in_pieces_whole_and_in_order(ray_session, ray_cluster):
    ray = ray_session
    Sender, Receiver = _actors(ray)
    sender, receiver = _on(Sender, ray_cluster.session_worker.node_id), _on(Receiver, ray_cluster.head_node.node_id)
    state = {"weights": torch.randn(700_000), "counters": {"step": 12}, "name": "learner-1"}  # 2.8 MB
    sent = ray.get(sender.send.remote(state))
    assert len(sent.refs) == math.ceil(sent.size / pieces.PIECE_BYTES) >= 5
    assert all(len(ray.get(ref)) <= pieces.PIECE_BYTES for ref in sent.refs)
    got = ray.get(receiver.receive.remote(sent))
    assert torch.equal(got["weights"], state["weights"]) and got["counters"] == {"step": 12}
    assert got["name"] == "learner-1"
    for actor in (sender, receiver):
        ray.kill(actor)


def test_pieces_of_a_sender_that_died_fail_a_receiver_on_another_node(ray_session, ray_cluster):
    """(On the sender's node, its pieces may still be read from the object store until Ray frees
    them: a learner there gets the value or an error, as Ray decides; it never waits.)"""
    ray = ray_session
    Sender, Receiver = _actors(ray)
    sender, receiver = _on(Sender, ray_cluster.session_worker.node_id), _on(Receiver, ray_cluster.head_node.node_id)
    sent = ray.get(sender.send.remote(torch.randn(300_000)))
    ray.kill(sender)  # the owner of the pieces: they are gone with it
    with pytest.raises(ray.exceptions.RayActorError):  # (the kill is asynchronous: until it is dead)
        ray.get(sender.send.remote(0), timeout=60)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(receiver.receive.remote(sent), timeout=60)
    ray.kill(receiver)
