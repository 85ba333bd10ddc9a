"""Running a sweep: a Ray Tune experiment under `OUT/tune` whose trials are distributed jobs
(`search/trial.py`), resumable with Tune's experiment restore, and what it leaves behind:

- `OUT/results.csv`: one row per trial (its config, epochs trained, metric, learner-seconds,
  how often it was started: > 1 means paused and resumed from a checkpoint);
- `OUT/learning_curves.png`: every trial's metric per epoch, the rungs marked;
- `OUT/sweep_summary.json`: the best config and metric, the best trial's own job summary (with
  its `wer_test`), trials run, budget spent in learner-seconds.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.base import strict_json
from search.spec import SweepSpec

EXPERIMENT = "tune"  # OUT/tune: Tune's experiment folder


class SweepError(RuntimeError):
    """A sweep that cannot start or resume; the message says why."""


def _new_tuner(sweep: SweepSpec, fn, resources, out: Path, verbose: int, stop, reuse_actors: bool):
    """A Tuner with the sweep's search algorithm and scheduler, storing into `out`."""
    from ray import tune

    from search.gauges import SweepGauges
    from search.methods import build_method

    method = build_method(sweep, resources)
    return tune.Tuner(
        fn, param_space=method.param_space,
        tune_config=tune.TuneConfig(search_alg=method.search_alg, scheduler=method.scheduler,
                                    num_samples=sweep.trials, reuse_actors=reuse_actors),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=str(out), verbose=verbose, stop=stop,
                                  callbacks=[SweepGauges(sweep.name, sweep.metric, sweep.mode)],
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))


def run_sweep(sweep: SweepSpec, out: str | Path, resume: bool = False, trainable: Callable | None = None,
              resources: Callable[[int], object] | None = None, verbose: int = 1, stop=None,
              reuse_actors: bool = False) -> dict:
    """Run (or with `resume`, continue) `sweep` on the connected Ray cluster; returns the summary.

    Args:
        trainable, resources: the trial function and `resources(learners)` -> its
            PlacementGroupFactory; default: `search.trial.run_trial` and `trial_resources`
            (benchmarks pass cheap stand-ins and use the same searchers, schedulers and restore).
        stop: a Tune stopper (benchmarks stop at a target).
        reuse_actors: let Tune reuse trial actors (cheap stand-in trials only: a distributed
            trial's learners belong to its own placement group).
    """
    from ray import tune

    from orchestrator.cluster.resources import use_gpus
    from search.trial import run_trial, trial_resources, trial_scratch

    out = Path(out).resolve()
    experiment = out / EXPERIMENT
    if resources is None:
        gpus = use_gpus(sweep.job.get("accelerator", "auto"))
        resources = lambda n: trial_resources(sweep, n, gpus)  # noqa: E731
    first = resources(sweep.learners_for(0))
    _check_fits(first)
    fn = tune.with_resources(tune.with_parameters(trainable or run_trial, sweep_raw=sweep.model_dump(mode="json")),
                             first)
    started = time.time()
    if resume:
        if not tune.Tuner.can_restore(str(experiment)):
            raise SweepError(f"{experiment}: no sweep to resume there (run without --resume to start one)")
        tuner = tune.Tuner.restore(str(experiment), trainable=fn, resume_unfinished=True, resume_errored=True)
    else:
        if experiment.exists() and tune.Tuner.can_restore(str(experiment)):
            raise SweepError(f"{experiment}: a sweep was already run there; continue it with --resume, "
                             "or choose another --out")
        tuner = _new_tuner(sweep, fn, resources, out, verbose, stop, reuse_actors)
    grid = tuner.fit()
    for result in grid:  # the job folders of trials stopped while paused (those run on this node)
        shutil.rmtree(trial_scratch(Path(result.path).name), ignore_errors=True)
    return summarize(sweep, grid, out, time.time() - started)


def _check_fits(pgf) -> None:
    """Fail at once when not even one trial fits the cluster, even once its autoscaler (if any)
    has launched every node it may (instead of waiting)."""
    from orchestrator.cluster.resources import most_resources

    total = most_resources()
    need: dict[str, float] = {}
    for bundle in pgf.bundles:
        for key, value in bundle.items():
            need[key] = need.get(key, 0) + value
    short = {k: v for k, v in need.items() if total.get(k, 0) + 1e-9 < v}
    if short:
        raise SweepError(f"one trial needs {need} (a driver bundle and one per learner), but the cluster has only "
                         f"{ {k: total.get(k, 0) for k in short} }; lower learners, driver_cpus or cpus_per_learner")


def _rows(sweep: SweepSpec, grid) -> list[dict]:
    rows = []
    for result in grid:
        df = result.metrics_dataframe
        curve = [] if df is None or sweep.metric not in df else [
            (int(i), float(v), int(s)) for i, v, s in zip(df["training_iteration"], df[sweep.metric],
                                                          df.get("starts", [1] * len(df)), strict=True)]
        last = result.metrics or {}
        values = [v for _, v, _ in curve if not math.isnan(v)]
        rows.append({
            "trial": last.get("trial_id", Path(result.path).name),
            "outcome": "error" if result.error else "finished" if last.get("finished") else "stopped",
            "epochs": int(last.get("training_iteration", 0)),
            "metric_last": last.get(sweep.metric),
            "metric_best": (min(values) if sweep.mode == "min" else max(values)) if values else None,
            "learners_last": last.get("learners"),
            "learner_seconds": last.get("learner_seconds", 0.0),
            "starts": int(last.get("starts", 1)),
            "wer_test": last.get("wer_test"),
            "config": sweep.space.active(result.config or {}),
            "curve": curve,
            "checkpoint": result.checkpoint.path if result.checkpoint else None,
            "error": _last_line(result.error) if result.error else None,
        })
    return rows


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def summarize(sweep: SweepSpec, grid, out: Path, wall_s: float) -> dict:
    """Write results.csv, learning_curves.png and sweep_summary.json; returns the summary."""
    rows = _rows(sweep, grid)
    sign = 1 if sweep.mode == "min" else -1
    scored = [r for r in rows if r["metric_last"] is not None and not math.isnan(r["metric_last"])]
    finished = [r for r in scored if r["outcome"] == "finished"]
    best = min(finished or scored, key=lambda r: sign * r["metric_last"], default=None)
    job_summary = None
    if best and best["checkpoint"] and (Path(best["checkpoint"]) / "summary.json").is_file():
        job_summary = json.loads((Path(best["checkpoint"]) / "summary.json").read_text())
        job_summary["checkpoint"] = str(Path(best["checkpoint"]) / "checkpoint.pt")  # where it is kept
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    _write_csv(sweep, rows, out / "results.csv")
    plot_curves(sweep, rows, out / "learning_curves.png")
    summary = {
        "name": sweep.name, "method": sweep.method, "metric": sweep.metric, "mode": sweep.mode,
        "best_trial": best["trial"] if best else None,
        "best_config": best["config"] if best else None,
        "best_metric": best["metric_last"] if best else None,
        "best_job_summary": job_summary,
        "wer_test": job_summary.get("wer_test") if job_summary else None,
        "trials": len(rows), "trials_by_outcome": outcomes,
        "first_error": next(({"trial": r["trial"], "error": r["error"]} for r in rows if r["error"]), None),
        "trials_resumed": sum(1 for r in rows if r["starts"] > 1),
        "epochs_trained": sum(r["epochs"] for r in rows),
        "learner_seconds": round(sum(r["learner_seconds"] or 0.0 for r in rows), 1),
        "wall_s": round(wall_s, 1),
        "results_csv": str(out / "results.csv"), "curves_png": str(out / "learning_curves.png"),
        "experiment": str(out / EXPERIMENT),
    }
    (out / "sweep_summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
    return summary


def _write_csv(sweep: SweepSpec, rows: list[dict], path: Path) -> None:
    params = list(sweep.space.root)
    fields = ["trial", "outcome", "epochs", "metric_last", "metric_best", "learners_last", "learner_seconds",
              "starts", "wer_test"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields + params)
        for r in rows:
            writer.writerow([r[k] for k in fields] + [r["config"].get(p, "") for p in params])


def plot_curves(sweep: SweepSpec, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for rung in sweep.budget.rungs() if sweep.method != "random" else []:
        ax.axvline(rung, color="0.85", linestyle=":", zorder=0)
    for r in rows:
        if not r["curve"]:
            continue
        epochs, values, starts = zip(*r["curve"], strict=True)
        (line,) = ax.plot(epochs, values, marker=".", linewidth=1, label=f"{r['trial']} ({r['outcome']})")
        resumed = [(e, v) for k, (e, v, s) in enumerate(r["curve"]) if k > 0 and s > starts[k - 1]]
        if resumed:
            ax.scatter(*zip(*resumed, strict=True), marker="o", facecolors="none", edgecolors=line.get_color(), s=60)
    ax.set_xlabel(f"budget ({sweep.budget.unit}); dotted: rungs; circles: resumed from a checkpoint")
    ax.set_ylabel(sweep.metric)
    if sweep.metric.endswith("wer"):
        ax.set_ylim(0, 110)
    ax.set_title(f"{sweep.name}: {sweep.method}, {len(rows)} trials")
    if len(rows) <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
