"""An outsider's probes of a job's listeners, for tests and benchmarks of what a job exposes: a
process that holds no Ray token and no job secret, run on a member's host or on a host of its own
(`hosts.Hosts.command`), against each `ip:port` it is given:

- `banner`: what the listener says first (Chorus's link listeners greet with their magic);
- `tcpstore`: c10d's TCPStore protocol, as torch's own client speaks it (connect and validate, then
  set, get, add and wait on the keys of a job's rendezvous and made-up ones);
- `garbage`: up to GARBAGE_BYTES of random bytes on one connection (how many were taken, and how it ended);
- `flood`: FLOOD connections at once, a few bytes each, then closed (how many were accepted).

And `ray`: a call to the cluster's GCS without the token. Prints one JSON object.

    python -m orchestrator.testing.stranger --ray 198.18.3.254:6379 198.18.3.1:41234 198.18.3.1:35111
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

GARBAGE_BYTES = 256 * 2**20
FLOOD = 500
CONNECT_S = 2.0  # a listener that drops a stranger's SYN answers nothing: a connect gives up after this
STALL_S = 2.0  # a send that moves no byte for this long: the listener stopped reading
TCPSTORE_S = 5.0  # how long torch's TCPStore client is given
JOB_KEYS = ["0//cpu//0/0", "0//cpu//0/1", "default_pg/0//cpu//0/0", "link-1", "init/", "made-up"]


def banner(host: str, port: int) -> dict:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S) as sock:
            sock.settimeout(0.5)
            try:
                first = sock.recv(64)
            except TimeoutError:
                first = b""
        return {"connected": True, "first_bytes": first[:8].hex(), "chorus": first.startswith(b"CHORUS\x01\x00")}
    except OSError as exc:
        return {"connected": False, "error": type(exc).__name__}


def tcpstore(host: str, port: int) -> dict:
    """What torch's TCPStore client achieves within TCPSTORE_S: each operation 'ok' (a key read or
    written) or its error ("no answer" when the listener kept it waiting: torch's client waits on a
    silent listener far past its timeout; it is left behind in a daemon thread)."""
    done: dict = {}
    worker = threading.Thread(target=_tcpstore, args=(host, port, done), daemon=True)
    worker.start()
    worker.join(TCPSTORE_S)
    return dict(done) if "client" in done else {"client": f"no answer within {TCPSTORE_S:g} s"}


def _tcpstore(host: str, port: int, done: dict) -> None:
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=2), wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - whatever the client says, it did not get in
        done["client"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return
    for key in JOB_KEYS:
        for op, call in (("set", lambda k: store.set(k, b"x")), ("get", store.get), ("add", lambda k: store.add(k, 1)),
                         ("wait", lambda k: store.wait([k], timedelta(seconds=1)))):
            try:
                call(key)
                done[f"{op} {key}"] = "ok"
            except Exception as exc:  # noqa: BLE001
                done[f"{op} {key}"] = type(exc).__name__
    done["client"] = "ok"


def garbage(host: str, port: int, nbytes: int = GARBAGE_BYTES) -> dict:
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_S)
    except OSError as exc:
        return {"connected": False, "sent": 0, "ended": type(exc).__name__, "received": 0}
    sent, chunk, ended = 0, os.urandom(2**20), "sent it all"
    sock.settimeout(STALL_S)
    try:
        while sent < nbytes:
            sent += sock.send(chunk[: nbytes - sent])
    except TimeoutError:
        ended = "stalled (the listener stopped reading)"
    except OSError as exc:
        ended = f"closed by the listener ({type(exc).__name__})"
    received = 0  # what the listener sent back meanwhile (a library's pair would have sent its data)
    try:
        sock.setblocking(False)
        while chunk := sock.recv(2**16):
            received += len(chunk)
    except OSError:
        pass
    finally:
        sock.close()
    return {"connected": True, "sent": sent, "ended": ended, "received": received}


async def _one(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_S)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(os.urandom(16))
        await asyncio.wait_for(writer.drain(), CONNECT_S)
    except (OSError, TimeoutError):
        pass
    writer.close()
    return True


def flood(host: str, port: int, count: int = FLOOD) -> dict:
    async def all_at_once():
        return await asyncio.gather(*[_one(host, port) for _ in range(count)])
    return {"connections": count, "accepted": sum(asyncio.run(all_at_once()))}


def ray_without_token(gcs: str) -> dict:
    """A GCS call with no token: what the cluster answers."""
    from ray._raylet import GcsClient

    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        nodes = GcsClient(address=gcs).get_all_node_info(timeout=5)
        return {"answered": True, "nodes": len(nodes)}
    except Exception as exc:  # noqa: BLE001
        return {"answered": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}


PROBES = {"banner": banner, "tcpstore": tcpstore, "garbage": garbage, "flood": flood}


def probe(target: str) -> dict:
    """Every probe of one listener: its banner first, then the others at once."""
    host, port = target.rsplit(":", 1)
    started = time.monotonic()
    result = {"banner": banner(host, int(port))}
    with ThreadPoolExecutor(len(PROBES)) as pool:
        done = {name: pool.submit(step, host, int(port)) for name, step in PROBES.items() if name != "banner"}
        result.update({name: future.result() for name, future in done.items()})
    return {**result, "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="ip:port of each listener")
    parser.add_argument("--ray", help="the cluster's GCS address, called without the token")
    args = parser.parse_args()
    with ThreadPoolExecutor(max_workers=max(1, len(args.targets))) as pool:  # every listener at once
        out = {"targets": dict(zip(args.targets, pool.map(probe, args.targets), strict=True))}
    if args.ray:
        out["ray"] = ray_without_token(args.ray)
    print(json.dumps(out, allow_nan=False), flush=True)
    os._exit(0)  # a TCPStore client left waiting in its thread would abort the interpreter's exit


if __name__ == "__main__":
    main()
