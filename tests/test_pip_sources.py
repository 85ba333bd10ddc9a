"""tools/pip_sources.py: pip's configured sources as uv's flags, a local index's files as one flat
folder (so uv chooses among a version's wheels from every local index, as pip does)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location("pip_sources", Path(__file__).parents[1] / "tools" / "pip_sources.py")
pip_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_sources)


def _index(root: Path, package: str, files: list[str]) -> str:
    """A local PEP 503 index at `root` listing `files` (kept in root/../files) for `package`."""
    (root / package).mkdir(parents=True)
    (root.parent / "files").mkdir(exist_ok=True)
    for name in files:
        (root.parent / "files" / name).write_bytes(b"wheel")
    links = "".join(f'<a href="../../files/{name}#sha256=0">{name}</a>' for name in files)
    (root / package / "index.html").write_text(f"<html><body>{links}</body></html>")
    return root.as_uri()


def test_two_local_indexes_become_one_flat_folder_beside_the_remote_index_and_find_links(tmp_path):
    anyw, manylinux = "soundfile-0.14.0-py3-none-any.whl", "soundfile-0.14.0-py3-none-manylinux_2_28_x86_64.whl"
    first = _index(tmp_path / "a" / "simple", "soundfile", [anyw])
    second = _index(tmp_path / "b" / "simple", "soundfile", [manylinux])
    values = {"extra-index-url": [first, "https://example.org/simple", second], "find-links": ["/opt/wheels"],
              "constraint": ["/etc/c.txt"]}
    flat = tmp_path / "flat"
    flags = pip_sources.uv_flags(values, flat)
    assert flags == ["--find-links", str(flat), "--extra-index-url", "https://example.org/simple",
                     "--find-links", "/opt/wheels", "--constraint", "/etc/c.txt"]
    assert sorted(p.name for p in flat.iterdir()) == [anyw, manylinux]
    assert (flat / manylinux).resolve() == (tmp_path / "b" / "files" / manylinux)


def test_a_local_index_in_place_of_pypi_means_no_remote_index(tmp_path):
    local = _index(tmp_path / "simple", "six", ["six-1.16.0-py2.py3-none-any.whl"])
    flags = pip_sources.uv_flags({"index-url": [local]}, tmp_path / "flat")
    assert flags == ["--find-links", str(tmp_path / "flat"), "--no-index"]
    assert pip_sources.uv_flags({}, tmp_path / "unused") == [] and not (tmp_path / "unused").exists()
