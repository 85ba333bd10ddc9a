"""The `chorus` command: `synth` a corpus, `train` a job spec, `sweep` a sweep spec, `eval` a
checkpoint; `submit` a spec to a Ray cluster and follow it with `jobs`; `dashboards install`."""

from __future__ import annotations

import functools
import logging
import signal
import sys
from pathlib import Path

import click

from orchestrator import strict_json
from orchestrator.config import SpecError, load_spec


def _fail_on_spec_error(fn):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            raise click.ClickException(f"invalid spec: {exc}") from None
    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _spec_file(spec_path: Path) -> Path:
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


def _default_out(spec_path: Path, name: str) -> Path:
    """runs/<name>, or for a submitted job (its spec came in its environment) ~/chorus-runs/<name>
    on the node its driver runs on: not the job's working dir, which Ray deletes."""
    if str(spec_path).startswith("env:"):
        return Path(SUBMITTED_RUNS).expanduser() / name
    return Path("runs") / name


def _out_and_address(fn):
    """The --out and --address options of `train` and `sweep`."""
    fn = click.option("--address", default=None, help="An existing Ray cluster (e.g. auto or HOST:6379) "
                      "[default: start one in this process].")(fn)
    return click.option("--out", default=None, help="Output folder, or (train) a URI such as s3://bucket/runs/x "
                        "[default: runs/<name in the spec>].")(fn)


@click.group()
def main():
    """Chorus: train speech recognizers across a Ray cluster."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--utterances", default=2000, show_default=True, help="Training utterances.")
@click.option("--eval-utterances", type=int, default=None,
              help="Utterances in each of dev, test and test-unseen [default: max(20, utterances/10)].")
@click.option("--seed", default=0, show_default=True)
@click.option("--workers", type=int, default=None, help="Processes [default: CPU count].")
@click.option("--engines", type=click.Choice(["auto", "espeak", "espeak,festival", "espeak,festival,flite",
                                                 "espeak,festival,flite,world"]), default="auto", show_default=True,
              help="Speech engines: auto adds Festival (and test-unseen-engine) when its voices are installed; "
                   "flite's voices, and WORLD's conversions of them and Festival's, join training only when named.")
@click.option("--task", type=click.Choice(["commands", "openvocab"]), default="commands", show_default=True,
              help="commands: a 38-word vocabulary; openvocab: real English sentences (Debian's fortunes).")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=None,
              help="About this much training speech, instead of --utterances.")
@click.option("--oov-share", type=click.FloatRange(0, 0.5), default=0.02, show_default=True,
              help="openvocab: share of test words held out of training text.")
def synth(out, utterances, eval_utterances, seed, workers, engines, task, hours, oov_share):
    """Synthesize an offline multi-voice, multi-engine speech corpus into OUT."""
    from orchestrator.workload import workload_part

    synthesize = workload_part("asr", "synthesize")
    try:
        summary = synthesize(out, utterances=utterances, eval_utterances=eval_utterances, seed=seed, workers=workers,
                             engines=engines, task=task, hours=hours, oov_share=oov_share)
    except workload_part("asr", "synth_error") as exc:  # a voice or an engine is missing
        raise click.ClickException(str(exc)) from None
    click.echo(strict_json.dumps(summary))


@main.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The features folder: a corpus source for data.train/dev/test (`features.json` and shards).")
@click.option("--mel-bins", default=80, show_default=True, help="Filterbank channels (features.num_mel_bins).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Size of each shard file.")
def features(manifest, out, mel_bins, shard_mb):
    """Precompute the filterbanks of MANIFEST (a .jsonl manifest or a LibriSpeech-layout directory)
    into shards in OUT, which learners read instead of decoding audio."""
    from orchestrator.workload import workload_part

    write_shards = workload_part("asr", "features")
    click.echo(strict_json.dumps(write_shards(manifest, out, num_mel_bins=mel_bins, shard_mb=shard_mb)))


@main.command()
@click.argument("manifest", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, help="A folder or a URI pyarrow.fs opens (s3://bucket/path?endpoint_override=...).")
@click.option("--shard-mb", default=64.0, show_default=True, help="Audio bytes per shard.")
@click.option("--features", "mel_bins", type=click.IntRange(min=1), default=None,
              help="Also store each utterance's log-mel power of this many channels (features.num_mel_bins), "
                   "for learners with data.shard_features to read instead of decoding audio.")
def shards(manifest, out, shard_mb, mel_bins):
    """Pack MANIFEST's audio and transcripts into WebDataset-style tar shards at OUT (`shards.json`
    indexes them), for learners to stream."""
    from orchestrator.workload import workload_part

    try:
        click.echo(strict_json.dumps(workload_part("asr", "shards")(manifest, out, shard_mb=shard_mb,
                                                                    mel_bins=mel_bins)))
    except workload_part("asr", "input_error") as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("text", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The ARPA file to write.")
@click.option("--order", default=3, show_default=True, type=click.IntRange(1, 6), help="The n-gram order.")
def lm(text, out, order):
    """Estimate a word n-gram language model (interpolated Kneser-Ney) of TEXT (a .jsonl manifest's
    transcripts, or a text file of one sentence a line) into OUT, for `decoding.kind: lm`."""
    from orchestrator.workload import workload_part

    try:
        click.echo(strict_json.dumps(workload_part("asr", "lm")(text, out, order)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def format_eval(record: dict) -> str:
    parts = [f"epoch {record['epoch']:g}", f"step {record['step']}", f"wall {record['wall_s']:.1f}s",
             f"train_loss {record['train_loss']:.3f}"]
    if record.get("dev_wer") is not None:  # None: no dev utterance could be read
        parts += [f"dev_loss {record['dev_loss']:.3f}", f"dev_wer {record['dev_wer']:.2f}%"]
    return "  ".join(parts)


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a spec key, e.g. optim.lr=1e-3.")
@_out_and_address
@click.option("--resume", is_flag=True, help="Continue from the newest usable checkpoint in OUT.")
@click.option("--overwrite", is_flag=True, help="Replace the run OUT holds (its checkpoints, curves and summary).")
@_fail_on_spec_error
def train(spec_path, overrides, out, address, resume, overwrite):
    """Train the job SPEC (YAML); prints one line per evaluation and the summary JSON last."""
    from orchestrator.capacity import CapacityTimeout
    from orchestrator.checkpoint import CheckpointError
    from orchestrator.cluster import CapacityError
    from orchestrator.groups.errors import GroupCannotForm
    from orchestrator.job import TrainingDiverged
    from orchestrator.rundir import RunDirError
    from orchestrator.storage import StorageError

    spec = load_spec(_spec_file(spec_path), list(overrides))
    job = _prepared_job(spec, out or _default_out(spec_path, spec.name), address, resume, overwrite)
    received = []

    def on_signal(signum, frame):  # Ctrl-C, and SIGTERM from `chorus jobs stop` / `ray job stop`
        received.append(signum)
        job.interrupt()  # the job raises it again at its next turn, should this one be swallowed
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = job.run()
    except (CapacityError, CapacityTimeout) as exc:
        click.echo(f"chorus: {exc}; nothing of the job is left on the cluster", err=True)
        sys.exit(3)
    except KeyboardInterrupt:
        checkpoint, last = job.checkpoint_location(), job.evals[-1] if job.evals else None
        where = (f"the last checkpoint is {checkpoint} (epoch {last['epoch']:g}, step {last['step']}); "
                 "run the same command with --resume to continue" if last else "no checkpoint was written yet")
        what = "stopped (SIGTERM)" if received and received[-1] == signal.SIGTERM else "interrupted"
        click.echo(f"chorus: {what}, learners released; {where}", err=True)
        sys.exit(128 + (received[-1] if received else signal.SIGINT))
    except (CheckpointError, RunDirError, StorageError, TrainingDiverged, GroupCannotForm) as exc:
        raise click.ClickException(str(exc)) from None
    except job.workload.input_error as exc:  # a learner's, through Ray: its message, not Ray's traceback
        raise click.ClickException(str(getattr(exc, "cause", exc))) from None
    click.echo(strict_json.dumps(summary))


def _prepared_job(spec, out, address, resume: bool, overwrite: bool):
    """The job, its data checked and its output claimed before Ray starts (a split with nothing
    usable, a folder in use or holding a run are refused at once); then Ray, and the banner."""
    from orchestrator.job import TrainingJob
    from orchestrator.rundir import RunDirError
    from orchestrator.runtime import runtime_for
    from orchestrator.storage import StorageError

    runtime = runtime_for(spec, distributed=spec.learners.max > 1 or address is not None)
    try:
        job = TrainingJob(spec, out, report=lambda r: click.echo(format_eval(r)), resume=resume, runtime=runtime,
                          overwrite=overwrite)
        job.workload.check_data()
        job.claim()
    except (RunDirError, StorageError, job_input_errors(spec)) as exc:
        raise click.ClickException(str(exc)) from None
    if runtime.distributed:
        import ray

        context = ray.init(address=address, log_to_driver=False)
        url = getattr(context, "dashboard_url", None)
        click.echo(f"chorus: Ray dashboard at http://{url}" if url else "chorus: Ray dashboard not running")
    n = spec.learners
    learners = f"{n.max} learner{'s' if n.max > 1 else ''}" if n.fixed else f"{n.min} to {n.max} learners"
    group = f", {spec.group.kind}" if n.max > 1 else ""
    kind = getattr(getattr(spec.workload_config, "model", None), "kind", spec.workload)
    click.echo(f"chorus: training {spec.name} ({kind}, {learners}{group}) -> {job.storage.where}")
    return job


def job_input_errors(spec) -> type[Exception]:
    """The exception the spec's workload raises for data it cannot use."""
    from orchestrator.workload import workload_class

    return workload_class(spec.workload).input_error


@main.command()
@click.argument("sweep_path", metavar="SWEEP", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a sweep key, e.g. trials=12, space.optim.lr.high=0.02 or job.data.train=PATH.")
@_out_and_address
@click.option("--resume", is_flag=True, help="Continue the interrupted sweep in OUT (Tune's experiment restore).")
@_fail_on_spec_error
def sweep(sweep_path, overrides, out, address, resume):
    """Run the sweep SWEEP (YAML), every trial a distributed job; prints Tune's trial table while it
    runs and OUT/sweep_summary.json last."""
    import ray

    from search import SweepError, load_sweep, run_sweep

    spec = load_sweep(_spec_file(sweep_path), list(overrides))
    if out is not None and "://" in out:
        raise click.ClickException(f"--out {out}: a sweep's output is a folder (shared storage for a cluster); "
                                   "URIs are for `chorus train`")
    out = Path(out) if out else _default_out(sweep_path, spec.name)
    ray.init(address=address, log_to_driver=False)
    click.echo(f"chorus: sweep {spec.name} ({spec.method}, {spec.trials} trials of {spec.learners} learner"
               f"{'s' if spec.learners > 1 else ''}, up to {spec.budget.max} {spec.budget.unit}) -> {out}")
    try:
        summary = run_sweep(spec, out, resume=resume)
    except SweepError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo(f"chorus: sweep interrupted; run the same command with --resume to continue it from {out}",
                   err=True)
        sys.exit(130)
    click.echo(strict_json.dumps(summary))
    if summary["best_trial"] is None:
        error = summary["first_error"] or {}
        raise click.ClickException(f"no trial reported {spec.metric}; first error ({error.get('trial')}): "
                                   f"{error.get('error')}")


@main.command("eval")
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("data", type=click.Path(exists=True, path_type=Path))
@click.option("--no-warps", is_flag=True, help="One unwarped pass, whatever the checkpoint's decoding.warps says.")
@click.option("--decoding", "decoding_kind", type=click.Choice(["greedy", "lexicon", "lm"]), default=None,
              help="Decode so, whatever the checkpoint's decoding.kind says (lm: the model the checkpoint carries).")
def evaluate(checkpoint, data, no_warps, decoding_kind):
    """WER and CER of CHECKPOINT on DATA (a .jsonl manifest, a LibriSpeech-layout or features directory),
    decoded as the checkpoint's spec says. A run's checkpoint.pt means its newest usable checkpoint."""
    from orchestrator.checkpoint import CheckpointError, load
    from orchestrator.workload import workload_class

    try:  # checkpoint.pt: the run's newest usable checkpoint (a broken newer one is named on stderr)
        state = load(checkpoint).state
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from None
    cls = workload_class(state["spec"].get("workload", "asr"))
    raw = {k: state["spec"][k] for k in ("features", "model", "optim", "decoding") if k in state["spec"]}
    if no_warps and "decoding" in raw:
        raw["decoding"] = {**raw["decoding"], "warps": None}
    if decoding_kind is not None:
        raw["decoding"] = {**raw.get("decoding", {}), "kind": decoding_kind}
    workload = cls(cls.Config.model_validate({**raw, "data": {
        "train": str(data), "max_batch_seconds": state["spec"]["data"]["max_batch_seconds"]}}))
    model = workload.build_model()
    workload.load_state_dict(state, model)
    try:
        result = workload.evaluate(model, data)
    except workload.input_error as exc:  # e.g. warps asked of a features folder
        raise click.ClickException(str(exc)) from None
    if not result["utterances"]:
        raise click.ClickException(f"no usable utterances in {data}: {workload.corpus(data).skipped.describe()}")
    cer = f", CER {result['cer']:.2f}%" if result.get("cer") is not None else ""
    click.echo(f"{data}: WER {result['wer']:.2f}%{cer} over {result['utterances']} utterances "
               f"({result['skipped']} skipped)")
    click.echo(strict_json.dumps({"data": str(data), **result}))


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
        from orchestrator.submit import SubmitError

        try:
            return fn(*args, **kwargs)
        except SubmitError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def _address(fn):
    from orchestrator.submit import DEFAULT_ADDRESS

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
@_fail_on_spec_error
@_on_submit_error
def submit(spec_path, overrides, address, out, resume, working_dir, env, cpus, gpus, resources, follow):
    """Submit the job or sweep SPEC to a Ray cluster (Ray Jobs); prints its submission id."""
    from orchestrator.submit import Cluster

    cluster = Cluster(address)
    kind, name, job_id = cluster.submit(spec_path, list(overrides), out=out, resume=resume, working_dir=working_dir,
                                        env=_pairs(env, "--env"), cpus=cpus, gpus=gpus,
                                        resources=_pairs(resources, "--resource", float))
    click.echo(f"chorus: submitted {kind} {name} to {cluster.address}", err=True)
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

    from orchestrator.submit import Cluster

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
    from orchestrator.submit import Cluster

    info = Cluster(address).info(job_id)
    click.echo(f"{job_id}: {info.status.value}" + (f" ({info.message})" if info.message else ""))
    click.echo(strict_json.dumps({"submission_id": job_id, "status": info.status.value, "message": info.message,
                           "entrypoint": info.entrypoint, "metadata": info.metadata,
                           "start_time": info.start_time, "end_time": info.end_time}))


@_job_command("logs")
@click.option("--follow", is_flag=True, help="Keep printing until the job ends.")
def jobs_logs(job_id, address, follow):
    """The logs of job ID."""
    from orchestrator.submit import Cluster

    cluster = Cluster(address)
    if follow:
        _follow(cluster, job_id)
    click.echo(cluster.logs(job_id), nl=False)


@_job_command("stop")
def jobs_stop(job_id, address):
    """Stop job ID (its learners and placement groups go with its driver)."""
    from orchestrator.submit import Cluster

    stopped = Cluster(address).stop(job_id)
    click.echo(f"{job_id}: {'stopping' if stopped else 'had already ended'}")


@main.group()
def dashboards():
    """Chorus's Grafana dashboard."""


@dashboards.command("install")
@click.option("--session-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The Ray session folder of the head node [default: /tmp/ray/session_latest].")
def dashboards_install(session_dir):
    """Put dashboards/chorus.json where the Grafana provisioning Ray generated for the session loads it
    (run it on the head node after each `ray start --head`: Ray regenerates that folder)."""
    from orchestrator.dashboards import DEFAULT_SESSION, DashboardError, install

    session = (session_dir or DEFAULT_SESSION).resolve()
    try:
        path = install(session)
    except DashboardError as exc:
        raise click.ClickException(str(exc)) from None
    metrics = session / "metrics"
    click.echo(f"chorus: installed the Chorus dashboard as {path}\n"
               f"  Prometheus: prometheus --config.file={metrics}/prometheus/prometheus.yml\n"
               f"  Grafana:    grafana-server --homepath /usr/share/grafana "
               f"--config {metrics}/grafana/grafana.ini web\n"
               "  So that Ray's dashboard embeds Grafana's panels, start the head with both hosts set, e.g.\n"
               "    RAY_GRAFANA_HOST=http://127.0.0.1:3000 RAY_PROMETHEUS_HOST=http://127.0.0.1:9090 ray start --head\n"
               "  (the addresses at which the head node reaches Grafana and Prometheus).")


if __name__ == "__main__":
    main()
