"""What a job's learner processes expose and hold, read from /proc by a harness outside them (root,
in the machine's namespace; each learner in its host's): the learner processes of a network
namespace, their TCP listeners (IPv4 and IPv6, and whether on a wildcard address), the connections
open on one of their ports, their descriptors and resident memory. For tests and benchmarks of
what a stranger can do to a job (`stranger.py` is the stranger)."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

LEARNER_TITLE = b"ray::_LearnerProcess"  # a learner actor's process title (Ray sets it from the class)
LISTEN, HELD = "0A", ("01", "08")  # listening; established, and closed by the peer only (CLOSE_WAIT)
WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def wildcard(self) -> bool:
        return self.address in WILDCARDS

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"


def learner_pids(netns: str) -> list[int]:
    """The learner processes running in network namespace `netns`."""
    listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    found = []
    for pid in listed:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(LEARNER_TITLE):
                found.append(int(pid))
        except OSError:
            continue
    return sorted(found)


def _inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntoa(raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    mapped = socket.inet_ntop(socket.AF_INET6, words)
    return mapped.removeprefix("::ffff:") if mapped.startswith("::ffff:") and "." in mapped else mapped


def _rows(pid: int, state: str) -> list[tuple[str, int, str, int]]:
    """(local address, local port, remote address, remote port) of the process's TCP sockets in `state`."""
    inodes, rows = _inodes(pid), []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state and fields[9] in inodes:
                (local, lport), (remote, rport) = (f.rsplit(":", 1) for f in fields[1:3])
                rows.append((_address(local), int(lport, 16), _address(remote), int(rport, 16)))
    return rows


def listeners(pid: int) -> list[Listener]:
    """Every TCP port process `pid` listens on."""
    return sorted({Listener(pid, address, port) for address, port, _, _ in _rows(pid, LISTEN)},
                  key=lambda lis: lis.port)


def connections(pid: int, port: int) -> list[tuple[str, int]]:
    """The (remote address, port) of each connection process `pid` holds on its local `port`, open or
    closed by the other end and not yet by this one (a descriptor it still holds)."""
    return sorted((remote, rport) for state in HELD for _, lport, remote, rport in _rows(pid, state) if lport == port)


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def worker_ports(gcs_address: str, env: dict, prefix: str) -> dict[int, dict]:
    """Process id -> {"ray": the port of Ray's own gRPC server in it (every Ray worker has one),
    "chorus": the ports of its own link listeners (`channel.own_listeners`, asked of the learner
    through Ray)}, for each live actor named `prefix...` (asked from a process of its own, with
    the cluster's `env`: the owner's view, which a stranger does not have)."""
    import json
    import sys

    proc = subprocess.run([sys.executable, "-c", _WORKER_PORTS, gcs_address, prefix], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    if proc.returncode != 0:
        raise RuntimeError(f"could not ask the cluster for its actors: {proc.stderr[-2000:]}")
    return {int(pid): ports for pid, ports in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def own_link_ports(service) -> tuple[int, list[int]]:
    """Run inside a learner (`__ray_call__`'s `service`, unused): its pid and the ports of its own
    link listeners."""
    from orchestrator.groups.channel import own_listeners

    return os.getpid(), sorted(port for _, port in own_listeners())


_WORKER_PORTS = """
import json, sys, ray
import ray._private.state as state
from ray.core.generated import gcs_pb2
from orchestrator.testing.exposure import own_link_ports

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
table = state.state._connect_and_get_accessor().get_actor_table(None, "ALIVE")
found = {}
for row in map(gcs_pb2.ActorTableData.FromString, table):
    if row.name.startswith(sys.argv[2]):
        handle = ray.get_actor(row.name, namespace=row.ray_namespace)
        chorus = handle.__ray_call__.options(concurrency_group="mix").remote(own_link_ports) \
            if row.class_name == "_LearnerProcess" else None
        found[row.pid] = {"ray": row.address.port, "chorus": ray.get(chorus, timeout=60)[1] if chorus else []}
print(json.dumps(found))
"""
