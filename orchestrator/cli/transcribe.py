"""Using a trained model: `chorus transcribe`, a checkpoint's model over audio files, folders and
manifests, here or spread over Ray actors (`orchestrator.service.batch_inference`), one JSON line
per utterance in the inputs' order and a last line of totals (a tqdm bar on stderr counts
utterances and audio hours per second; what the workload's `transcriber` cannot use is skipped
and counted by reason); and `chorus export`, the model as a folder that runs without Chorus (the
workload's `exporter`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import time
from collections import Counter
from pathlib import Path

import click

from orchestrator.base import strict_json
from orchestrator.cli.app import main

log = logging.getLogger("chorus.transcribe")
WINDOW, WINDOW_SECONDS = 2000, 3600.0  # utterances, and audio seconds, transcribed together here (their waveforms
# held at once: 230 MB an hour), batched by duration among themselves (as `chorus eval` batches a split), then
# written in order. On Ray, each actor call is `batch_inference.BATCH_RECORDS` utterances.


@main.command()
@click.argument("checkpoint", type=click.Path(exists=True, path_type=Path))
@click.argument("inputs", metavar="INPUT...", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The JSONL file to write [default: stdout].")
@click.option("--decoding", "decoding_kind", type=click.Choice(["greedy", "lexicon", "lm"]), default=None,
              help="Decode so, whatever the checkpoint's decoding.kind says.")
@click.option("--no-warps", is_flag=True, help="One unwarped pass, whatever the checkpoint's decoding.warps says.")
@click.option("--address", default=None, help="A Ray cluster (auto or HOST:6379) to spread the work over.")
@click.option("--actors", type=click.IntRange(min=1), default=None,
              help="Ray actors, each loading the model once [default with --address: 1; without it: none, "
                   "the work runs here; given without --address: on a Ray started in this process].")
@click.option("--gpus-per-actor", type=click.FloatRange(min=0), default=None,
              help="GPUs each actor reserves [default: 1 where the cluster has GPUs, else 0].")
@click.option("--cpus-per-actor", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
def transcribe(checkpoint, inputs, out, decoding_kind, no_warps, address, actors, gpus_per_actor, cpus_per_actor):
    """Transcribe INPUT... (audio files soundfile reads, folders of them, .jsonl manifests) with
    CHECKPOINT (a run's checkpoint.pt: its newest usable checkpoint). Prints (or writes to --out)
    one JSON line per utterance: id, path, duration, text and the input's reference if it has one;
    the last line holds the totals: utterances, audio hours, wall time (reading the inputs and
    starting Ray's actors included), real-time factor, skips by reason, WER."""
    state, transcriber = _checkpoint(checkpoint, "transcriber")
    options = {"decoding": decoding_kind, "warps": not no_warps}
    on_ray = actors is not None or address is not None
    try:
        local = transcriber.from_checkpoint(state, device="cpu" if on_ray else None,
                                            **options)  # (on a cluster: a check of the options only)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if on_ray:  # the actors start loading the model while the inputs are read (the actors probe the audio)
            pool = stack.enter_context(_pool(address, actors or 1, cpus_per_actor, gpus_per_actor,
                                             functools.partial(transcriber.from_checkpoint, **options), state))
        records, report = transcriber.read_inputs(list(inputs), state, probe=not on_ray)
        skipped, done = Counter(report.counts), []
        if records:
            results = _on_ray(pool, records) if on_ray else (r for window in _windows(records) for r in local(window))
            done, first = _write(results, len(records), out, skipped)
    if not done:  # (on Ray the actors probe the files: what they skip is known only now)
        if out is not None:
            out.unlink(missing_ok=True)
        raise click.ClickException(f"nothing to transcribe in {', '.join(map(str, inputs))}: "
                                   f"{dataclasses.replace(report, counts=skipped).describe()}")
    summary = {"totals": {**local.totals(done, dict(skipped), time.monotonic() - started),
                          "first_result_s": first - started if first is not None else None}}
    if out is not None:
        with open(out, "a") as f:
            f.write(strict_json.dumps(summary) + "\n")
    click.echo(strict_json.dumps(summary))


@main.command()
@click.argument("checkpoint", type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="The folder to write.")
def export(checkpoint, out):
    """Export CHECKPOINT's model (a run's checkpoint.pt: its newest usable checkpoint) into OUT: a
    TorchScript model with its filterbanks, its units, lexicon and language model, and a
    transcribe.py that runs it with torch and soundfile alone. Prints a summary JSON line."""
    state, part = _checkpoint(checkpoint, "exporter")
    try:
        click.echo(strict_json.dumps(part(state, out)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _checkpoint(path: Path, part: str):
    """The checkpoint at `path` (its state) and its workload's `part`; a ClickException saying why not."""
    from orchestrator.checkpoint.files import CheckpointError, load
    from orchestrator.workload import workload_part

    try:
        state = load(path).state
        return state, workload_part(state["spec"].get("workload", "asr"), part)
    except (CheckpointError, KeyError) as exc:
        raise click.ClickException(str(exc.args[0] if isinstance(exc, KeyError) else exc)) from None


def _windows(records: list[dict]):
    """`records` in runs of at most WINDOW utterances and WINDOW_SECONDS of audio (one at least)."""
    window, seconds = [], 0.0
    for record in records:
        if window and (len(window) == WINDOW or seconds + record["duration"] > WINDOW_SECONDS):
            yield window
            window, seconds = [], 0.0
        window.append(record)
        seconds += record["duration"]
    if window:
        yield window


@contextlib.contextmanager
def _pool(address: str | None, actors: int, cpus: float, gpus: float | None, make, state: dict):
    """An `OrderedPool` of `actors` on the cluster at `address` (none: one started here), each
    building `make(state)`; GPUs each: `gpus`, or 1 where the cluster has GPUs, else 0. Closed, and
    this process disconnected, on the way out."""
    import ray

    from orchestrator.service.batch_inference import OrderedPool

    gpus = _connect(address, actors, cpus, gpus)
    try:
        with OrderedPool(make, state, actors, gpus_per_actor=gpus, cpus_per_actor=cpus) as pool:
            yield pool
    finally:
        ray.shutdown()


def _connect(address: str | None, actors: int, cpus: float, gpus: float | None) -> float:
    """Connect to the cluster at `address` (none: start one here for `actors`); the GPUs each actor
    reserves (`gpus`, or 1 where the cluster has GPUs, else 0). A cluster not there is one line."""
    import ray

    host, _, port = (address or "").rpartition(":")
    if host and port.isdigit():  # Ray itself would wait for a GCS there without end
        import socket

        try:
            socket.create_connection((host.removeprefix("ray://"), int(port)), timeout=10).close()
        except OSError as exc:
            raise click.ClickException(f"--address {address}: no Ray cluster there ({exc})") from None
    try:
        here = {} if address else {"num_cpus": max(2, int(actors * cpus))}  # "local": never another `ray start`'s
        ray.init(address=address or "local", log_to_driver=False, **here)
    except Exception as exc:  # noqa: BLE001 - Ray's errors for an address with no cluster vary
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise click.ClickException(f"--address {address}: no Ray cluster to connect to ({line})") from None
    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    return gpus


def _on_ray(pool, records: list[dict]):
    """The pool's results for `records`; a pool that cannot go on (an actor that died more often
    than Ray restarts it, an error in the workload) is one line."""
    import ray

    try:
        yield from pool.map(records)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None) or exc  # a RayTaskError's: the workload's own exception
        line = (str(cause).strip().splitlines() or [""])[0]
        raise click.ClickException(f"the transcribing actors failed: {type(cause).__name__}: {line}") from None


def _write(results, total: int, out: Path | None, skipped: Counter) -> tuple[list[dict], float | None]:
    """Each result as a JSON line (to `out`, or stdout), the skipped ones counted into `skipped` instead; the
    transcribed ones, and when the first result came (after reading the inputs, a cluster's
    start-up and the first batch)."""
    from tqdm import tqdm

    done, seconds, first = [], 0.0, None
    sink = open(out, "w") if out is not None else sys.stdout  # noqa: SIM115 - stdout is not to be closed
    bar = tqdm(total=total, unit="utt", file=sys.stderr, dynamic_ncols=True)
    try:
        for result in results:
            first = first or time.monotonic()
            bar.update(1)
            if "skipped" in result:
                skipped[result["skipped"]] += 1
                log.warning("skipped %s: %s%s", result["path"], result["skipped"],
                            f" ({result['detail']})" if result.get("detail") else "")
                continue
            done.append(result)
            seconds += result["duration"]
            sink.write(strict_json.dumps(result) + "\n")
            bar.set_postfix_str(f"{seconds / 3600 / max(bar.format_dict['elapsed'], 1e-9):.4f} audio h/s",
                                refresh=False)
    finally:
        bar.close()
        if sink is not sys.stdout:
            sink.close()
    return done, first
