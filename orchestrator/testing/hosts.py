"""Hosts on one machine, for tests and benchmarks of what crosses a network: N Linux network
namespaces on a bridge, each with an address of its own, a Ray node and a link to the bridge that
can be slowed down (`tc tbf`, both directions), cut and restored while jobs run.

    machine (root namespace)                 host i (namespace chorus<k>h<i>)
    bridge chb<k>  198.18.<k>.254  <-- veth chv<k>h<i> ==== eth0  198.18.<k>.<i+1>
    Ray head (no CPUs: drivers, job services)                 Ray node (`cpus` CPUs)

The head runs in the machine's own namespace on the bridge's address, so a driver in this process
(`ray.init(address=hosts.gcs_address)`) or a `chorus train --address` subprocess reaches every host
through its link, as a head node reaches its workers. Each host's link is its veth pair: what the
host sends leaves through `eth0` (shaped there), what it receives leaves the bridge through
`chv<k>h<i>` (shaped there); two processes on one host talk over the host's loopback, never its
link. The addresses are from 198.18.0.0/15, the range RFC 2544 sets aside for benchmarks: no
traffic leaves the machine.

By default each host's name resolves to a loopback address inside it (`/etc/netns/<ns>/hosts`
maps it to 127.0.1.1, as Debian's default /etc/hosts does), so a process group that trusts the
host name instead of the node's address fails as it would on such hosts.

Everything is removed by `close()` (also at interpreter exit, and on the way out of `with`): Ray's
processes by their PIDs (never `ray stop`), the links, the namespaces, the bridge. A process that
died without closing leaves its index claimed by a dead PID; the next `Hosts` on the machine
removes what it left (the Ray processes whose command lines name its subnet, the head's folder in
/tmp, then its network).
Indices are claimed under a file lock, so several processes (pytest-xdist workers) can each have
hosts at once.

Needs root, `ip` and `tc` (iproute2); `unavailable()` says why not, for a test to skip with.

Example:
    >>> with Hosts(count=2, cpus=2, rate="100mbit") as hosts:   # doctest: +SKIP
    ...     subprocess.run(["chorus", "train", "job.yaml", "--address", hosts.gcs_address])
    ...     hosts.shape(1, "20mbit")        # host 1's link, from now on
    ...     hosts.traffic(1)                # {"sent": ..., "received": ...} bytes through its link
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.local_head import BIN, HeadNode
from orchestrator.testing.netns import (
    HostsUnavailable,
    claim_index,
    head_folder_prefix,
    qdisc_sent,
    rate_bits,
    release_index,
    remove_leftovers,
    run_ip,
    run_tc,
    size_bytes,
)

NODE_START_TIMEOUT_S = 120.0
OBJECT_STORE_BYTES = 512 * 2**20  # per node: models of tens of MB pass through it, not datasets


def unavailable() -> str | None:
    """Why hosts cannot be made here (not root, no iproute2), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (iproute2) not installed"
    return None


@dataclass
class Host:
    """One host: its index, namespace, address, and its link's device on the bridge's side."""

    index: int
    netns: str
    address: str
    device: str  # the veth end on the bridge (in the machine's namespace); `eth0` is its peer inside


class Hosts:
    """Hosts with their own addresses and shaped links on one machine, each a Ray node.

    Args:
    count: how many hosts.
    cpus: CPUs each host's Ray node offers.
    resources: custom resources each host's Ray node offers besides (e.g. `{"learner_slot": 2}`).
    rate, burst: every link's rate and bucket (`shape`); None: unshaped.
    loopback_hostnames: each host's name resolves to 127.0.1.1 inside it (Debian's default).
    head_cpus: CPUs of the head (0: it holds drivers and zero-CPU actors only, never a learner).
    system_config: Ray's `--system-config` for the cluster (the head's; workers take it from it).
    token: Ray's token authentication on (a fresh token, in `env`): a process without it is refused.
    strangers: hosts on the same bridge that are no Ray node (`strangers`: where an outsider runs).
    """

    def __init__(self, count: int = 2, cpus: int = 2, resources: dict | None = None, rate: str | int | None = None,
                 burst: str | int | None = None, loopback_hostnames: bool = True, head_cpus: int = 0,
                 system_config: dict | None = None, token: bool = False, strangers: int = 0):
        why = unavailable()
        if why:
            raise HostsUnavailable(why)
        self.cpus, self.resources, self.token = cpus, dict(resources or {}), token
        self.index = claim_index()
        k = self.index
        self.bridge, self.bridge_address = f"chb{k}", f"198.18.{k}.254"
        self.hosts = [Host(i, f"chorus{k}h{i}", f"198.18.{k}.{i + 1}", f"chv{k}h{i}") for i in range(count)]
        self.strangers = [Host(i, f"chorus{k}h{i}", f"198.18.{k}.{i + 1}", f"chv{k}h{i}")
                          for i in range(count, count + strangers)]
        self.head: HeadNode | None = None
        self.rates: dict[int, tuple] = {}
        self._closed = False
        atexit.register(self.close)
        try:
            self._make_network(loopback_hostnames)
            if rate is not None:
                self.shape(None, rate, burst)
            self.head = HeadNode(cpus=head_cpus, token=token, dashboard=False, node_ip=self.bridge_address,
                                 system_config=system_config, object_store_bytes=OBJECT_STORE_BYTES,
                                 temp_prefix=head_folder_prefix(k))
            for host in self.hosts:
                self.start_node(host.index, wait=False)
            self._wait_for_nodes(len(self.hosts) + 1)
        except BaseException:
            self.close()
            raise

    # -- the network ------------------------------------------------------------------------------
    def _make_network(self, loopback_hostnames: bool) -> None:
        run_ip("link", "add", self.bridge, "type", "bridge")
        run_ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        run_ip("link", "set", self.bridge, "up")
        for host in self.hosts + self.strangers:
            run_ip("netns", "add", host.netns)
            run_ip("link", "add", host.device, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            run_ip("link", "set", host.device, "master", self.bridge)
            run_ip("link", "set", host.device, "up")
            run_ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            run_ip("-n", host.netns, "link", "set", "eth0", "up")
            run_ip("-n", host.netns, "link", "set", "lo", "up")
            if loopback_hostnames:  # `ip netns exec` mounts this over /etc/hosts inside the namespace
                folder = Path("/etc/netns") / host.netns
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")

    def shape(self, index: int | None, rate: str | int | None, burst: str | int | None = None) -> None:
        """Limit host `index`'s link (None: every host's) to `rate` in both directions (bits/s, or
        tc's units: "100mbit"), with a token bucket of `burst` bytes (default: 20 ms at the rate,
        at least 32 KiB); None removes the limit. Takes effect at once, also while jobs run."""
        for host in self.hosts if index is None else [self.hosts[index]]:
            for where in (["-n", host.netns, "qdisc", "del", "dev", "eth0", "root"],
                          ["qdisc", "del", "dev", host.device, "root"]):
                subprocess.run(["tc", *where], capture_output=True)  # none there yet: fine
            if rate is None:
                self.rates.pop(host.index, None)
                continue
            bits = rate_bits(rate)
            bucket = size_bytes(burst) if burst is not None else max(32 * 1024, bits // 8 // 50)
            tbf = ["root", "tbf", "rate", f"{bits}bit", "burst", str(bucket), "latency", "100ms"]
            run_tc("-n", host.netns, "qdisc", "add", "dev", "eth0", *tbf)
            run_tc("qdisc", "add", "dev", host.device, *tbf)
            self.rates[host.index] = (bits, bucket)

    def cut(self, index: int) -> None:
        """Host `index` loses its link (both directions) until `restore`."""
        run_ip("link", "set", self.hosts[index].device, "down")

    def restore(self, index: int) -> None:
        run_ip("link", "set", self.hosts[index].device, "up")

    def traffic(self, index: int) -> dict[str, int]:
        """Bytes host `index` has sent and received over its link since it was made (the bridge
        side's counters: what the host sent arrives there)."""
        stats = Path("/sys/class/net") / self.hosts[index].device / "statistics"
        return {"sent": int((stats / "rx_bytes").read_text()), "received": int((stats / "tx_bytes").read_text())}

    def shaped(self, index: int) -> dict[str, int]:
        """Bytes that went through host `index`'s rate limiters (`tc -s`: each tbf's 'Sent'):
        `sent` by the host, `received` by it; 0 where its link is not shaped."""
        host = self.hosts[index]
        return {"sent": qdisc_sent(["-n", host.netns], "eth0"), "received": qdisc_sent([], host.device)}

    # -- Ray --------------------------------------------------------------------------------------
    @property
    def gcs_address(self) -> str:
        """What a driver passes to `ray.init(address=...)` or `chorus train --address`."""
        return self.head.gcs_address

    @property
    def env(self) -> dict:
        """The environment the cluster's processes run with (the venv on PATH, auth mode set)."""
        return dict(self.head.env)

    def command(self, index: int, argv: list[str]) -> list[str]:
        """`argv` run inside host `index` (its namespace, its /etc/hosts): a Ray node's host, or
        past them a stranger's (`strangers`)."""
        host = (self.hosts + self.strangers)[index]
        return ["ip", "netns", "exec", host.netns, *argv]

    def start_node(self, index: int, wait: bool = True) -> None:
        """Start host `index`'s Ray node (again, after it died: a node daemon's restart)."""
        host = self.hosts[index]
        command = self.command(index, [
            str(BIN / "ray"), "start", "--address", self.gcs_address, "--node-ip-address", host.address,
            "--num-cpus", str(self.cpus), "--resources", json.dumps(self.resources, allow_nan=False),
            "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats"])
        proc = subprocess.run(command, env=self.head.env, capture_output=True, text=True, timeout=NODE_START_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start on host {index} ({host.address}) failed:\n{proc.stdout}\n{proc.stderr}")
        if wait:
            self._wait_for_nodes(sum(1 for n in self.nodes() if n["alive"]) + (0 if self.node_alive(index) else 1))

    def nodes(self) -> list[dict]:
        """The cluster's nodes as the GCS knows them: address, node id, alive (asked from a process
        of its own with the token, when the cluster has one: this one's Ray may be token-less)."""
        if self.token:
            proc = subprocess.run([sys.executable, "-c", NODES, self.gcs_address], env=self.head.env,
                                  capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"could not ask the hosts' cluster for its nodes: {proc.stderr[-2000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])
        return _nodes(self.gcs_address)

    def node_alive(self, index: int) -> bool:
        return any(n["alive"] and n["address"] == self.hosts[index].address for n in self.nodes())

    def node_id(self, index: int) -> str | None:
        """Host `index`'s live Ray node id."""
        return next((n["node_id"] for n in self.nodes() if n["alive"] and n["address"] == self.hosts[index].address),
                    None)

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while sum(1 for n in self.nodes() if n["alive"]) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hosts' Ray cluster has {self.nodes()}, not {count} live nodes")
            time.sleep(1.0 if self.token else 0.2)

    def leftovers(self, prefix: str) -> dict[str, list[str]]:
        """What jobs named `prefix...` hold on the hosts' cluster: named actors alive, placement
        groups not removed (asked from a process of its own: this one may be another cluster's
        driver)."""
        proc = subprocess.run([sys.executable, "-c", LEFTOVERS, self.gcs_address, prefix], env=self.head.env,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"could not ask the hosts' cluster for leftovers: {proc.stderr[-2000:]}")
        return {k: v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items() if v}

    # -- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every Ray process of the cluster (by PID), remove the links, namespaces, bridge and
        the hosts files, and give the index back. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.head is not None:
                self.head.stop()
        finally:
            remove_leftovers(self.index)  # what else runs in its namespaces or names its subnet
            release_index(self.index)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _nodes(gcs_address: str) -> list[dict]:
    from ray._raylet import GcsClient

    client = GcsClient(address=gcs_address)
    return [{"address": info.node_manager_address, "node_id": info.node_id.hex(),
             "alive": info.state == 0} for info in client.get_all_node_info(timeout=10).values()]


NODES = """
import json, sys
from orchestrator.testing.hosts import _nodes
print(json.dumps(_nodes(sys.argv[1])))
"""
LEFTOVERS = """
import json, sys, ray
from orchestrator.testing.cluster import leftovers_of
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(json.dumps(leftovers_of(sys.argv[2], request=False), allow_nan=False))
"""
