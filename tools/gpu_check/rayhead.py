"""A Ray head on loopback in its own temp dir, started with `ray start --head` and stopped by the
PIDs of its processes (orchestrator.cluster.local_head.HeadNode's stop; never `ray stop`).

  python rayhead.py start TEMP_DIR --cpus 16 --gpus 1 [--object-store-mb 4000]  # prints the GCS address
  python rayhead.py stop TEMP_DIR PORT
  python rayhead.py logs TEMP_DIR DEST            # copies the session's *.out/*.err/*.log (<= 4 MB each)
  python rayhead.py reap SCRATCH                  # stops every process with RAY_TMPDIR=SCRATCH (run.sh's own)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def start(temp_dir: str, cpus: int, gpus: int, store_mb: int) -> int:
    from orchestrator.cluster.local_head import HEAD_MARK, free_ports

    gcs, client, agent, dash, metrics, autoscaler_metrics, dashboard_metrics = free_ports(7)
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address", "127.0.0.1",
               "--port", str(gcs), "--num-cpus", str(cpus), "--num-gpus", str(gpus),
               "--include-dashboard", "false", "--dashboard-port", str(dash), "--ray-client-server-port", str(client),
               "--dashboard-agent-listen-port", str(agent), "--metrics-export-port", str(metrics),
               "--object-store-memory", str(store_mb * 1024 * 1024), "--temp-dir", temp_dir,
               "--disable-usage-stats"]
    print(" ".join(command), file=sys.stderr, flush=True)
    # not Ray's default metrics ports (44217, 44227): a second head on this machine would find them taken
    env = {**os.environ, "AUTOSCALER_METRIC_PORT": str(autoscaler_metrics),
           "DASHBOARD_METRIC_PORT": str(dashboard_metrics), HEAD_MARK: temp_dir}  # how stop() finds them all
    proc = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    sys.stderr.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        stop(temp_dir, gcs)
        return proc.returncode
    print(f"127.0.0.1:{gcs}")
    return 0


def stop(temp_dir: str, port: int) -> int:
    from orchestrator.cluster.local_head import HeadNode

    head = HeadNode.__new__(HeadNode)  # only its pids() and stop(): what they read
    head.temp_dir, head.gcs_port, head.node_ip = Path(temp_dir), int(port), "127.0.0.1"  # where start() put it
    pids = head.pids()
    print(f"stopping {len(pids)} processes of the head in {temp_dir}", file=sys.stderr)
    logs(temp_dir, str(Path(temp_dir).with_name(Path(temp_dir).name + "-logs")))  # before stop() deletes them
    head.stop()
    return 0


def reap(scratch: str) -> int:
    """SIGTERM, then after 5 s SIGKILL, to every process run.sh started and left (all carry
    RAY_TMPDIR=<its scratch>: e.g. a Ray whose driver a step's time limit killed), but this process and
    its ancestors (run.sh itself)."""
    from orchestrator.cluster.local_head import processes_with_environment, stop_processes

    def left() -> list[int]:
        return processes_with_environment(f"RAY_TMPDIR={scratch}")

    if pids := left():
        print(f"reap: stopping {len(pids)} processes: {pids}", file=sys.stderr)
    stop_processes(left, term_wait=5.0, kill_wait=2.0)
    return 0


def logs(temp_dir: str, dest: str) -> int:
    src = Path(temp_dir) / "session_latest" / "logs"
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        return 1
    for path in src.rglob("*"):
        if path.is_file() and path.suffix in (".out", ".err", ".log") and path.stat().st_size <= 4 << 20:
            target = out / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "start":
        opts = dict(zip(args[2::2], args[3::2], strict=False))
        sys.exit(start(args[1], int(opts.get("--cpus", 16)), int(opts.get("--gpus", 0)),
                       int(opts.get("--object-store-mb", 4000))))
    if args[0] == "stop":
        sys.exit(stop(args[1], int(args[2])))
    if args[0] == "logs":
        sys.exit(logs(args[1], args[2]))
    if args[0] == "reap":
        sys.exit(reap(args[1]))
    sys.exit(f"unknown command {args[0]}")
