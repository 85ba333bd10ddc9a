"""The `chorus` command group (`main`) and what its commands share: reading SPEC (a file, or
`env:NAME` as `chorus submit` sends it), the default output folder, the --out and --address
options, and a spec error as one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from orchestrator.driver.config import SpecError


def fail_on_spec_error(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            raise click.ClickException(f"invalid spec: {exc}") from None
    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def spec_file(spec_path: Path) -> Path:
    """SPEC as a file: `env:NAME` is the spec's text in the environment variable NAME (how
    `chorus submit` sends it), written to a file of this process's own."""
    name = str(spec_path)
    if not name.startswith("env:"):
        return spec_path
    import atexit
    import os
    import shutil
    import tempfile

    text = os.environ.get(name[4:])
    if text is None:
        raise SpecError(f"{name}: the environment variable {name[4:]} is not set")
    folder = tempfile.mkdtemp(prefix="chorus-spec-")
    atexit.register(shutil.rmtree, folder, True)  # gone with this process (a sys.exit included)
    path = Path(folder) / "submitted-spec.yaml"
    path.write_text(text)
    return path


SUBMITTED_RUNS = "~/chorus-runs"  # a submitted job's default output: Ray deletes a job's working dir


def default_out(spec_path: Path, name: str) -> Path:
    """runs/<name>, or for a submitted job (its spec came in its environment) ~/chorus-runs/<name>
    on the node its driver runs on: not the job's working dir, which Ray deletes."""
    if str(spec_path).startswith("env:"):
        return Path(SUBMITTED_RUNS).expanduser() / name
    return Path("runs") / name


def out_and_address(fn):
    """The --out and --address options of `train` and `sweep`."""
    fn = click.option("--address", default=None, help="An existing Ray cluster (e.g. auto or HOST:6379) "
                      "[default: start one in this process].")(fn)
    return click.option("--out", default=None, help="Output folder, or (train) a URI such as s3://bucket/runs/x "
                        "[default: runs/<name in the spec>].")(fn)


@click.group()
def main():
    """Chorus: train speech recognizers across a Ray cluster."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
