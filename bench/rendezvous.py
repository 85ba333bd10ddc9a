"""Benchmark: what the rendezvous over Ray costs a group's formation (issue 56: "measure and choose").

A process group's members used to meet at a c10d TCPStore that rank 0 hosted on an open port; now
they meet on a board of the job's service, every key a Ray call carrying a tag of the job's secret
(`orchestrator/groups/rendezvous.py`), and then prove the secret to each other pair by pair before
any weights flow (`guard.verify_members`). Contenders, interleaved, on one local Ray instance, for
groups of 2, 4 and 8 members (plain Ray actors of one CPU-less process each):

- `tcpstore`: `init_process_group("gloo")` at a TCPStore on rank 0's free port (what Chorus did);
- `chorus`: `allreduce.join_process_group` (the board, the listeners' filter, the pairwise proof).

Each repeat forms the group anew; measured: the seconds from the call to the last member joined.
Writes `bench/results/rendezvous.json` and `.png`; `passed` when the Chorus join of 8 takes under
RENDEZVOUS_TIMEOUT_S / 10 (it is formed far inside the bound a join may take).

    .venv/bin/python bench/rendezvous.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import compare, interleaved, summary  # noqa: E402

from orchestrator.base.secret import JobSecret  # noqa: E402
from orchestrator.groups.collectives import RENDEZVOUS_TIMEOUT_S  # noqa: E402
from orchestrator.groups.rendezvous import BoardActor, Meeting  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SIZES = (2, 4, 8)


@ray.remote(num_cpus=0)
class Member:
    """One process that joins groups: plainly at a TCPStore, or as a Chorus learner does."""

    def __init__(self, secret):
        import torch

        from orchestrator.groups.channel import Refusals

        torch.set_num_threads(1)
        self.learner = SimpleNamespace(node_address=ray.util.get_node_ip_address(), secret=secret,
                                       refusals=Refusals(), device=torch.device("cpu"))

    def address(self) -> str:
        from orchestrator.cluster.local_head import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def join_tcpstore(self, address: str, rank: int, world: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        from orchestrator.groups.collectives import CONNECT_PACING_S, leave_process_group

        leave_process_group()
        time.sleep(rank * CONNECT_PACING_S)
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))

    def join_chorus(self, meeting, rank: int, world: int) -> None:
        from orchestrator.groups.collectives import join_process_group

        join_process_group("gloo", meeting, rank, world, 30.0, self.learner)

    def leave(self) -> None:
        from orchestrator.groups.collectives import leave_process_group

        leave_process_group()


def form(kind: str, members: list, boards, serial: list) -> float:
    world = len(members)
    started = time.perf_counter()
    if kind == "tcpstore":
        address = ray.get(members[0].address.remote())
        ray.get([m.join_tcpstore.remote(address, r, world) for r, m in enumerate(members)])
    else:
        serial[0] += 1
        meeting = Meeting(boards, f"bench-{serial[0]}", [ray.util.get_node_ip_address()])
        ray.get([m.join_chorus.remote(meeting, r, world) for r, m in enumerate(members)])
    took = time.perf_counter() - started
    ray.get([m.leave.remote() for m in members])
    return took


def plot(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for kind, color in (("tcpstore", "tab:gray"), ("chorus", "tab:blue")):
        xs = list(result["seconds"])
        ax.errorbar([int(x) for x in xs], [result["seconds"][x][kind]["median"] for x in xs], fmt="o-", color=color,
                    yerr=[[result["seconds"][x][kind]["median"] - result["seconds"][x][kind]["iqr"][0] for x in xs],
                          [result["seconds"][x][kind]["iqr"][1] - result["seconds"][x][kind]["median"] for x in xs]],
                    label=kind, capsize=3)
    ax.set_xlabel("members")
    ax.set_ylabel("seconds to form the group (median, IQR)")
    ax.set_title("A process group's formation: an open TCPStore vs Chorus's rendezvous over Ray", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    secret = JobSecret()
    boards = BoardActor.options(num_cpus=0).remote(secret)
    seconds, serial = {}, [0]
    try:
        for size in SIZES:
            members = [Member.remote(secret) for _ in range(size)]
            ray.get([m.leave.remote() for m in members])  # started
            runs = interleaved({kind: (lambda _r, kind=kind, members=members: form(kind, members, boards, serial))
                                for kind in ("tcpstore", "chorus")}, repeats=args.repeats)
            stats = {kind: summary(values, 3) for kind, values in runs.items()}
            seconds[str(size)] = {**stats, "chorus_over_tcpstore": compare(stats["chorus"], stats["tcpstore"]),
                                  "runs": runs}
            print(f"{size} members: tcpstore {stats['tcpstore']['median']:.3f} s, chorus "
                  f"{stats['chorus']['median']:.3f} s ({seconds[str(size)]['chorus_over_tcpstore']})", flush=True)
            for m in members:
                ray.kill(m)
    finally:
        ray.shutdown()
    largest = seconds[str(SIZES[-1])]["chorus"]["median"]
    result = {"benchmark": "rendezvous", "commit": commit(), "measured_at": time.strftime("%Y-%m-%d %H:%M %Z"),
              "repeats": args.repeats, "seconds": seconds, "bound_s": RENDEZVOUS_TIMEOUT_S / 10,
              "passed": largest < RENDEZVOUS_TIMEOUT_S / 10}
    write_results(RESULTS / "rendezvous.json", result, plot)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
