"""Chorus across hosts with addresses of their own (`orchestrator/testing/hosts.py`: network
namespaces on a bridge, each a Ray node; the head in this machine's namespace): every kind of
group trains across two hosts whose host names resolve to a loopback address, with no
GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME set; a group that cannot form stops the job in one line;
a job across shaped links sends its cross-host traffic through them; and nothing of the hosts
remains afterwards. Needs root (as CI runs): skipped, saying why, without it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.groups.network import CHOSEN_BY
from orchestrator.testing.hosts import Hosts, unavailable
from orchestrator.testing.netns import remnants
from tests.builders import make_spec, run_cli

ROOT = Path(__file__).resolve().parents[3]
WHY = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hosts"),  # one worker: they share the module's hosts
              pytest.mark.skipif(WHY is not None, reason=f"no hosts on this machine: {WHY}")]


@pytest.fixture(scope="module")
def hosts():
    """Two hosts of 2 CPUs, unshaped, whose host names resolve to 127.0.1.1 inside them."""
    made = Hosts(count=2, cpus=2)
    try:
        yield made
    finally:
        made.close()
    assert remnants(made.index) == []


def train(hosts: Hosts, corpus: Path, out: Path, timeout: float = 240, **fields) -> tuple[object, dict | None]:
    """`chorus train` of a small spec on the hosts' cluster from this machine's namespace (the
    head's), with neither variable that would choose the collectives' interface by hand."""
    spec = out.parent / f"{out.name}.json"
    spec.write_text(json.dumps(make_spec(corpus, raw=True, **fields)))
    env = {k: v for k, v in hosts.env.items() if k not in CHOSEN_BY}
    proc = run_cli("train", str(spec), "--out", str(out), "--address", hosts.gcs_address, env=env, cwd=ROOT,
                   timeout=timeout)
    summary = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    return proc, summary


@pytest.mark.parametrize("kind, topology_aware", [("allreduce", True), ("allreduce", False), ("gossip", True),
                                                  ("hierarchical", True)])
def test_every_group_trains_across_hosts_whose_names_resolve_to_loopback(hosts, corpus, tmp_path, kind,
                                                                          topology_aware):
    name = socket.gethostname()
    for host in hosts.hosts:  # as on Debian's default /etc/hosts: gloo's own choice would be unreachable
        inside = subprocess.run(hosts.command(host.index, ["getent", "hosts", name]), capture_output=True,
                                text=True).stdout.split()
        assert inside[:1] == ["127.0.1.1"], inside
    proc, summary = train(hosts, corpus, tmp_path / kind, name=f"h{kind[:3]}", learners=4, cpus_per_learner=1,
                          group={"kind": kind, "topology_aware": topology_aware}, budget__epochs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["learners"] == 4 and summary["samples"] == 2 * 160  # both epochs, every utterance once
    hosted = {node["address"]: len(node["learners"]) for node in summary["nodes"]}
    assert hosted == {host.address: 2 for host in hosts.hosts}  # two learners on each host
    # who sent across the network: every learner, or (summing host by host) one leader per host
    senders = 2 if kind == "hierarchical" or (kind == "allreduce" and topology_aware) else 4
    assert sum(sent > 0 for sent in summary["sent_bytes"].values()) == senders, summary["sent_bytes"]
    if kind == "allreduce":
        assert summary["consensus_distance"] == 0.0  # replicas identical, summed host by host or not
    assert "Traceback" not in proc.stderr
    assert hosts.leftovers(summary["job_id"]) == {}


def test_a_group_that_cannot_form_stops_the_job_in_one_line(hosts, corpus, tmp_path):
    """`group.interface: lo` makes every member advertise a loopback address to a peer on another
    host: every join fails the same way, so the job stops, naming it, instead of replacing
    learners that are not at fault until its wait timeout."""
    started = time.monotonic()
    proc, _ = train(hosts, corpus, tmp_path / "lo", name="hlo", learners=2, cpus_per_learner=2,
                    group={"kind": "allreduce", "interface": "lo"}, budget__epochs=2)
    took = time.monotonic() - started
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(errors) == 1 and "allreduce group cannot form" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert took < 60, took  # two failed forms at once, not learners replaced until a timeout
    assert hosts.leftovers("hlo-") == {}


def test_cross_host_traffic_goes_through_the_shaped_links_and_nothing_remains(corpus, tmp_path):
    """Each host's link limited to 100 Mbit/s, a gossip job (a learner a host: every exchange
    crosses) and a hierarchical one (two a host: the leaders' exchanges cross): the learners ran
    on both hosts, the bytes their exchanges sent across passed through each host's rate limiter
    (`tc -s`: its counter), as did everything else the host sent; and once the hosts are closed no
    process, namespace or link of theirs is left."""
    runs = {}
    with Hosts(count=2, cpus=2, rate="100mbit") as shaped:
        for kind, learners, cpus in (("gossip", 2, 2), ("hierarchical", 4, 1)):
            before = [(shaped.shaped(i), shaped.traffic(i)) for i in range(2)]
            proc, summary = train(shaped, corpus, tmp_path / kind, name=f"s{kind[:3]}", learners=learners,
                                  cpus_per_learner=cpus, group={"kind": kind}, budget__epochs=2)
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[kind] = (summary, [shaped.shaped(i)["sent"] - before[i][0]["sent"] for i in range(2)],
                          [shaped.traffic(i)["sent"] - before[i][1]["sent"] for i in range(2)])
        index = shaped.index
    assert remnants(index) == []  # processes, namespaces, links, hosts files: all gone
    for kind, (summary, through, on_link) in runs.items():
        by_address = {node["address"]: node["learners"] for node in summary["nodes"]}
        assert sorted(by_address) == sorted(f"198.18.{index}.{i + 1}" for i in range(2)), kind
        for i in range(2):
            # what the host's learners' exchanges sent to the other host (gossip: a learner a host;
            # hierarchical: the host's leader's) went through its limiter, as did all it sent
            crossing = max(summary["sent_bytes"][str(learner)] for learner in by_address[f"198.18.{index}.{i + 1}"])
            assert 0 < crossing <= through[i], (kind, crossing, through)
            assert through[i] >= 0.95 * on_link[i], (kind, through, on_link)


def test_what_a_killed_owner_left_is_removed_by_the_next_hosts():
    """A process killed while it holds hosts (SIGKILL: no cleanup of its own runs) leaves its
    namespaces, links, Ray processes and the head's folder in /tmp; the next `Hosts` made on the
    machine removes them."""
    child = subprocess.Popen([sys.executable, "-c", "import time; from orchestrator.testing.hosts import Hosts; "
                              "h = Hosts(count=1, cpus=1); print(h.index, flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        index = int(child.stdout.readline())
        left = remnants(index)
        assert all(any(r.startswith(what) for r in left) for what in ("namespace", "process", "head folder")), left
    finally:
        child.kill()
        child.wait()
    assert remnants(index), "nothing was left to remove: the test shows nothing"
    with Hosts(count=1, cpus=1):  # it removes what the dead holder left before it takes an index
        pass
    # the child's Ray processes too: a new holder of the same index would stop only its own
    assert remnants(index) == []
