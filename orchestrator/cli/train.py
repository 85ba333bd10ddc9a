"""`chorus train`, `sweep` and `eval`: a job or a sweep run from this process (its driver here), and
a checkpoint scored."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from orchestrator.base import strict_json
from orchestrator.cli.app import default_out, fail_on_spec_error, main, out_and_address, spec_file
from orchestrator.driver.config import load_spec


def format_eval(record: dict) -> str:
    parts = [f"epoch {record['epoch']:g}", f"step {record['step']}", f"wall {record['wall_s']:.1f}s",
             f"train_loss {record['train_loss']:.3f}"]
    if record.get("dev_wer") is not None:  # None: no dev utterance could be read
        parts += [f"dev_loss {record['dev_loss']:.3f}", f"dev_wer {record['dev_wer']:.2f}%"]
    return "  ".join(parts)


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a spec key, e.g. optim.lr=1e-3.")
@out_and_address
@click.option("--resume", is_flag=True, help="Continue from the newest usable checkpoint in OUT.")
@click.option("--overwrite", is_flag=True, help="Replace the run OUT holds (its checkpoints, curves and summary).")
@click.option("--staging", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="With --resume and a URI OUT: the folder a failed upload kept (the run's newest files), "
              "resumed from and uploaded.")
@fail_on_spec_error
def train(spec_path, overrides, out, address, resume, overwrite, staging):
    """Train the job SPEC (YAML); prints one line per evaluation and the summary JSON last."""
    spec = load_spec(spec_file(spec_path), list(overrides))  # a bad spec is refused before torch and Ray load
    if staging is not None and not (resume and out and "://" in out):
        raise click.ClickException(f"--staging {staging}: it continues a run at a URI from the folder a failed "
                                   "upload kept; pass it with --resume and that URI as --out")
    from orchestrator.checkpoint.files import CheckpointError
    from orchestrator.checkpoint.rundir import RunDirError
    from orchestrator.checkpoint.uris import StorageError
    from orchestrator.cluster.capacity import CapacityTimeout
    from orchestrator.cluster.resources import CapacityError
    from orchestrator.driver.elastic import LearnersCannotStart
    from orchestrator.driver.job import TrainingDiverged
    from orchestrator.groups.errors import GroupCannotForm

    job = _prepared_job(spec, out or default_out(spec_path, spec.name), address, resume, overwrite, staging)
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
    except (CheckpointError, RunDirError, StorageError, TrainingDiverged, GroupCannotForm, LearnersCannotStart) as exc:
        raise click.ClickException(str(exc)) from None
    except job.workload.input_error as exc:  # a learner's, through Ray: its message, not Ray's traceback
        raise click.ClickException(str(getattr(exc, "cause", exc))) from None
    click.echo(strict_json.dumps(summary))


def _prepared_job(spec, out, address, resume: bool, overwrite: bool, staging: Path | None = None):
    """The job, its data checked and its output claimed before Ray starts (a split with nothing
    usable, a folder or URI in use or holding a run are refused at once); then Ray, and the
    banner. What the job claimed is released if Ray fails to start (`job.run` releases it after)."""
    from orchestrator.checkpoint.rundir import RunDirError
    from orchestrator.checkpoint.uris import StorageError
    from orchestrator.cluster.runtime import runtime_for
    from orchestrator.driver.job import TrainingJob

    runtime = runtime_for(spec, distributed=spec.learners.max > 1 or address is not None)
    job = None
    try:
        job = TrainingJob(spec, out, report=lambda r: click.echo(format_eval(r)), resume=resume, runtime=runtime,
                          overwrite=overwrite, staging=staging)
        job.workload.check_data()
        job.claim()
    except (RunDirError, StorageError, job_input_errors(spec)) as exc:
        if job is not None:
            job.release()  # (its fresh staging folder)
        raise click.ClickException(str(exc)) from None
    if runtime.distributed:
        import ray

        try:
            context = ray.init(address=address, log_to_driver=False)
        except BaseException:
            job.release()  # the URI's lock with it: a retry need not wait out its lease
            raise
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
@out_and_address
@click.option("--resume", is_flag=True, help="Continue the interrupted sweep in OUT (Tune's experiment restore).")
@fail_on_spec_error
def sweep(sweep_path, overrides, out, address, resume):
    """Run the sweep SWEEP (YAML), every trial a distributed job; prints Tune's trial table while it
    runs and OUT/sweep_summary.json last."""
    import ray

    from search import SweepError, load_sweep, run_sweep

    spec = load_sweep(spec_file(sweep_path), list(overrides))
    if out is not None and "://" in out:
        from orchestrator.checkpoint.uris import redact

        raise click.ClickException(f"--out {redact(out)}: a sweep's output is a folder (shared storage for a cluster); "
                                   "URIs are for `chorus train`")
    out = Path(out) if out else default_out(sweep_path, spec.name)
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
    from orchestrator.checkpoint.files import CheckpointError, load
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
    trained_on = state["spec"]["data"].get("train")  # the words a lexicon decodes to, where the checkpoint has none
    trained_on = trained_on if trained_on and "://" not in str(trained_on) and Path(trained_on).exists() else str(data)
    data_section = state["spec"]["data"]  # batches and the longest utterance as the checkpoint was trained
    workload = cls(cls.Config.model_validate({**raw, "data": {"train": trained_on, **{
        key: data_section[key] for key in ("max_batch_seconds", "max_utterance_seconds") if key in data_section}}}))
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
