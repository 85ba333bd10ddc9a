"""Reading a tar archive from a stream member by member: the regular files' names and bytes, in
order, with each header's checksum checked. A shard's reader spent most of its unpacking time in
`tarfile`'s stream mode (its header objects and small buffered reads); this reads each header and
member with one call each. It knows ustar and GNU headers, pax extended headers (a long `path`)
and GNU long names; other entries (folders, links) are passed over. A bad header (a size that is
negative or over `max_member`, a name that is not UTF-8), or a stream that ends inside a member,
raises `tarfile.ReadError`, as `tarfile` would; a stream that ends between members just ends.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import BinaryIO

BLOCK = 512
REGULAR = (b"0", b"\0", b"7")  # a file (and a contiguous file)
PAX, GLOBAL_PAX, GNU_LONG_NAME = b"x", b"g", b"L"
MAX_MEMBER = 256 << 20  # bytes: a member is held whole in memory, and is one utterance's file (an hour of 16 kHz
# 16-bit audio is 115 MB); a header that claims more is corrupt or hostile, not a shard to allocate for


def members(stream: BinaryIO, max_member: int = MAX_MEMBER) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular file in the archive `stream` holds, in order."""
    long_name = None
    while True:
        header = stream.read(BLOCK)
        if len(header) < BLOCK or header.count(0) == BLOCK:
            return  # the end-of-archive blocks, or a stream cut between members
        size, entry_type = _checked(header, max_member)
        data = _exactly(stream, size)
        _exactly(stream, -size % BLOCK)
        if entry_type == PAX:
            long_name = _pax_path(data) or long_name
        elif entry_type == GNU_LONG_NAME:
            long_name = _text(data.rstrip(b"\0"))
        elif entry_type in REGULAR:
            yield long_name or _name(header), data
            long_name = None
        elif entry_type != GLOBAL_PAX:
            long_name = None


def _checked(header: bytes, max_member: int) -> tuple[int, bytes]:
    """A header's member size and type, once its checksum holds and the size is within bounds."""
    try:
        stored = int(header[148:156].rstrip(b"\0 ").decode("ascii") or "0", 8)
        size = _number(header[124:136])
    except ValueError:
        raise tarfile.ReadError("a tar header that is not one") from None
    if stored != sum(header[:148]) + 8 * 32 + sum(header[156:]):
        raise tarfile.ReadError("a tar header whose checksum does not match")
    if not 0 <= size <= max_member:
        raise tarfile.ReadError(f"a tar header whose member size, {size} bytes, is not within 0..{max_member}")
    return size, header[156:157]


def _number(field: bytes) -> int:
    """An octal field, or GNU's base-256 one (its first byte's top bit set)."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    return int(field.rstrip(b"\0 ").decode("ascii") or "0", 8)


def _name(header: bytes) -> str:
    """The member's name; a POSIX (ustar or pax) header may split it into a prefix and a name, a
    GNU header ("ustar  ") keeps other fields where the prefix would be."""
    name = _text(header[:100].split(b"\0", 1)[0])
    if header[257:263] == b"ustar\0":
        prefix = _text(header[345:500].split(b"\0", 1)[0])
        return f"{prefix}/{name}" if prefix else name
    return name


def _pax_path(data: bytes) -> str | None:
    """The `path` record of a pax extended header ("<length> path=<value>\\n" records)."""
    for record in data.split(b"\n"):
        _, _, field = record.partition(b" ")
        key, _, value = field.partition(b"=")
        if key == b"path":
            return _text(value)
    return None


def _text(name: bytes) -> str:
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise tarfile.ReadError(f"a member name that is not UTF-8: {name[:60]!r}") from None


def _exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) < size:
        raise tarfile.ReadError(f"the archive ends inside a member ({len(data)} of {size} bytes)")
    return data
