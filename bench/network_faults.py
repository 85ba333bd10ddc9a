"""The fault matrix's network rows (bench/faults.py runs them after the others): faults of the
links between hosts, on two hosts with addresses of their own (`orchestrator/testing/hosts.py`),
each a Ray node offering 2 `learner_slot`s, the head (the job's driver and service) in this
machine's namespace. A job of 4 learners (2 a host) is hit, after its first evaluation, by:

- `host-cut-off`: host 1 loses its link for CUT_S seconds, then gets it back;
- `link-flapping`: host 1's link goes down and up FLAPS times in FLAP_WINDOW_S seconds;
- `link-slow`: host 1's link drops to SLOW_RATE for SLOW_S seconds, then is unshaped again.

Learners that cannot be reached count as stuck after `learners.stuck_after_s` (6 s here, as the
learner-stuck row) and are dropped; their slots are asked for again and placed when the host is
back. Ray's own node health checks are its defaults here (a real cluster's), so a host cut off
for long enough is declared dead and its Ray node exits when it hears so: `NetBench` then starts
it again, as a node's supervisor (systemd, a Kubernetes pod) would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import ray

from orchestrator.testing.hosts import Hosts

CUT_S = 20.0
FLAPS, FLAP_WINDOW_S = 3, 30.0
SLOW_RATE, SLOW_S = "5mbit", 20.0
NET_LEARNERS = {"min": 2, "max": 4, "stuck_after_s": 6, "stuck_step_multiple": 5, "wait_timeout_s": 180}


class NetBench:
    """Two hosts for the network rows, with the interface bench/faults.py's rows use (`corpus`,
    `cluster.address`, `restore_nodes`, `shutdown`)."""

    def __init__(self, corpus):
        self.corpus = corpus
        self.hosts = Hosts(count=2, cpus=2, resources={"learner_slot": 2})
        self.cluster = SimpleNamespace(address=self.hosts.gcs_address)
        ray.init(address=self.hosts.gcs_address, log_to_driver=False)

    def node_id(self, index: int) -> str | None:
        return self.hosts.node_id(index)

    def restore_nodes(self) -> None:
        """Every link up and unshaped, every host's Ray node alive (started again if it died)."""
        for host in self.hosts.hosts:
            self.hosts.shape(host.index, None)
            self.hosts.restore(host.index)
        self.revive()

    def revive(self) -> list[int]:
        """Start the Ray node of each host whose node died (a supervisor's restart); returns them."""
        dead = [h.index for h in self.hosts.hosts if not self.hosts.node_alive(h.index)]
        for index in dead:
            deadline = time.time() + 60
            while True:  # a raylet that has just heard it was declared dead may still be exiting
                try:
                    self.hosts.start_node(index)
                    break
                except RuntimeError:
                    if time.time() > deadline:
                        raise
                    time.sleep(2)
        return dead

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            ray.shutdown()
        self.hosts.close()


def _start(row) -> tuple[list[int], str]:
    """The row's job on 4 learners, 2 a host, after its first evaluation; host 1's learners."""
    row.start_job(learners=NET_LEARNERS)
    row.first_evaluation(learners=4)
    node = row.bench.node_id(1)
    return [s.id for s in row.live().values() if s.node == node], node


def _rejoined(row, since: float, count: int = 4) -> int:
    """Wait until learners have joined on a host after `since` and the job has `count` again;
    returns how many joined."""
    row.wait("learners joining after the link came back", lambda: [e for e in row.events("join") if e["time"] >= since])
    row.wait(f"{count} learners", lambda: len(row.live()) >= count)
    return len([e for e in row.events("join") if e["time"] >= since])


def host_cut_off(row) -> None:
    on_host, _ = _start(row)
    hosts = row.bench.hosts
    row.fault()
    hosts.cut(1)
    back = threading.Timer(CUT_S, lambda: (hosts.restore(1), row.bench.revive()))
    back.start()
    row.cleanups.append(back.cancel)
    for learner in on_host:  # dropped (stuck: no answer, or its node declared dead), the rest stepping
        row.recovered("failure", learner)
    back.join()
    joined = _rejoined(row, row.fault_at + CUT_S)
    row.more_steps()
    row.end_job()
    row.note(f"recovered: host 1's learners {on_host} dropped, the rest went on; {joined} joined when its link "
             f"came back after {CUT_S:g} s")


def link_flapping(row) -> None:
    on_host, _ = _start(row)
    hosts = row.bench.hosts
    row.fault()
    step_at_fault = row.group_step()
    for _ in range(FLAPS):
        hosts.cut(1)
        time.sleep(FLAP_WINDOW_S / FLAPS / 2)
        hosts.restore(1)
        time.sleep(FLAP_WINDOW_S / FLAPS / 2)
    revived = row.bench.revive()
    dropped = {e["learner"] for e in row.events("failure") if e["time"] >= row.fault_at}
    if dropped:
        for learner in dropped:
            row.recovered("failure", learner)
        _rejoined(row, row.fault_at)
    row.more_steps()
    stepped = row.group_step() - step_at_fault
    row.end_job()
    row.note(f"{FLAPS} flaps in {FLAP_WINDOW_S:g} s: " + (f"learners {sorted(dropped)} dropped and replaced"
                                                           if dropped else "nobody dropped")
             + (", host 1's node restarted" if revived else "") + f"; {stepped} group steps since the fault")


def link_slow(row) -> None:
    on_host, _ = _start(row)
    hosts = row.bench.hosts
    before = row.group_step()
    time.sleep(5)
    rate_before = (row.group_step() - before) / 5
    row.fault()
    hosts.shape(1, SLOW_RATE)
    start = row.group_step()
    time.sleep(SLOW_S)
    rate_slow = (row.group_step() - start) / SLOW_S
    hosts.shape(1, None)
    dropped = {e["learner"] for e in row.events("failure") if e["time"] >= row.fault_at}
    for learner in dropped:
        row.recovered("failure", learner)
    if dropped:
        _rejoined(row, row.fault_at)
    row.more_steps()
    row.end_job()
    row.note(f"host 1 at {SLOW_RATE} for {SLOW_S:g} s: group steps/s {rate_before:.2f} before, {rate_slow:.2f} "
             "during" + (f"; learners {sorted(dropped)} dropped and replaced" if dropped else "; nobody dropped"))
