"""The machine-wide side of `hosts.py`'s hosts: which subnet index a process holds (claims under a
file lock, so pytest-xdist workers can each have hosts), what a holder that died left and its
removal (`remnants`, `remove_leftovers`), and the `ip`/`tc` calls and rate units the hosts' links
are built and shaped with."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

CLAIMS = Path("/run/chorus-hosts") if Path("/run").is_dir() else Path(tempfile.gettempdir()) / "chorus-hosts"
INDICES = 256  # subnets 198.18.0.0/24 .. 198.18.255.0/24


class HostsUnavailable(RuntimeError):
    """This machine (or this user) cannot make hosts: the message says why."""


# -- claiming an index ------------------------------------------------------------------------------
def claim_index() -> int:
    """The first index no live process holds, after removing what dead holders left."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    with open(CLAIMS / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = set()
        for claim in CLAIMS.iterdir():
            if not claim.name.isdigit():
                continue
            try:
                owner = int(claim.read_text().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and alive(owner):
                held.add(int(claim.name))
            else:  # its holder died without closing (SIGKILL, a crash): remove what it left
                remove_leftovers(int(claim.name))
                claim.unlink(missing_ok=True)
        for k in range(INDICES):
            if k not in held:
                (CLAIMS / str(k)).write_text(str(os.getpid()))
                return k
    raise HostsUnavailable(f"all {INDICES} host subnets are claimed ({CLAIMS})")


def release_index(k: int) -> None:
    with contextlib.suppress(OSError):
        claim = CLAIMS / str(k)
        if claim.read_text().strip() == str(os.getpid()):
            claim.unlink()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def head_folder_prefix(k: int) -> str:
    """How the name of the folder in /tmp of index `k`'s Ray head begins."""
    return f"chorus-head-h{k}-"


def head_folders(k: int) -> list[Path]:
    return sorted(Path("/tmp").glob(f"{head_folder_prefix(k)}*"))


def remove_leftovers(k: int) -> None:
    """What a process that died holding index `k` left: its Ray processes (their command lines
    name the subnet), its head's folder in /tmp, then its network."""
    marker = f"198.18.{k}.".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
    for folder in head_folders(k):
        shutil.rmtree(folder, ignore_errors=True)
    remove_network(k)


def remnants(k: int) -> list[str]:
    """What is left of the hosts of index `k` (after `close`, nothing): processes whose command
    line names its subnet, its head's folder in /tmp, its namespaces, links and hosts files."""
    marker, left = f"198.18.{k}.".encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    left.append(f"process {entry.name}")
    left += [f"head folder {folder}" for folder in head_folders(k)]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    left += [f"namespace {n}" for n in listed if n.startswith(f"chorus{k}h")]
    left += [f"link {name}" for name in chorus_links() if name.startswith(f"chv{k}h") or name == f"chb{k}"]
    left += [f"hosts file of {p.name}" for p in Path("/etc/netns").glob(f"chorus{k}h*")]
    return left


def chorus_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2]


def remove_network(k: int) -> None:
    """Index `k`'s namespaces (with their `eth0`s), veths, bridge and hosts files, whatever exists."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in [n for n in listed if n.startswith(f"chorus{k}h")]:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:  # a namespace with processes in it outlives `ip netns del`
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
    for name in chorus_links():
        if name.startswith(f"chv{k}h") or name == f"chb{k}":
            subprocess.run(["ip", "link", "del", name], capture_output=True)


# -- iproute2 -----------------------------------------------------------------------------------------
def run_ip(*args: str) -> None:
    run_checked(["ip", *args])


def run_tc(*args: str) -> None:
    run_checked(["tc", *args])


def run_checked(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HostsUnavailable(f"{' '.join(command)}: {proc.stderr.strip() or proc.stdout.strip()}")


def qdisc_sent(where: list[str], device: str) -> int:
    out = subprocess.run(["tc", *where, "-s", "qdisc", "show", "dev", device], capture_output=True, text=True).stdout
    if " tbf " not in out:
        return 0
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["Sent"]:
            return int(words[1])
    return 0


UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def rate_bits(rate: str | int) -> int:
    """Bits per second from an int or tc's spelling ("100mbit", "1gbit")."""
    if isinstance(rate, int):
        return rate
    text = rate.strip().lower()
    for unit in sorted(UNITS, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * UNITS[unit])
    return int(text)


def size_bytes(size: str | int) -> int:
    if isinstance(size, int):
        return size
    text = size.strip().lower()
    for unit, factor in (("kb", 1024), ("mb", 2**20), ("b", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)
