"""Reading a tar stream (jobs/data/tar_stream.py): the same members, names and bytes as `tarfile`
reads, in every format `tarfile` writes (with long names); folders passed over; a corrupted
header or an archive cut inside a member raises `tarfile.ReadError`; one cut between members ends."""

import io
import random
import tarfile

import pytest

from jobs.data.tar_stream import MAX_MEMBER, members
from tests.jobs.data.hostile import tar_header

pytestmark = pytest.mark.unit


def _archive(files: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT, folder: bool = False) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=fmt) as tar:
        if folder:
            info = tarfile.TarInfo("a-folder")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _files(count: int = 20) -> list[tuple[str, bytes]]:
    rng = random.Random(0)
    sizes = [0, 1, 511, 512, 513, 1024] + [rng.randrange(1, 5000) for _ in range(count - 6)]
    return [(f"utt-{i:04d}.{['wav', 'mel', 'json'][i % 3]}", rng.randbytes(size)) for i, size in enumerate(sizes)]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_are_those_tarfile_reads(fmt):
    files = _files() + [("a/" + "long-name-" * 15 + ".json", b"{}")]  # 150 characters: prefix, L or pax
    if fmt == tarfile.USTAR_FORMAT:
        files[-1] = ("a" * 60 + "/" + "b" * 90 + ".json", b"{}")  # ustar splits it into prefix and name
    archive = _archive(files, fmt, folder=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    assert list(members(io.BytesIO(archive))) == expected == files


def test_a_corrupted_header_raises_read_error():
    archive = bytearray(_archive(_files(8)))
    first_size = len(_files(8)[0][1])  # 0 bytes: the second header follows the first at once
    assert first_size == 0
    archive[512 + 10] ^= 0xFF  # a byte of the second member's name: its checksum no longer holds
    found = members(io.BytesIO(bytes(archive)))
    assert next(found)[0] == "utt-0000.wav"
    with pytest.raises(tarfile.ReadError, match="checksum"):
        next(found)


def test_an_archive_cut_inside_a_member_raises_and_one_cut_between_members_ends():
    files = _files(8)
    archive = _archive(files, tarfile.USTAR_FORMAT)
    with pytest.raises(tarfile.ReadError, match="ends inside a member"):
        list(members(io.BytesIO(archive[: 512 * 8 + 100])))
    whole = list(members(io.BytesIO(archive)))
    boundary = 0  # the offset right after the first 3 members
    for _, data in files[:3]:
        boundary += 512 + len(data) + (-len(data) % 512)
    assert list(members(io.BytesIO(archive[:boundary]))) == whole[:3]


@pytest.mark.parametrize("size_field, size", [
    (b"\x80" + b"\xff" * 11, 2**88 - 1),  # base-256: more than any memory (was an OverflowError)
    (b"\xff" * 12, 2**88 - 1),  # base-256 negative, read as its magnitude
    (b"-0000000001\0", -1),  # octal -1 (was read as "the rest of the stream")
    (f"{MAX_MEMBER + 1:011o}\0".encode(), MAX_MEMBER + 1),
])
def test_a_header_whose_size_is_negative_or_over_the_bound_raises_before_reading(size_field, size):
    stream = io.BytesIO(tar_header(b"utt.wav", size_field) + b"\0" * 4096)
    with pytest.raises(tarfile.ReadError, match=rf"member size, {size} bytes, is not within 0\.\.{MAX_MEMBER}"):
        next(members(stream))
    assert stream.tell() == 512  # nothing read past the header


def test_a_member_over_a_smaller_bound_and_a_name_that_is_not_utf8_raise_read_error():
    archive = _archive([("small.json", b"{}"), ("big.wav", b"x" * 2000)])
    found = members(io.BytesIO(archive), max_member=1024)
    assert next(found) == ("small.json", b"{}")
    with pytest.raises(tarfile.ReadError, match="2000 bytes, is not within 0..1024"):
        next(found)
    with pytest.raises(tarfile.ReadError, match=r"a member name that is not UTF-8: b'utt\\xff.wav'"):
        list(members(io.BytesIO(tar_header(b"utt\xff.wav", b"00000000000\0"))))
