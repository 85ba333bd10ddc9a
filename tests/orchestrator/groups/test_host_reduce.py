"""The host-by-host sum (`groups/host_reduce.py`) in real gloo process groups, one process per
member on this machine's loopback: its result, and what a member that dies does to the others."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.unit  # no Ray: gloo groups in processes forked from a server that imported torch once

HOSTS = [[0, 2], [1]]  # three members on two "hosts": the lone member of host 1 leads it
TIMEOUT_S = 60.0  # each collective's bound: a member left waiting would fail only after this


def _member(rank: int, world: int, hosts, port: int, compression: str, dies: int | None, answers) -> None:
    """One member: a first sum (reported), then, when `dies` is its rank, exit; the others sum
    again and report how long it took them to fail."""
    from datetime import timedelta

    import torch.distributed as dist

    from orchestrator.groups.collectives import collective
    from orchestrator.groups.errors import GroupBroken
    from orchestrator.groups.host_reduce import HostReduce

    # the job's process group, made plainly (Chorus's own rendezvous is `test_rendezvous.py`'s)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    by_host = HostReduce(rank, hosts, compression, collective, TIMEOUT_S)
    buffer = torch.arange(1000, dtype=torch.float32) * (rank + 1) / 7
    by_host.sum(buffer)
    answers.put((rank, "sum", buffer.tolist()))
    if dies is None:
        return
    if rank == dies:
        answers.close()
        answers.join_thread()  # its answer is on its way before it dies
        os._exit(1)
    started = time.monotonic()
    try:
        by_host.sum(buffer)
        answers.put((rank, "summed", None))
    except GroupBroken:
        answers.put((rank, "broken", time.monotonic() - started))
    time.sleep(TIMEOUT_S)  # alive (as a learner between chunks): its connections are its groups' doing


def _run(world: int, hosts, compression: str = "none", dies: int | None = None) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("forkserver")  # a clean process (no threads, no gloo of this one's), torch imported once
    ctx.set_forkserver_preload(["torch", "orchestrator.groups.host_reduce", "orchestrator.groups.collectives"])
    answers = ctx.Queue()
    members = [ctx.Process(target=_member, args=(r, world, hosts, port, compression, dies, answers), daemon=True)
               for r in range(world)]
    for member in members:
        member.start()
    expected = world + (0 if dies is None else world - 1)
    try:
        return [answers.get(timeout=TIMEOUT_S + 30) for _ in range(expected)]
    finally:
        for member in members:
            member.kill()
            member.join()


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_the_host_by_host_sum_is_the_same_on_every_member(compression):
    sums = {rank: torch.tensor(buffer) for rank, _, buffer in _run(4, [[0, 2], [1, 3]], compression)}
    exact = sum(torch.arange(1000, dtype=torch.float32) * (r + 1) / 7 for r in range(4))
    assert all(torch.equal(sums[0], sums[r]) for r in range(4))  # the same bits: replicas stay identical
    if compression == "none":
        assert torch.allclose(sums[0], exact, rtol=1e-6)
    else:  # int8 across hosts: the tail slots exact, the rest within a block's rounding
        assert torch.equal(sums[0][-4:], exact[-4:])
        assert (sums[0] - exact).abs().max() <= exact.abs().max() / 64


@pytest.mark.parametrize("dies", [2, 0], ids=["a-member", "a-leader"])
def test_a_member_that_dies_breaks_every_other_out_at_once(dies):
    """Rank 2 (host 0's second member) dies: host 0's leader fails in its host's sum; the leader of
    host 1, waiting for it across hosts, must fail too, at once, not at the collective timeout.
    Likewise when host 0's leader dies (its host's member and the other leader wait on it)."""
    answers = [a for a in _run(3, HOSTS, dies=dies) if a[1] != "sum"]
    assert sorted(rank for rank, _, _ in answers) == sorted({0, 1, 2} - {dies})
    assert all(kind == "broken" for _, kind, _ in answers), answers
    assert max(took for _, _, took in answers) < 10, answers
