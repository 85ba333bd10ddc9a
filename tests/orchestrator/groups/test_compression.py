"""Fewer bytes on the wire (orchestrator/groups/compression.py), without a network: the codecs'
payloads and errors, error feedback that loses nothing, a gossip link's compressed exchange that
keeps the models' sum and reaches the mean, and the host-aware orders of the groups."""

from __future__ import annotations

import threading

import pytest
import torch

from orchestrator.groups.balance import ring_by_host
from orchestrator.groups.compression import INT8_BLOCK, Residual, codec_for
from orchestrator.groups.host_reduce import hosts_of, ring_bytes
from orchestrator.groups.links import LinkState
from orchestrator.learner.replica import ReplicaWeights

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name, per_value", [("none", 4), ("bf16", 2), ("int8", 1)])
def test_each_codec_sends_its_bytes_and_stays_within_its_rounding(name, per_value):
    codec = codec_for(name)
    values = torch.randn(3 * INT8_BLOCK + 17, generator=torch.Generator().manual_seed(0)) * 0.1
    payload = codec.encode(values)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.payload_bytes(values.numel())
    assert per_value * values.numel() <= payload.numel() <= per_value * values.numel() * 1.005
    error = (codec.decode(payload, values.numel()) - values).abs()
    if name == "none":
        assert float(error.max()) == 0.0
    elif name == "bf16":
        assert bool((error <= values.abs() * 2.0 ** -8).all())
    else:  # half a step of each block's scale (its largest magnitude / 127)
        blocks = torch.nn.functional.pad(values.abs(), (0, -values.numel() % INT8_BLOCK)).view(-1, INT8_BLOCK)
        steps = blocks.amax(dim=1).repeat_interleave(INT8_BLOCK)[:values.numel()] / 127
        assert bool((error <= steps / 2 + 1e-7).all())


@pytest.mark.parametrize("name", ["none", "bf16", "int8"])
def test_decoding_into_a_tensor_adds_the_same_values_as_decoding(name):
    """`decode_add` (in place, the workspace reused between calls) adds what `decode` returns,
    and a second payload of another length does not see the first's values."""
    codec, gen = codec_for(name), torch.Generator().manual_seed(4)
    for n in (2 * INT8_BLOCK + 5, INT8_BLOCK - 3):
        values, base = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
        payload = codec.encode(values)
        out = base.clone()
        codec.decode_add(payload, n, out, alpha=-0.5)
        assert torch.allclose(out, base - 0.5 * codec.decode(payload, n), atol=1e-6)


def test_an_unknown_compression_is_named():
    with pytest.raises(ValueError, match="unknown compression 'fp8'"):
        codec_for("fp8")


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_error_feedback_delays_what_a_codec_drops_and_loses_none_of_it(name):
    """What 20 steps' payloads carried plus the error still held is exactly what was sent in."""
    codec, gen = codec_for(name), torch.Generator().manual_seed(1)
    residual = Residual(codec, 5000)
    sent = torch.zeros(5000, dtype=torch.float64)
    arrived = torch.zeros(5000, dtype=torch.float64)
    for _ in range(20):
        gradient = torch.randn(5000, generator=gen) * 1e-3
        sent += gradient.double()
        arrived += codec.decode(residual.encode(gradient), 5000).double()
    assert torch.allclose(arrived + residual.error.double(), sent, atol=1e-6)
    assert float(residual.error.abs().max()) < float(sent.abs().max())  # the carried error stays small


class _Replica(ReplicaWeights):
    """A learner's weights and lock, as a link sees them."""

    def __init__(self, values: torch.Tensor):
        self.flat, self.lock, self.version = values.clone(), threading.Lock(), 0
        self.device, self.numel, self.averages = torch.device("cpu"), values.numel(), 0


def _exchange(active: _Replica, passive: _Replica, links: tuple[LinkState, LinkState]) -> None:
    """One exchange of a link, its bytes handed over in memory instead of by gloo."""
    mine_a, mine_p = links
    sent_a, version_a = mine_a.outgoing(active)
    sent_p, version_p = mine_p.outgoing(passive)
    mine_a.inbox.copy_(sent_p)
    mine_p.inbox.copy_(sent_a)
    mine_a.settle(active, version_a, active=True)
    mine_p.settle(passive, version_p, active=False)


def _link(name: str, n: int) -> tuple[LinkState, LinkState]:
    return LinkState(codec_for(name), n), LinkState(codec_for(name), n)


def test_an_uncompressed_exchange_leaves_both_sides_on_the_same_mean():
    gen = torch.Generator().manual_seed(2)
    a, p = _Replica(torch.randn(1000, generator=gen)), _Replica(torch.randn(1000, generator=gen))
    mean = (a.flat + p.flat) / 2
    _exchange(a, p, _link("none", 1000))
    assert torch.equal(a.flat, p.flat) and torch.allclose(a.flat, mean)


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_compressed_exchanges_keep_the_sum_and_reach_the_mean(name):
    """Each side moves by half the difference of the public copies, which both ends hold bit for
    bit: the two moves cancel (the models' sum is kept), and the part a codec drops is sent by the
    next exchange, so repeated exchanges end on the mean itself."""
    gen = torch.Generator().manual_seed(3)
    a, p = _Replica(torch.randn(5000, generator=gen)), _Replica(torch.randn(5000, generator=gen) + 1.0)
    total, mean = a.flat + p.flat, (a.flat + p.flat) / 2
    link = _link(name, 5000)
    _exchange(a, p, link)
    assert torch.equal(link[0].mine, link[1].theirs) and torch.equal(link[0].theirs, link[1].mine)
    assert torch.allclose(a.flat + p.flat, total, atol=1e-5)
    first = float((a.flat - mean).abs().max())
    assert first < 0.02  # one exchange: the mean up to the codec's rounding of the weights
    for _ in range(4):
        _exchange(a, p, link)
    assert torch.allclose(a.flat + p.flat, total, atol=1e-5)
    assert float((a.flat - mean).abs().max()) < 1e-3 * first + 1e-6
    assert float((p.flat - mean).abs().max()) < 1e-3 * first + 1e-6


def test_a_compressed_exchange_keeps_a_step_taken_while_it_travelled():
    """The passive's own update, landed between its snapshot and the settle, stays on top."""
    a, p = _Replica(torch.zeros(100)), _Replica(torch.ones(100))
    link = _link("int8", 100)
    sent_a, version_a = link[0].outgoing(a)
    sent_p, version_p = link[1].outgoing(p)
    p.flat.add_(0.25)  # its optimizer step, meanwhile
    link[0].inbox.copy_(sent_p)
    link[1].inbox.copy_(sent_a)
    link[0].settle(a, version_a, active=True)
    link[1].settle(p, version_p, active=False)
    assert torch.allclose(a.flat, torch.full((100,), 0.5)) and torch.allclose(p.flat, torch.full((100,), 0.75))


def test_the_ring_keeps_each_hosts_learners_together_and_ranks_group_by_host():
    assert ring_by_host({0: "a", 1: "b", 2: "a", 3: "b", 4: "a"}) == [0, 2, 4, 1, 3]
    order = ring_by_host({i: "ab"[i % 2] for i in range(8)})
    crossings = sum(order[k] % 2 != order[(k + 1) % 8] % 2 for k in range(8))
    assert crossings == 2  # a topology-blind ring (by id) crosses between hosts at every position
    assert hosts_of(["x", "y", "x", "z"]) == [[0, 2], [1], [3]]
    assert ring_bytes(100, 4) == 150 and ring_bytes(100, 1) == 0
