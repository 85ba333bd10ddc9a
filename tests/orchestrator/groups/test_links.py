"""Gossip's links (orchestrator/groups/links.py), without Ray: a learner whose own rendezvous store
cannot start (its server did not answer itself in time, as on a saturated machine) loses that
exchange and tries again after the back-off; it is not the learner's end."""

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from orchestrator.groups import links

pytestmark = pytest.mark.unit


class _Partner:
    """What ActiveLinks reads of a partner's actor handle before it opens a link: its id."""

    def __init__(self, name: str = "partner-0"):
        self._actor_id = SimpleNamespace(hex=lambda: name)


def test_a_store_that_cannot_start_costs_the_exchange_not_the_learner(monkeypatch):
    tries = []

    def store_that_times_out(*args, **kwargs):
        tries.append(kwargs)
        raise dist.DistNetworkError("The client socket has timed out after 5000ms while trying to connect")

    monkeypatch.setattr(links.dist, "TCPStore", store_that_times_out)
    monkeypatch.setattr(links.ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    active = links.ActiveLinks()
    assert active.start(learner=None, partner=_Partner()) is None  # the exchange is lost, nothing raised
    assert active.start(learner=None, partner=_Partner("partner-1")) is None and len(tries) == 1  # backing
    # off, for every partner: the store is this learner's own
    monkeypatch.setattr(links, "time", SimpleNamespace(monotonic=lambda: float("inf")))  # the back-off is over
    assert active.start(learner=None, partner=_Partner()) is None and len(tries) == 2  # tried again
