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

The guard reads this process's own sockets from /proc (Linux); elsewhere it does nothing and says
so once.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
from pathlib import Path

import torch
import torch.distributed as dist

from orchestrator.groups.channel import own_ports
from orchestrator.groups.errors import GroupBroken

log = logging.getLogger("chorus.security")
SO_ATTACH_FILTER = 26
SKF_NET_OFF = -0x100000  # classic BPF: offsets from the network (IP) header
MAX_ADDRESSES = 250  # a jump's offset is one byte: the filter's list of addresses fits in it
TCP_LISTEN = "0A"


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


def attach_filter(fd: int, program: list[tuple[int, int, int, int]]) -> None:
    """Attach `program` to the socket behind descriptor `fd` (a duplicate of it is used: the filter
    belongs to the socket, the descriptor stays its owner's)."""
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in program))
    with socket.socket(fileno=os.dup(fd)) as duplicate:  # closing it closes the duplicate only
        duplicate.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                             struct.pack("HL", len(program), ctypes.addressof(code)))


def listening_sockets(pid: int | str = "self") -> dict[int, tuple[str, int, int]]:
    """This process's listening IPv4 TCP sockets: inode -> (address, port, descriptor)."""
    fds = {}
    folder = Path(f"/proc/{pid}/fd")
    for entry in folder.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            fds[int(target[8:-1])] = int(entry.name)
    found = {}
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        inode = int(fields[9])
        if fields[3] == TCP_LISTEN and inode in fds:
            address, port = fields[1].split(":")
            found[inode] = (socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16), fds[inode])
    return found


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

    def _listeners(self) -> dict[int, tuple[str, int, int]]:
        try:
            return listening_sockets()
        except OSError:
            return {}

    def apply(self) -> None:
        """Filter every listener opened since the guard began (or since the last `apply`)."""
        now = self._listeners()
        for inode, (address, port, fd) in now.items():
            if inode in self._seen or port in own_ports():
                continue
            try:
                attach_filter(fd, self.program)
                self.filtered.append((address, port))
            except OSError as exc:  # the descriptor closed meanwhile, or not a socket of ours any more
                log.warning("could not filter the listener %s:%d: %s", address, port, exc)
        self._seen = now


def verify_members(secret, nonce: str, rank: int, world_size: int, group=None, device=None) -> None:
    """Every pair of the group's members proves the secret to each other over its own connection
    (see the module's docstring); raises GroupRefused naming the ranks that did not, GroupBroken
    when a member is gone."""
    if world_size < 2:
        return
    device = device or torch.device("cpu")

    def tag(sender: int, receiver: int) -> torch.Tensor:
        raw = secret.tag(b"group-member", nonce.encode(), str(sender).encode(), str(receiver).encode())
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)

    others = [r for r in range(world_size) if r != rank]
    received = {r: torch.zeros(32, dtype=torch.uint8, device=device) for r in others}
    try:
        works = [dist.isend(tag(rank, r), group=group, group_dst=r) for r in others]
        works += [dist.irecv(received[r], group=group, group_src=r) for r in others]
        for work in works:
            work.wait()
    except RuntimeError as exc:
        raise GroupBroken(f"verifying the group's members failed: {exc}") from exc
    strangers = [r for r in others if not torch.equal(received[r].cpu(), tag(r, rank).cpu())]
    if strangers:
        raise GroupRefused(f"rank {rank}: the connection to rank(s) {strangers} did not prove the job's secret "
                           "(a stranger may have taken a member's place); forming the group again")


def _ipv4(address: str) -> bool:
    try:
        socket.inet_aton(address)
        return address.count(".") == 3
    except OSError:
        return False
