"""A stranger against a job's learners across hosts (network namespaces on a bridge, Ray's token
authentication on): it holds no token and no job secret, runs once on a member's host and once
on a host of its own on the same bridge, and probes every TCP port the learner processes listen
on (`orchestrator/testing/stranger.py`: TCPStore's protocol on the job's keys and made-up ones,
256 MiB of garbage, 500 connections of a few bytes each). For a 2-learner gossip job, a
2-learner allreduce job and a 2x2 hierarchical one:

- no listener on a wildcard address but Ray's own gRPC server (Ray 2.60 binds it to every
  interface and has no setting to change that; Ray's token guards it);
- no key read or written (no learner hosts a rendezvous; Ray refuses the stranger's call);
- Chorus's channels (gossip's and hierarchical's links) keep none of its connections (the
  learner's connections on them are back to their level within 10 s) and take none of its bytes;
- each learner's memory grows by at most 32 MB; the job finishes its budget, its final loss and
  test WER within the unprobed run's noise; the attack shows as `refused` events; nothing is left.

What gloo's own listeners (a process group's) still accept from a stranger on a member's host is
measured and printed (docs/security.md states it): the filter admits the member's address, which
the stranger shares, and gloo keeps such connections until the group re-forms. Needs root."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.testing.hosts import Hosts, unavailable
from orchestrator.testing.netns import remnants
from orchestrator.testing.probed_job import ProbedJob
from tests.builders import make_spec

WHY = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("strangers"),
              pytest.mark.skipif(WHY is not None, reason=f"no hosts on this machine: {WHY}")]

EPOCHS = 40  # the budget: the attack (two strangers at once, ~8 s from their start) lands well inside it
# (trained alone here: gossip 25 s, allreduce 22 s, hierarchical 13 s; the learners listen from ~1 s in)
RSS_GROWTH = 32 * 2**20
# a probed and an unprobed run of one spec: their final train loss differs by less than this, relatively, and
# their test WER by fewer points than this. bench/strangers.py's 5 + 5 runs a kind (2026-11-28): the largest
# such differences were 17.3% (hierarchical; two unprobed runs differed by up to 12.2%) and 6.9 points (gossip;
# unprobed by up to 2.3); allreduce's runs are identical, probed or not
LOSS_NOISE = 0.25
WER_NOISE = 10.0


@pytest.fixture(scope="module")
def hosts():
    """Two hosts of 2 CPUs, each a Ray node, token authentication on, and a third host on the same
    bridge that is no Ray node: the stranger's own."""
    made = Hosts(count=2, cpus=2, token=True, strangers=1)
    try:
        yield made
    finally:
        made.close()
    assert remnants(made.index) == []


def _job(hosts: Hosts, corpus: Path, out: Path, name: str, kind: str, learners: int, cpus: int) -> ProbedJob:
    return ProbedJob(hosts, make_spec(corpus, "train", "test", raw=True, name=name, learners=learners,
                                      cpus_per_learner=cpus, group={"kind": kind, "balance": False},
                                      budget={"epochs": EPOCHS}), out)


@pytest.mark.parametrize("kind, learners, cpus", [("gossip", 2, 2), ("allreduce", 2, 2), ("hierarchical", 4, 1)])
def test_a_stranger_gets_nothing_of_a_job_and_costs_it_nothing(hosts, corpus, tmp_path, kind, learners, cpus):
    unprobed = _job(hosts, corpus, tmp_path / "unprobed", f"u{kind[:3]}", kind, learners, cpus).summary()
    job = _job(hosts, corpus, tmp_path / "probed", f"p{kind[:3]}", kind, learners, cpus)
    probe = job.probe(learners)
    probed = job.summary()

    pids, before, after = list(probe.listening), probe.before, probe.after
    print(f"\n{kind}: Chorus ports {sorted(probe.chorus)}; the attack took {probe.attack_s:.1f} s, Chorus's "
          f"channels settled {probe.settle_s:.1f} s after it")
    for where, attack in probe.attacks.items():
        for target, result in attack["targets"].items():
            print(f"  from {where} -> {target}: banner {result['banner']}, garbage {result['garbage']}, "
                  f"flood {result['flood']}, tcpstore {result['tcpstore'].get('client')}")
        print(f"  from {where} -> Ray without the token: {attack['ray']}")
    print(f"  connections a library's listener kept (per learner, per port): {probe.kept_by_library()}; "
          f"descriptors {[before[p][2] for p in pids]} -> {[after[p][2] for p in pids]}")
    print(f"  RSS growth MB: {[round((after[p][0] - before[p][0]) / 2**20, 1) for p in pids]}; refused: "
          f"{probed['refused']}; loss {unprobed['final_train_loss']} -> {probed['final_train_loss']}, "
          f"test WER {unprobed['wer_test']} -> {probed['wer_test']}; train wall {unprobed['train_wall_s']} s -> "
          f"{probed['train_wall_s']} s")

    # no listener on a wildcard address but Ray's own gRPC server, which is on every learner's
    assert all(probe.ray_ports.get(pid) in {lis.port for lis in probe.listening[pid]} for pid in pids), probe.ray_ports
    assert all(not lis.wildcard or lis.port == probe.ray_ports[lis.pid]
               for found in probe.listening.values() for lis in found)
    for where, attack in probe.attacks.items():
        assert not attack["ray"]["answered"], (where, attack["ray"])  # no token: Ray refuses it
        for target, result in attack["targets"].items():
            store = result["tcpstore"]
            assert store["client"] != "ok" and "ok" not in store.values(), (where, target, store)  # no key touched
            port = int(target.rsplit(":", 1)[1])
            if target in probe.chorus:  # Chorus's channels take nothing and keep nothing
                assert result["garbage"]["sent"] < 16 * 2**20 and result["garbage"]["ended"] != "sent it all", result
            elif port not in probe.ray_ports.values():  # a library's listener: it may keep the stranger, never talk
                assert result["banner"].get("first_bytes", "") == "" and result["garbage"]["received"] == 0, result
    assert probe.chorus or kind == "allreduce", "no Chorus channel was found to probe"
    assert probe.settled, (before, after)
    assert all(after[p][0] - before[p][0] <= RSS_GROWTH for p in pids), (before, after)
    # the job finished its budget, no worse than without the stranger, and saw it
    assert probed["epochs"] == unprobed["epochs"] == EPOCHS and probed["learners"] == learners
    assert abs(probed["final_train_loss"] - unprobed["final_train_loss"]) <= \
        LOSS_NOISE * unprobed["final_train_loss"], (unprobed["final_train_loss"], probed["final_train_loss"])
    assert abs(probed["wer_test"] - unprobed["wer_test"]) <= WER_NOISE, (unprobed["wer_test"], probed["wer_test"])
    assert sum(probed["refused"].values()) > 0 and probed["events"].get("refused", 0) > 0, probed["refused"]
    assert hosts.leftovers(probed["job_id"]) == {}
