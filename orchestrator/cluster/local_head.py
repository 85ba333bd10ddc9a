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
HEAD_MARK = "CHORUS_HEAD_DIR"  # in the environment of every process a head starts: its temp dir (pids())


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free now. Every socket is held until all are chosen: two free_port()
    calls in a row can get the same port back from the kernel (a head's client server and its
    dashboard agent once did, and `ray start` refused them)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class HeadNode:
    """A real Ray head node of its own (temp dir, ports), stopped by PID.

    Args: cpus, token (turn token authentication on, with a fresh token in `token_file`),
    autoscaling (a cluster config's `available_node_types`, `head_node_type` and limits: the head
    then runs Ray's autoscaler with its `fake_multinode` provider, which launches and terminates
    real raylets on this machine as the cluster's demand asks; see `fake_cluster_config`),
    env (more environment for the head's processes, e.g. the autoscaler's settings),
    dashboard (run Ray's dashboard, which also serves the Jobs API and writes the Prometheus
    config; a head for the autoscaler alone does without its dozen processes), node_ip (the
    address the head listens and advertises on: loopback, or a bridge's for `testing.hosts`),
    system_config (Ray's `--system-config` besides metrics every second), object_store_bytes,
    temp_prefix (the name of its folder in /tmp begins so; whoever cleans up after a killed owner
    finds it by that)."""

    def __init__(self, cpus: int = 3, token: bool = True, autoscaling: dict | None = None, env: dict | None = None,
                 dashboard: bool = True, node_ip: str = "127.0.0.1", system_config: dict | None = None,
                 object_store_bytes: int | None = None, temp_prefix: str = "chorus-head-"):
        self.temp_dir = Path(tempfile.mkdtemp(prefix=temp_prefix, dir="/tmp"))  # short: Ray's socket paths
        self.token_file = self.temp_dir / "auth_token"
        self.env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "disabled",
                    HEAD_MARK: str(self.temp_dir), **(env or {})}
        if token:
            self.token_file.write_text(secrets.token_hex(16))
            self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file))
        self.dashboard_port, self.gcs_port, client_port, agent_port = free_ports(4)
        self.node_ip = node_ip
        self.address = f"http://{node_ip}:{self.dashboard_port}"
        self.gcs_address = f"{node_ip}:{self.gcs_port}"
        command = [str(BIN / "ray"), "start", "--head", "--node-ip-address", node_ip, "--port", str(self.gcs_port),
                   "--dashboard-host", node_ip, "--dashboard-port", str(self.dashboard_port),
                   "--include-dashboard", str(dashboard).lower(), "--ray-client-server-port", str(client_port),
                   # not Ray's default 52365: another Ray node on this machine may hold it, and a job
                   # agent that cannot listen takes no job ("No available agent to submit job")
                   "--dashboard-agent-listen-port", str(agent_port),
                   "--num-cpus", str(cpus), "--temp-dir", str(self.temp_dir), "--disable-usage-stats",
                   "--system-config", json.dumps({"metrics_report_interval_ms": 1000, **(system_config or {})},
                                                 allow_nan=False)]
        if object_store_bytes is not None:
            command += ["--object-store-memory", str(object_store_bytes)]
        if autoscaling is not None:
            config = fake_cluster_config(autoscaling, self.gcs_address)
            config_path = self.temp_dir / "autoscaling.json"
            config_path.write_text(json.dumps(config, allow_nan=False))
            command.append(f"--autoscaling-config={config_path}")
            self.env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        try:
            proc = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as exc:
            self.stop()
            raise RuntimeError(f"ray start --head did not finish in {exc.timeout:g} s") from None
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed:\n{proc.stdout}\n{proc.stderr}")

    @property
    def session_dir(self) -> Path:
        return (self.temp_dir / "session_latest").resolve()

    @staticmethod
    def _is_gcs(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/gcs_server")
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The head's processes: those started with its temp dir or its GCS address in their
        command line, or with its mark in their environment (`HEAD_MARK`: Ray Client's server names
        neither, and gives the GCS by the machine's own address, not the head's), and all their
        descendants (workers, job drivers)."""
        parent, cmdline, mark = {}, {}, f"{HEAD_MARK}={self.temp_dir}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
                cmdline[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except (OSError, ValueError):
                continue
        mine = ancestry(parent)  # this process and its ancestors are never the head's
        gcs = re.compile(rf"address=(?:[^\s\x00]*[=/])?{re.escape(self.node_ip)}:{self.gcs_port}(?![0-9])")
        found = {pid for pid, line in cmdline.items() if str(self.temp_dir) in line or gcs.search(line)
                 or _has_in_environment(pid, mark)} - mine
        grew = True
        while grew:
            children = {pid for pid, ppid in parent.items() if ppid in found} - found - mine
            found |= children
            grew = bool(children)
        return sorted(found)

    def stop(self) -> None:
        """SIGTERM to every process of the head but its GCS, then to the GCS, as `ray stop` orders
        them (a raylet whose GCS went first waits 10 s for it before it exits, and the GCS then
        waits for the raylet); SIGKILL to what is left of a wave after 10 s."""
        for wave in (lambda pid: not self._is_gcs(pid), lambda pid: True):
            stop_processes(lambda wave=wave: [pid for pid in self.pids() if wave(pid)])
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def stop_processes(find, term_wait: float = 10.0, kill_wait: float = 5.0) -> None:
    """SIGTERM to the processes `find()` names, then SIGKILL to what `find()` names after those are
    gone or `term_wait` seconds have passed (a zombie counts as gone); then `kill_wait` seconds more."""
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, kill_wait)):
        pids = find()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
            time.sleep(0.1)


def ancestry(parent: dict[int, int] | None = None) -> set[int]:
    """This process and its ancestors (`parent`: pid -> parent pid, read from /proc when not given)."""
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        if parent is not None:
            pid = parent.get(pid, 1)
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            break
    return mine


def processes_with_environment(entry: str) -> list[int]:
    """Live processes whose environment holds `entry` ("NAME=value"), but this one and its ancestors."""
    mine, found = ancestry(), []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid not in mine and _has_in_environment(pid, entry.encode()) and not _zombie(pid):
            found.append(pid)
    return found


FAKE_HEAD_TYPE = "ray.head.default"  # the fake provider's name for the head's node type


def fake_cluster_config(cluster: dict, gcs_address: str) -> dict:
    """A cluster config for Ray's `fake_multinode` provider from `cluster`'s node types and
    limits (`available_node_types`, `head_node_type`, `max_workers`, `idle_timeout_minutes`,
    `upscaling_speed`): the head's type is renamed to the provider's own, and every command and
    file mount is empty (the nodes are processes on this machine)."""
    types = {name: {"resources": dict(t.get("resources", {})), "node_config": {},
                    "min_workers": t.get("min_workers", 0), "max_workers": t.get("max_workers", 0),
                    **({"labels": dict(t["labels"])} if t.get("labels") else {})}
             for name, t in cluster["available_node_types"].items()}
    types[FAKE_HEAD_TYPE] = {**types.pop(cluster["head_node_type"]), "min_workers": 0, "max_workers": 0}
    return {"cluster_name": cluster.get("cluster_name", "chorus-fake"),
            "max_workers": cluster.get("max_workers", sum(t["max_workers"] for t in types.values())),
            "upscaling_speed": cluster.get("upscaling_speed", 1.0),
            "idle_timeout_minutes": cluster.get("idle_timeout_minutes", 0.1),
            "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "use_node_id_as_ip": True,
                         "disable_node_updaters": True, "disable_launch_config_check": True},
            "available_node_types": types, "head_node_type": FAKE_HEAD_TYPE, "auth": {}, "docker": {},
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}


def _has_in_environment(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
