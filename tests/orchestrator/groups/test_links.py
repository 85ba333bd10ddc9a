"""Gossip's links (orchestrator/groups/links.py) without Ray: an active and a passive side in this
process over a real channel on loopback (the partner's actor handle a stand-in whose `open_link`
calls the passive side directly). One exchange leaves both on the mean; a partner that sends
weights that are not finite is refused, its link dropped and the refusal counted, and the
receiver's weights stay; a partner that cannot be reached costs that exchange and is tried again
after the back-off."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from orchestrator.base.secret import JobSecret
from orchestrator.groups import links
from orchestrator.groups.channel import Refusals
from orchestrator.groups.links import REFUSED_WEIGHTS, ActiveLinks
from orchestrator.groups.passive_links import PassiveLinks

pytestmark = pytest.mark.unit


class Replica:
    """What a link reads and writes of a learner (`groups.replica.Replica`), over a flat tensor."""

    def __init__(self, values: list[float], secret, name: str):
        self.flat, self.numel = torch.tensor(values), len(values)
        self.node_address, self.secret, self.refusals = "127.0.0.1", secret, Refusals(name)
        self.version = self.averages = self.sent = 0

    def copy_weights_to(self, out: torch.Tensor) -> int:
        out.copy_(self.flat)
        return self.version

    def settle_mean(self, active, passive, mine, version) -> None:
        self.flat = torch.lerp(active, passive, 0.5)

    def add_to_weights(self, delta) -> None:
        self.flat = self.flat + delta

    def count_sent(self, nbytes: int) -> None:
        self.sent += nbytes

    def count_averages(self, n: int) -> None:
        self.averages += n


class Partner:
    """A passive learner's actor handle as an active side uses it: its id and its kind's
    `open_link` call (through `member_call`, on a concurrency group)."""

    def __init__(self, passive: PassiveLinks, name: str = "partner-0", listen: str | None = None):
        self._actor_id = SimpleNamespace(hex=lambda: name)

        def member_call(kind, call, *args):
            assert (kind, call) == ("gossip", "open_link")
            codec, own, address = passive.open(*args)
            return codec, own, listen or address
        self.member_call = SimpleNamespace(remote=member_call)
        self.member_call.options = lambda concurrency_group: self.member_call


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    monkeypatch.setattr(links.ray, "get", lambda value, timeout=None: value)


def _pair(active_values, passive_values):
    secret = JobSecret()
    active, passive = Replica(active_values, secret, "active"), Replica(passive_values, secret, "passive")
    served = PassiveLinks(passive)
    return active, passive, served, ActiveLinks(kind="gossip")


def _until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_one_exchange_leaves_both_on_the_mean():
    active, passive, served, links_ = _pair([1.0, 3.0], [3.0, 5.0])
    try:
        pending = links_.start(active, Partner(served))
        assert pending is not None and pending.arrived.wait(5)
        assert links_.settle_all(active) == (1, 0)
        assert served.wait_answered(5) and _until(lambda: passive.averages == 1)
        assert active.flat.tolist() == passive.flat.tolist() == [2.0, 4.0]
        assert any(t.name.startswith("link-served-") for t in threading.enumerate())
        assert active.refusals.take() == passive.refusals.take() == {}
    finally:
        links_.close(active)
        served.close()


def test_a_partner_that_sends_weights_that_are_not_finite_is_refused_and_its_link_dropped():
    active, passive, served, links_ = _pair([1.0, 3.0], [3.0, 5.0])
    passive.copy_weights_to = lambda out: (out.fill_(float("nan")), passive.version)[1]  # a faulty partner
    try:
        pending = links_.start(active, Partner(served))
        assert pending is not None and pending.arrived.wait(5)
        assert links_.settle_all(active) == (0, 1)  # a lost exchange, not an error
        assert active.flat.tolist() == [1.0, 3.0]  # untouched
        assert active.refusals.take() == {REFUSED_WEIGHTS: 1}
        assert links_._links == {} and links_._retry_at["partner-0"] > time.monotonic()  # dropped, backing off
        assert links_.start(active, Partner(served)) is None  # not asked again during the back-off
    finally:
        links_.close(active)
        served.close()


def test_a_partner_that_cannot_be_reached_costs_the_exchange_and_is_tried_again_later(monkeypatch):
    active, passive, served, links_ = _pair([1.0], [3.0])
    nowhere = "127.0.0.1:1"  # nothing listens there
    try:
        assert links_.start(active, Partner(served, listen=nowhere)) is None
        monkeypatch.setattr(links, "time", SimpleNamespace(monotonic=lambda: float("inf"),
                                                           perf_counter=time.perf_counter))  # the back-off is over
        pending = links_.start(active, Partner(served))
        assert pending is not None and pending.arrived.wait(5) and links_.settle_all(active) == (1, 0)
    finally:
        links_.close(active)
        served.close()
