"""What keeps strangers out of a library's process group (orchestrator/groups/guard.py): listeners
opened while a group forms admit only its members' addresses (the kernel drops anyone else's SYN),
Chorus's own link listeners are left alone; and a group whose members cannot prove the job's
secret to each other over their own connections is refused before any weights flow."""

from __future__ import annotations

import multiprocessing
import socket
from datetime import timedelta

import pytest

from orchestrator.base.secret import JobSecret
from orchestrator.groups.channel import LinkListener, Refusals
from orchestrator.groups.guard import ListenerGuard, admit_only, listening_sockets

pytestmark = pytest.mark.unit


def _connects(port: int, source: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5, source_address=(source, 0)):
            return True
    except OSError:  # the SYN was dropped: no connection at all
        return False


def test_a_listener_opened_while_a_group_forms_admits_its_members_only():
    before = socket.create_server(("127.0.0.1", 0))  # a listener of the process's own, from before
    guard = ListenerGuard(["127.0.0.1"])
    library = socket.create_server(("0.0.0.0", 0))  # what a library opens while the group forms
    ours = LinkListener(JobSecret(), "127.0.0.1", Refusals())  # and this learner's own link listener
    try:
        guard.apply()
        port = library.getsockname()[1]
        assert guard.filtered == [("0.0.0.0", port)]
        assert _connects(port, "127.0.0.1")  # a member
        assert not _connects(port, "127.0.0.2")  # anyone else (another loopback address)
        assert _connects(before.getsockname()[1], "127.0.0.2") and _connects(ours.port, "127.0.0.2")
        assert {p for _, p, _ in listening_sockets().values()} >= {port, ours.port}
    finally:
        for sock in (before, library):
            sock.close()
        ours.close()


def test_the_filter_lists_each_member_once():
    program = admit_only(["10.0.0.1", "10.0.0.2", "10.0.0.1", "not-an-address"])
    assert len(program) == 1 + 2 + 2  # load, one comparison per address, drop, accept


def _verify(rank: int, path: str, secrets: list, results) -> None:
    import torch.distributed as dist

    from orchestrator.groups.guard import GroupRefused, verify_members

    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=20))
    try:
        verify_members(secrets[0], "nonce-1", rank, 2)
        results.put((rank, "same secret", "proven"))
        mine = secrets[rank]  # rank 1 holds another job's secret now
        try:
            verify_members(mine, "nonce-2", rank, 2)
            results.put((rank, "other secret", "proven"))
        except GroupRefused as exc:
            results.put((rank, "other secret", str(exc)))
    finally:
        dist.destroy_process_group()


def test_members_that_cannot_prove_the_secret_to_each_other_are_refused(tmp_path):
    context = multiprocessing.get_context("fork")  # torch is imported here already: the members start at once
    results, secrets = context.Queue(), [JobSecret(), JobSecret()]
    members = [context.Process(target=_verify, args=(rank, str(tmp_path / "store"), secrets, results))
               for rank in range(2)]
    for member in members:
        member.start()
    for member in members:
        member.join(60)
    got = sorted(results.get(timeout=5) for _ in range(4))
    assert [g[:3] for g in got if g[1] == "same secret"] == [(0, "same secret", "proven"), (1, "same secret", "proven")]
    refused = [g for g in got if g[1] == "other secret"]
    assert len(refused) == 2 and all("did not prove the job's secret" in g[2] for g in refused), refused
