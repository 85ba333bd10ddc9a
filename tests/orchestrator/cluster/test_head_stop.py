"""A head started by `HeadNode` is stopped whole: every process `ray start` left, including Ray
Client's server, which names neither the head's folder nor its address in its command line (it
gives the GCS by the machine's own address) and outlived the head by minutes before."""

from pathlib import Path

import pytest

from orchestrator.cluster.local_head import HEAD_MARK, HeadNode

pytestmark = pytest.mark.slow


def _marked(temp_dir: Path) -> dict[int, str]:
    """Processes with the head's mark in their environment: pid -> command line."""
    found, mark = {}, f"{HEAD_MARK}={temp_dir}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def test_a_stopped_head_leaves_no_process_not_even_ray_clients_server():
    head = HeadNode(cpus=1, token=False, dashboard=False)
    try:
        started = _marked(head.temp_dir)
        assert any("ray.util.client.server" in line for line in started.values()), started
        assert set(started) <= set(head.pids())
    finally:
        head.stop()
    assert _marked(head.temp_dir) == {}
