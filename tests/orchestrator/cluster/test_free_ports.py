"""A head's ports are distinct: chosen one at a time, the kernel can hand the same free port back
twice (a CI run's `ray start --head` got 49367 for both its client server and its dashboard agent)."""

import pytest

from orchestrator.cluster.local_head import free_ports

pytestmark = pytest.mark.unit


def test_ports_chosen_together_are_distinct_and_free():
    import socket

    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:8]:  # and each can be bound now that the choice is over
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
