"""Submitting job and sweep specs to a Ray cluster through Ray Jobs, and following them there.

`submit` validates the spec here (a bad spec never reaches the cluster), uploads the project as
the job's `runtime_env.working_dir` (what `.gitignore` excludes stays out; Ray leaves out `.git`
and `.venv` too), and runs `python -m orchestrator.cli train|sweep env:CHORUS_SPEC --set ...` as
the job's entrypoint (the cluster's `python`): the spec itself travels in the job's environment,
whatever folder it came from, and the `--set` overrides in its command line, where the
dashboard shows them. The spec's name and kind are job metadata. Every request
carries the cluster's token when one is found the way Ray finds it (`RAY_AUTH_TOKEN`, the file
named by `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`), with one warning on stderr when it would
go over plain `http://` to a host other than this one's loopback (`token_in_clear`); every
failure is a `SubmitError` whose message is one line that says what to do. Addresses are shown
redacted (`storage.redact`).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import shlex
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import yaml

from orchestrator.checkpoint.uris import redact

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
PROJECT = Path(__file__).resolve().parents[2]  # the checkout Chorus runs from (the default working_dir)
NO_TOKEN = ("the cluster at {address} requires a token (Ray token authentication) and none was found here: "
            "run `ray get-auth-token` on its head node and put what it prints in ~/.ray/auth_token, "
            "or set RAY_AUTH_TOKEN to it, or RAY_AUTH_TOKEN_PATH to a file that holds it")
WRONG_TOKEN = ("the cluster at {address} refused the token from {where}: it is not this cluster's token "
               "(`ray get-auth-token` on its head node prints the right one)")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class SubmitError(RuntimeError):
    """A submission or job request that failed; the message is one line that says why."""


def find_token() -> tuple[str | None, str]:
    """(the Ray token, where it came from) as Ray looks for it, whatever RAY_AUTH_MODE says here;
    (None, "") when there is none. A RAY_AUTH_TOKEN_PATH that names a missing or empty file is a
    SubmitError (Ray raises on it), before anything connects."""
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError

    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    try:
        if not loader.has_token(ignore_auth_mode=True):
            return None, ""
        token = loader.get_raw_token(ignore_auth_mode=True).strip()
    except (AuthenticationError, UnicodeDecodeError) as exc:  # (a file that is not UTF-8: Ray's decode fails)
        raise SubmitError(_bad_token_file(path) if path else f"no usable Ray token: {_first_line(exc)}") from None
    where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else path or "~/.ray/auth_token"
    if not token or not (token.isascii() and token.isprintable()):  # it goes into an HTTP header
        raise SubmitError(_bad_token_file(path) if where == path else f"{where} holds no token Ray can use")
    return token, where


def _bad_token_file(path: str) -> str:
    """One line on a RAY_AUTH_TOKEN_PATH that Ray cannot take a token from."""
    file = Path(path).expanduser()
    try:
        what = ("does not exist" if not file.exists() else "is not a file" if not file.is_file()
                else "is empty" if not file.read_bytes().strip() else "holds no token Ray can use")
    except OSError:
        what = "cannot be read"
    return (f"RAY_AUTH_TOKEN_PATH names {path}, which {what}: put the cluster's token there (`ray get-auth-token` "
            "on its head node prints it), or unset RAY_AUTH_TOKEN_PATH")


def token_in_clear(address: str, token: str | None) -> str | None:
    """The warning due when `token` would cross the network in clear: sent over plain `http://` to
    a host that is not this machine's loopback (None otherwise). An address without a scheme is
    Ray's to resolve (`auto`, `HOST:PORT` of the GCS) and is not judged here."""
    parts = urllib.parse.urlsplit(address)
    if not token or parts.scheme.lower() != "http" or _is_loopback(parts.hostname or ""):
        return None
    return (f"the Ray token goes to {redact(address)} over plain http://, readable by anyone on the way: use an "
            "https:// address (a TLS proxy before the dashboard) or an SSH tunnel to a loopback one "
            "(`ray dashboard cluster.yaml`)")


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


_WARNED: set[str] = set()  # the addresses warned about in this process (`token_in_clear`): once each


AGENT_WAIT_S = 60.0  # how long a submission waits for a just-started head's job agent


class Cluster:
    """The Ray Jobs API of one cluster. Args: address (the dashboard's, e.g. http://HEAD:8265).
    Nothing connects before the first request (`submit` checks its spec first)."""

    def __init__(self, address: str | None = None):
        self.address = address or DEFAULT_ADDRESS
        self.shown = redact(self.address)  # the address in messages
        self._token, self.token_from = find_token()
        warning = token_in_clear(self.address, self._token)
        if warning and self.address not in _WARNED:
            _WARNED.add(self.address)
            print(f"chorus: warning: {warning}", file=sys.stderr)

    @functools.cached_property
    def client(self):
        from ray.job_submission import JobSubmissionClient

        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        return self._call(lambda: JobSubmissionClient(self.address, headers=headers))

    def _call(self, fn, job_id: str | None = None):
        """fn(), with Ray's errors made into one-line SubmitErrors."""
        import requests
        from ray.exceptions import AuthenticationError

        try:
            return fn()
        except SubmitError:  # already one line (the client's own connection, made on first use)
            raise
        except AuthenticationError as exc:
            if "Authentication failed" in str(exc) and self.token_from:
                raise SubmitError(WRONG_TOKEN.format(address=self.shown, where=self.token_from)) from None
            raise SubmitError(NO_TOKEN.format(address=self.shown)) from None
        except (ConnectionError, requests.exceptions.ConnectionError):
            raise SubmitError(f"cannot reach Ray's dashboard at {self.shown}: is the cluster up, and is the "
                              "address its dashboard's (port 8265; `ray dashboard cluster.yaml` opens the "
                              "SSH tunnel to a launched cluster)?") from None
        except RuntimeError as exc:
            if job_id and "404" in str(exc):
                raise SubmitError(f"no job {job_id} on the cluster at {self.shown} "
                                  "(`chorus jobs list` shows its jobs)") from None
            if "exceeds the limit" in str(exc) or "too large" in str(exc).lower():
                raise SubmitError(f"the project is too large to upload: {_first_line(exc)}") from None
            raise SubmitError(f"{self.shown}: {_first_line(exc)}") from None
        except ValueError as exc:  # Ray's package size check
            raise SubmitError(f"cannot upload the working dir: {_first_line(exc)}") from None

    def submit(self, spec_path: Path, overrides: list[str], out: str | None = None, resume: bool = False,
               working_dir: Path | None = None, env: dict[str, str] | None = None, cpus: float = 0.0,
               gpus: float = 0.0, resources: dict[str, float] | None = None) -> tuple[str, str, str]:
        """Submit the job or sweep spec at `spec_path`, checked by `validate` before anything
        connects; returns (its kind, its name, the submission id)."""
        kind, name = validate(spec_path, overrides)
        root = (working_dir or PROJECT).resolve()
        env = {**(env or {}), SPEC_VARIABLE: spec_text(Path(spec_path))}  # the spec travels on its own
        command = ["python", "-m", "orchestrator.cli", {"job": "train", "sweep": "sweep"}[kind], f"env:{SPEC_VARIABLE}"]
        for override in overrides:
            command += ["--set", override]
        if out:
            command += ["--out", out]
        if resume:
            command += ["--resume"]
        submission_id = f"chorus-{kind}-{name}-{uuid.uuid4().hex[:8]}"
        logging.getLogger("ray").setLevel(logging.WARNING)  # not a line per ignored file
        logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)  # ".venv is ignored"
        def submit_job():
            return self.client.submit_job(
                entrypoint=shlex.join(command), submission_id=submission_id,
                runtime_env={"working_dir": str(root), "env_vars": env},
                metadata={"job_name": f"{name} ({kind})",  # the Name column of the dashboard's Jobs page
                          "chorus_kind": kind, "chorus_spec": name, "chorus_spec_file": str(spec_path)},
                entrypoint_num_cpus=cpus, entrypoint_num_gpus=gpus or None, entrypoint_resources=resources or None)

        deadline = time.monotonic() + AGENT_WAIT_S
        while True:  # a head that has just started has no job agent yet, and Ray says to try again
            try:
                return kind, name, self._call(submit_job)
            except SubmitError as exc:
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def list(self) -> list:
        return sorted(self._call(self.client.list_jobs), key=lambda j: j.start_time or 0)

    def info(self, job_id: str):
        return self._call(lambda: self.client.get_job_info(job_id), job_id)

    def logs(self, job_id: str) -> str:
        return self._call(lambda: self.client.get_job_logs(job_id), job_id)

    def stop(self, job_id: str) -> bool:
        return self._call(lambda: self.client.stop_job(job_id), job_id)

    def follow(self, job_id: str, write) -> str:
        """Write the job's log lines as they come until it ends; returns its final status."""
        self.info(job_id)  # an unknown id fails here, in one line

        async def tail():
            async for lines in self.client.tail_job_logs(job_id):
                write(lines)

        self._call(lambda: asyncio.run(tail()), job_id)
        return str(self.info(job_id).status.value)


SPEC_VARIABLE = "CHORUS_SPEC"  # the submitted spec's text, in the job's environment


def spec_text(spec_path: Path) -> str:
    """The spec as it travels with a submission: its own text, with a sweep's job given as a path
    (relative to the sweep's folder) put inline, so nothing else of the folder it came from is needed."""
    raw = yaml.safe_load(spec_path.read_text())
    if isinstance(raw, dict) and isinstance(raw.get("job"), str) and ("space" in raw or "method" in raw):
        job = Path(raw["job"])
        if not job.is_file() and (spec_path.parent / job).is_file():
            job = spec_path.parent / job
        raw["job"] = yaml.safe_load(job.read_text())
        return yaml.safe_dump(raw, sort_keys=False)
    return spec_path.read_text()


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return redact(lines[0]) if lines else type(exc).__name__


def validate(spec_path: Path, overrides: list[str]) -> tuple[str, str]:
    """(kind, name) of the spec at `spec_path` — "sweep" when it has a search space or method, else
    "job" — after validating it as `chorus train` or `chorus sweep` would (a SpecError otherwise),
    except that data paths are the cluster's: they need not exist here."""
    from orchestrator.driver.config import SpecError, load_spec

    path = Path(spec_path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not YAML: {exc}") from None
    if isinstance(raw, dict) and ("space" in raw or "method" in raw):
        from search import load_sweep

        return "sweep", load_sweep(path, list(overrides), check_paths=False).name
    return "job", load_spec(path, list(overrides), check_paths=False).name
