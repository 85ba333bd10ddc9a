"""What keeps strangers out of a library's process group (gloo, NCCL), whose own sockets cannot be
made to check the job's secret.

- `ListenerGuard`: every TCP listener the library opens in this process while a group forms gets
  a socket filter (classic BPF, SO_ATTACH_FILTER) that admits packets only from the group's
  members' node addresses, before its address is published (`rendezvous.RendezvousStore` calls
  `apply` ahead of each `set`). A stranger's SYN from any other address is dropped by the
  kernel: no connection, no descriptor, no byte reaches the library. A process on a member's own
  host shares that host's address and is not kept out by this (docs/security.md says what it can
  and cannot do, and what the operator does about it).
- `verify_members`: before any weights flow, every pair of members sends each other a tag of the
  job's secret over the group's own connection between them (point to point: each pair's
  socket is exercised, not a relay), bound to the group's fresh nonce and the pair's direction.
  A connection that a stranger won during the rendezvous cannot answer it, so the group is
  refused (`GroupRefused`) and formed again, with nothing of the model sent.

The guard reads this process's own sockets from /proc (Linux); where it cannot, and for an IPv6
listener (the filter reads IPv4 headers), it filters nothing and says so once.
"""

from __future__ import annotations

import ctypes
import hmac
import logging
import os
import socket
import struct
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.groups.channel import own_listeners
from orchestrator.groups.errors import GroupBroken

log = logging.getLogger("chorus.security")
SO_ATTACH_FILTER = 26
SKF_NET_OFF = -0x100000  # classic BPF: offsets from the network (IP) header
MAX_ADDRESSES = 250  # a jump's offset is one byte: the filter's list of addresses fits in it
TCP_LISTEN, TCP_HELD = "0A", ("01", "08")  # listening; open, or closed by the peer only (CLOSE_WAIT)
STRANGER = "a connection to its process group's listener from outside the group (gloo keeps it until the group "\
    "re-forms)"


class GroupRefused(GroupBroken):
    """A member of a forming group did not prove the job's secret over its connection: a stranger
    may have taken the member's place. The group is formed again (nothing of the model was sent)."""


def admit_only(addresses: list[str]) -> list[tuple[int, int, int, int]]:
    """The classic BPF program (code, jt, jf, k) that accepts packets whose IPv4 source is one of
    `addresses` and drops every other."""
    unique = sorted({a for a in addresses if _ipv4(a)})[:MAX_ADDRESSES]
    program = [(0x20, 0, 0, SKF_NET_OFF + 12 & 0xFFFFFFFF)]  # A = the IPv4 source address
    for j, address in enumerate(unique, start=1):  # if A == address: jump to "accept"
        program.append((0x15, len(unique) + 1 - j, 0, struct.unpack("!I", socket.inet_aton(address))[0]))
    return program + [(0x06, 0, 0, 0), (0x06, 0, 0, 0xFFFFFFFF)]  # drop; accept


def attach_filter(fd: int, inode: int, program: list[tuple[int, int, int, int]]) -> bool:
    """Attach `program` to the listening socket `inode` behind descriptor `fd` (a duplicate of it is
    used: the filter belongs to the socket, the descriptor stays its owner's). False, attaching
    nothing, when the descriptor no longer holds that listener (closed and reused meanwhile)."""
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in program))
    with socket.socket(fileno=os.dup(fd)) as duplicate:  # closing it closes the duplicate only
        if os.fstat(duplicate.fileno()).st_ino != inode or \
                not duplicate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        duplicate.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                             struct.pack("HL", len(program), ctypes.addressof(code)))
    return True


def own_sockets(states: tuple[str, ...], pid: int | str = "self",
                table: str = "tcp") -> list[tuple[int, str, int, str, int, int]]:
    """A process's IPv4 TCP sockets (`table` "tcp6": IPv6, addresses left as /proc gives them) in
    one of `states` ((TCP_LISTEN,), TCP_HELD): (inode, local address, local port, remote address,
    remote port, descriptor) each."""
    fds = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            fds[int(target[8:-1])] = int(entry.name)
    found = []
    for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
        fields = line.split()
        inode = int(fields[9])
        if fields[3] in states and inode in fds:
            found.append((inode, *_endpoint(fields[1]), *_endpoint(fields[2]), fds[inode]))
    return found


def _endpoint(field: str) -> tuple[str, int]:
    address, port = field.split(":")
    return (socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address), int(port, 16)


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)


def listening_sockets(pid: int | str = "self") -> dict[int, tuple[str, int, int]]:
    """A process's listening IPv4 TCP sockets: inode -> (address, port, descriptor)."""
    return {inode: (address, port, fd) for inode, address, port, _, _, fd in own_sockets((TCP_LISTEN,), pid)}


class ListenerGuard:
    """Filters the listeners this process opens from now on (but its own link listeners,
    `channel.own_ports`) so that only `peers` reach them (see the module's docstring).

    Args:
    peers: the group's members' node addresses.
    """

    def __init__(self, peers: list[str]):
        self.program = admit_only(peers)
        self.filtered: list[tuple[str, int]] = []  # (address, port) of each listener filtered
        self._seen = self._listeners()
        self._seen6 = self._ipv6_listeners()

    @staticmethod
    def _listeners() -> dict[int, tuple[str, int, int]]:
        try:
            return listening_sockets()
        except OSError:
            _say_once("this process's sockets cannot be read (/proc): a library's listeners are not filtered")
            return {}

    @staticmethod
    def _ipv6_listeners() -> set[int]:
        try:
            return {inode for inode, *_ in own_sockets((TCP_LISTEN,), table="tcp6")}
        except OSError:
            return set()

    def apply(self) -> None:
        """Filter every listener opened since the guard began (or since the last `apply`)."""
        now = self._listeners()
        for inode, (address, port, fd) in now.items():
            if inode in self._seen or (address, port) in own_listeners():
                continue
            try:
                if attach_filter(fd, inode, self.program):
                    self.filtered.append((address, port))
            except OSError as exc:  # the descriptor closed meanwhile, or not a socket of ours any more
                log.warning("could not filter the listener %s:%d: %s", address, port, exc)
        self._seen = now
        if self._ipv6_listeners() - self._seen6:
            _say_once("a library opened an IPv6 listener: it is not filtered (the filter reads IPv4 headers)")


class Strangers:
    """Connections to this process's filtered listeners that are not its group's own: a stranger on
    a member's host, whose address the filter cannot tell from the member's, and whose connection
    the library keeps. `watch` takes the group's own connections once it has formed; `new` names
    the sources of those opened since (each once), for the learner to count and log."""

    def __init__(self):
        self._ports: set[int] = set()
        self._seen: set[tuple[str, int, int]] = set()

    def watch(self, ports) -> None:
        self._ports = set(ports)
        self._seen = self._connections()

    def new(self) -> list[str]:
        now = self._connections()
        fresh, self._seen = now - self._seen, now
        return [address for address, _, _ in sorted(fresh)]

    def _connections(self) -> set[tuple[str, int, int]]:
        if not self._ports:
            return set()
        try:
            return {(remote, remote_port, port) for _, _, port, remote, remote_port, _ in own_sockets(TCP_HELD)
                    if port in self._ports}
        except OSError:
            return set()


STRANGERS = Strangers()  # this process's (a learner is in one group's library listeners at a time)


def verify_members(secret, nonce: str, rank: int, world_size: int, group=None, device=None) -> None:
    """Every pair of the group's members proves the secret to each other over its own connection
    (see the module's docstring); raises GroupRefused naming the ranks that did not, GroupBroken
    when a member is gone."""
    if world_size < 2:
        return
    device = device or torch.device("cpu")

    def tag(sender: int, receiver: int) -> bytes:
        return secret.tag(b"group-member", nonce.encode(), str(sender).encode(), str(receiver).encode())

    others = [r for r in range(world_size) if r != rank]
    received = {r: torch.zeros(32, dtype=torch.uint8, device=device) for r in others}
    sent = {r: torch.frombuffer(bytearray(tag(rank, r)), dtype=torch.uint8).to(device) for r in others}
    try:  # batched: NCCL may deadlock on unbatched sends and receives between the same two ranks
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, sent[r], group=group, group_peer=r) for r in others]
            + [dist.P2POp(dist.irecv, received[r], group=group, group_peer=r) for r in others])
        for work in works:
            work.wait()
    except RuntimeError as exc:
        raise GroupBroken(f"verifying the group's members failed: {exc}") from exc
    strangers = [r for r in others if not hmac.compare_digest(bytes(received[r].cpu().numpy()), tag(r, rank))]
    if strangers:
        raise GroupRefused(f"rank {rank}: the connection to rank(s) {strangers} did not prove the job's secret "
                           "(a stranger may have taken a member's place); forming the group again")


def _ipv4(address: str) -> bool:
    try:
        socket.inet_aton(address)
        return address.count(".") == 3
    except OSError:
        return False
