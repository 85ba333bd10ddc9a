"""A real Ray head node on this machine, for tests and benchmarks that need what
`ray.cluster_utils.Cluster` does not give: Ray's dashboard and Jobs API, its generated Prometheus
config, token authentication. Started with `ray start --head` on loopback in its own temp dir and
stopped by the PIDs of its processes (never `ray stop`, which would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent  # the venv's bin: on the head's PATH, so a job's `python` is this one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeadNode:
    """Args: cpus, token (turn token authentication on, with a fresh token in `token_file`)."""

    def __init__(self, cpus: int = 3, token: bool = True):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="chorus-head-", dir="/tmp"))  # short: Ray's socket paths
        self.token_file = self.temp_dir / "auth_token"
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "disabled"}
        if token:
            self.token_file.write_text(secrets.token_hex(16))
            self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file))
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.gcs_port = free_port()
        command = [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                   "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
                   "--include-dashboard", "true", "--ray-client-server-port", str(free_port()),
                   # not Ray's default 52365: another Ray node on this machine may hold it, and a job
                   # agent that cannot listen takes no job ("No available agent to submit job")
                   "--dashboard-agent-listen-port", str(free_port()),
                   "--num-cpus", str(cpus), "--temp-dir", str(self.temp_dir), "--disable-usage-stats",
                   "--system-config", json.dumps({"metrics_report_interval_ms": 1000}, allow_nan=False)]
        proc = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed:\n{proc.stdout}\n{proc.stderr}")

    @property
    def session_dir(self) -> Path:
        return (self.temp_dir / "session_latest").resolve()

    def pids(self) -> list[int]:
        """The head's processes: those started with its temp dir or its GCS address in their
        command line (a daemon of `ray start` that names no folder, such as Ray
        Client's server, has only the latter), and all their descendants (workers, job drivers)."""
        parent, cmdline = {}, {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
                cmdline[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except (OSError, ValueError):
                continue
        mine, pid = set(), os.getpid()  # this process and its ancestors are never the head's
        while pid > 1 and pid not in mine:
            mine.add(pid)
            pid = parent.get(pid, 1)
        gcs = re.compile(rf"address=[^\s\x00]*:{self.gcs_port}(?![0-9])")
        found = {pid for pid, line in cmdline.items() if str(self.temp_dir) in line or gcs.search(line)} - mine
        grew = True
        while grew:
            children = {pid for pid, ppid in parent.items() if ppid in found} - found - mine
            found |= children
            grew = bool(children)
        return sorted(found)

    def stop(self) -> None:
        """SIGTERM to every process of the head, SIGKILL to what is left after 10 s."""
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
                time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
