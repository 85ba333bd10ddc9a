"""A job on hosts (`hosts.Hosts`) that strangers probe, for tests and benchmarks: `chorus train` in a
driver process of its own, and, once its learners listen, a stranger on a member's host and one on
a host of its own (`stranger.py`) probing every port the learners listen on, at once; what the
learners held before and after (`exposure.py`) is kept in a `Probe`.

Example:
    >>> job = ProbedJob(hosts, spec, out)                     # doctest: +SKIP
    >>> probe = job.probe(learners=2)                         # strangers at work meanwhile
    >>> summary = job.summary()
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.testing import exposure

ROOT = Path(__file__).resolve().parents[2]
STEADY_S = 2.0  # the learners' listeners unchanged this long: the group has formed
SETTLED_S = 10.0  # Chorus's listeners are back to the connections they had within this


@dataclass
class Probe:
    """What the strangers did and what it cost the learners."""

    listening: dict[int, list]  # learner pid -> its listeners
    ray_ports: dict[int, int]  # learner pid -> the port of Ray's own gRPC server in it
    attacks: dict[str, dict]  # where the stranger ran -> its report (`stranger.py`)
    before: dict[int, tuple]  # pid -> (RSS bytes, {port: connections held}, descriptors)
    after: dict[int, tuple]
    chorus: set[str] = field(default_factory=set)  # "address:port" of Chorus's link listeners (asked of the learners)
    attack_s: float = 0.0
    settle_s: float = 0.0  # from the attack's end until Chorus's listeners held what they did before
    settled: bool = False

    def kept_by_library(self) -> dict[int, dict[int, int]]:
        """pid -> {port: connections kept since the attack} of the listeners neither Chorus's nor Ray's."""
        return {pid: {lis.port: self.after[pid][1][lis.port] - self.before[pid][1][lis.port]
                      for lis in found if lis.target not in self.chorus and lis.port != self.ray_ports.get(pid)}
                for pid, found in self.listening.items()}


class ProbedJob:
    """`chorus train` of `spec` (a dict) into `out` on `hosts`, started at once."""

    def __init__(self, hosts, spec: dict, out: Path):
        self.hosts, self.name = hosts, spec["name"]
        path = out.parent / f"{out.name}.json"
        path.write_text(json.dumps(spec, allow_nan=False))
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train", str(path), "--out", str(out),
                                      "--address", hosts.gcs_address], env=hosts.env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def summary(self, timeout: float = 600) -> dict:
        """The job's summary once it ends; RuntimeError (with its stderr) if it failed or printed a
        traceback."""
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0 or "Traceback" in err:
            raise RuntimeError(f"the job exited {self.proc.returncode}: {err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def learners(self, count: int, timeout: float = 120) -> dict[int, int]:
        """Learner pid -> its host's index, once `count` learners run and their listeners stay put."""
        deadline, seen, steady_since = time.monotonic() + timeout, None, time.monotonic()
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"the job ended first: {self.proc.communicate()[1][-3000:]}")
            pids = {pid: h.index for h in self.hosts.hosts for pid in exposure.learner_pids(h.netns)}
            ports = sorted((pid, lis.port) for pid in pids for lis in exposure.listeners(pid)) \
                if len(pids) == count else None
            if ports != seen:
                seen, steady_since = ports, time.monotonic()
            elif ports and time.monotonic() - steady_since > STEADY_S:
                return pids
            time.sleep(0.5)
        raise RuntimeError(f"{count} learners with settled listeners did not appear: {seen}")

    def probe(self, learners: int) -> Probe:
        """Once `learners` run: strangers from a member's host and from their own, at once, against
        every port the learners listen on; then up to SETTLED_S for Chorus's listeners to hold what
        they held before. RuntimeError if the job ended before that."""
        hosts = self.hosts
        pids = self.learners(learners)
        listening = {pid: exposure.listeners(pid) for pid in pids}
        before = {pid: self._held(pid, listening[pid]) for pid in pids}
        targets = sorted({f"{hosts.hosts[pids[lis.pid]].address}:{lis.port}" if lis.wildcard else lis.target
                          for found in listening.values() for lis in found})
        started = time.monotonic()
        # from both places at once (and, meanwhile, which ports are Ray's and which Chorus's)
        with ThreadPoolExecutor(3) as pool:
            asked = pool.submit(exposure.worker_ports, hosts.gcs_address, hosts.env, f"{self.name}-")
            where = {"a member's host": 0, "a host of its own": len(hosts.hosts)}
            reports = pool.map(lambda index: self._attack(index, targets), where.values())
            ports, attacks = asked.result(), dict(zip(where, reports, strict=True))
        chorus = {lis.target for pid, found in listening.items() for lis in found
                  if lis.port in ports.get(pid, {}).get("chorus", ())}
        probe = Probe(listening, {pid: p["ray"] for pid, p in ports.items()}, attacks, before, {}, chorus=chorus)
        attacked = time.monotonic()
        probe.attack_s = attacked - started
        while not self._settled(probe) and time.monotonic() - attacked < SETTLED_S:
            time.sleep(0.2)
        if not self.running():
            raise RuntimeError("the job ended before the strangers were done: give it a longer budget")
        probe.settle_s, probe.settled = time.monotonic() - attacked, self._settled(probe)
        probe.after = {pid: self._held(pid, listening[pid]) for pid in pids}
        return probe

    @staticmethod
    def _held(pid: int, listening: list) -> tuple:
        return (exposure.rss_bytes(pid), {lis.port: len(exposure.connections(pid, lis.port)) for lis in listening},
                exposure.descriptors(pid))

    @staticmethod
    def _settled(probe: Probe) -> bool:
        return all(len(exposure.connections(pid, lis.port)) <= probe.before[pid][1][lis.port]
                   for pid, found in probe.listening.items() for lis in found if lis.target in probe.chorus)

    def _attack(self, index: int, targets: list[str]) -> dict:
        hosts = self.hosts
        proc = subprocess.run(hosts.command(index, [sys.executable, "-m", "orchestrator.testing.stranger", "--ray",
                                                   hosts.gcs_address, *targets]),
                              env={k: v for k, v in hosts.env.items() if not k.startswith("RAY_AUTH")},
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"the stranger failed: {proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
