"""`chorus submit` and `chorus jobs list|status|logs|stop`: jobs and sweeps on a Ray cluster through
its Jobs API (`submit.py`)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from orchestrator.base import strict_json
from orchestrator.cli.app import SUBMITTED_RUNS, fail_on_spec_error, main


def _pairs(values: tuple[str, ...], what: str, cast=str) -> dict:
    pairs = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: expected NAME=VALUE", param_hint=what)
        try:
            pairs[key] = cast(item)
        except ValueError:
            raise click.BadParameter(f"{value!r}: {item!r} is not a number", param_hint=what) from None
    return pairs


def _on_submit_error(fn):
    @functools.wraps(fn)  # keeps click's parameters too
    def wrapper(*args, **kwargs):
        from orchestrator.cli.submit import SubmitError

        try:
            return fn(*args, **kwargs)
        except SubmitError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def _address(fn):
    from orchestrator.cli.submit import DEFAULT_ADDRESS

    return click.option("--address", envvar="RAY_API_SERVER_ADDRESS", default=DEFAULT_ADDRESS, show_default=True,
                        help="The Ray dashboard of the cluster (env: RAY_API_SERVER_ADDRESS).")(fn)


def _follow(cluster, job_id: str) -> None:
    """Print the job's logs until it ends; exit 0 when it SUCCEEDED, 1 otherwise, 130 on Ctrl-C."""
    try:
        status = cluster.follow(job_id, lambda lines: click.echo(lines, nl=False))
    except KeyboardInterrupt:
        click.echo(f"chorus: stopped following; {job_id} goes on (`chorus jobs stop {job_id}` stops it)", err=True)
        sys.exit(130)
    click.echo(f"chorus: {job_id} {status}", err=True)
    sys.exit(0 if status == "SUCCEEDED" else 1)


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a spec key.")
@_address
@click.option("--out", default=None, help="Output folder on the cluster, e.g. on shared storage "
              f"[default: {SUBMITTED_RUNS}/<name> on the node the job's driver runs on].")
@click.option("--resume", is_flag=True, help="Continue the job (or sweep) whose output is in OUT from its checkpoint.")
@click.option("--working-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="The code uploaded as the job's working dir (SPEC travels on its own, from any folder) "
              "[default: this Chorus checkout].")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="An environment variable of the job.")
@click.option("--cpus", type=float, default=0.0, show_default=True,
              help="CPUs held by the job's driver (none by default: it must never keep its own learners from a slot).")
@click.option("--gpus", type=float, default=0.0, show_default=True, help="GPUs held by the job's driver.")
@click.option("--resource", "resources", multiple=True, metavar="NAME=AMOUNT",
              help="A custom resource the job's driver holds, e.g. head=1.")
@click.option("--follow", is_flag=True, help="Print the job's logs until it ends; exit 0 only if it SUCCEEDED.")
@fail_on_spec_error
@_on_submit_error
def submit(spec_path, overrides, address, out, resume, working_dir, env, cpus, gpus, resources, follow):
    """Submit the job or sweep SPEC to a Ray cluster (Ray Jobs); prints its submission id."""
    from orchestrator.cli.submit import Cluster

    cluster = Cluster(address)
    kind, name, job_id = cluster.submit(spec_path, list(overrides), out=out, resume=resume, working_dir=working_dir,
                                        env=_pairs(env, "--env"), cpus=cpus, gpus=gpus,
                                        resources=_pairs(resources, "--resource", float))
    click.echo(f"chorus: submitted {kind} {name} to {cluster.shown}", err=True)
    click.echo(job_id)
    if follow:
        _follow(cluster, job_id)


@main.group()
def jobs():
    """The jobs of a Ray cluster: list, status, logs, stop."""


@jobs.command("list")
@_address
@_on_submit_error
def jobs_list(address):
    """Every job of the cluster, oldest first."""
    import datetime

    from orchestrator.cli.submit import Cluster

    listed = Cluster(address).list()
    click.echo(f"{'SUBMISSION ID':44} {'STATUS':10} {'KIND':6} {'SPEC':16} STARTED")
    for job in listed:
        meta = job.metadata or {}
        started = datetime.datetime.fromtimestamp(job.start_time / 1000).isoformat(" ", "seconds") \
            if job.start_time else "-"
        click.echo(f"{job.submission_id or job.job_id or '-':44} {job.status.value:10} "
                   f"{meta.get('chorus_kind', '-'):6} {meta.get('chorus_spec', '-'):16} {started}")


def _job_command(name: str):
    """A `chorus jobs NAME ID` command: the job's id, the cluster's address, errors in one line."""
    def decorate(fn):
        return jobs.command(name)(click.argument("job_id", metavar="ID")(_address(_on_submit_error(fn))))
    return decorate


@_job_command("status")
def jobs_status(job_id, address):
    """The status of job ID (its message when it failed) and its metadata as JSON."""
    from orchestrator.checkpoint.uris import redact
    from orchestrator.cli.submit import Cluster

    info = Cluster(address).info(job_id)
    message = redact(info.message) if info.message else info.message  # (a URI --out may carry credentials)
    click.echo(f"{job_id}: {info.status.value}" + (f" ({message})" if message else ""))
    click.echo(strict_json.dumps({"submission_id": job_id, "status": info.status.value, "message": message,
                           "entrypoint": redact(info.entrypoint or ""), "metadata": info.metadata,
                           "start_time": info.start_time, "end_time": info.end_time}))


@_job_command("logs")
@click.option("--follow", is_flag=True, help="Keep printing until the job ends.")
def jobs_logs(job_id, address, follow):
    """The logs of job ID."""
    from orchestrator.cli.submit import Cluster

    cluster = Cluster(address)
    if follow:
        _follow(cluster, job_id)
    click.echo(cluster.logs(job_id), nl=False)


@_job_command("stop")
def jobs_stop(job_id, address):
    """Stop job ID (its learners and placement groups go with its driver)."""
    from orchestrator.cli.submit import Cluster

    stopped = Cluster(address).stop(job_id)
    click.echo(f"{job_id}: {'stopping' if stopped else 'had already ended'}")
