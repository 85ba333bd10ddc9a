"""Which network a learner's collectives go over: the one holding its node's address (the address
Ray gives the node), never what the machine's host name resolves to.

gloo and NCCL pick their interface themselves unless told: gloo resolves the host name, and on
hosts whose /etc/hosts maps it to a loopback address (Debian's default: 127.0.1.1) every member
then advertises an address no other host can reach (`connectFullMesh failed ... remote=[127.0.1.1]`).
`bind_to(address)` tells both, through the variables they read when a process group is made
(`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`), to use the interface that holds `address`, or the
interface the spec names (`group.interface`). Gossip's pair links are bound the same way, by
address (`links.pair_group`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket

CHOSEN_BY = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_ushort), ("addr", ctypes.c_ubyte * 4)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("next", ctypes.POINTER(_IfAddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_SockAddr)), ("netmask", ctypes.c_void_p),
                     ("broadaddr", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def interfaces() -> dict[str, list[str]]:
    """Every network interface of this process's network namespace and its IPv4 addresses
    (getifaddrs(3): secondary addresses too)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    found: dict[str, list[str]] = {}
    try:
        node = head
        while node:
            entry = node.contents
            name = entry.name.decode()
            found.setdefault(name, [])
            if entry.addr and entry.addr.contents.family == socket.AF_INET:
                found[name].append(socket.inet_ntoa(bytes(entry.addr.contents.addr)))
            node = entry.next
    finally:
        libc.freeifaddrs(head)
    return found


def interface_of(address: str) -> str:
    """The interface that holds `address`; ValueError naming the interfaces there are if none does."""
    found = interfaces()
    for name, addresses in found.items():
        if address in addresses:
            return name
    raise ValueError(f"no network interface here holds the node address {address} (interfaces: "
                     + ", ".join(f"{n} {'/'.join(a) or '-'}" for n, a in sorted(found.items())) + ")")


def bind_to(address: str | None, interface: str | None = None, peer: str | None = None) -> str:
    """Make the process groups this process creates from now on use `interface`, or the one that
    holds `address`; returns the interface. With `peer` (the node address of a member on another
    host): ValueError when the interface has only loopback addresses and `peer` is not one, since
    members on other hosts could never reach this one (gloo would only find that out after its
    connect timeouts, and not on every member alike)."""
    name = interface or interface_of(address)
    if peer is not None and not _loopback(peer):
        own = interfaces().get(name)
        if own is not None and own and all(_loopback(a) for a in own):
            raise ValueError(f"interface {name} has only loopback addresses ({', '.join(own)}), but a member of "
                             f"the group is on another host ({peer}): it could not reach this one (group.interface?)")
    for variable in CHOSEN_BY:
        os.environ[variable] = name
    return name


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1" or address == "localhost"
