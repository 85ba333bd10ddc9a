"""Benchmark: Chorus `allreduce` against Ray Train's `TorchTrainer` (DDP), same model, data and
number of workers, measured in the same run on the shared harness (`bench/harness/`).

Two models, each compared on its own: `tiny.yaml`'s (BiLSTM-CTC, ~1.1M parameters) and a wider
one of ~10M parameters (`MODELS`: d_model 256, 2 layers of 520 LSTM units a direction, 64
subsampling channels), where the gradient traffic is ~40 MB a step. Both contenders train on the
same 2,000 synthesized utterances with the same workload code (`jobs.workload.AsrWorkload`:
sharding, batches of the same padded seconds, features, loss, AdamW step), 2 workers of one CPU
(one torch thread) each, gloo, for the same number of epochs. Ray Train (`harness.ray_train`) wraps
the model in DistributedDataParallel (`prepare_model`: bucketed all-reduces started during backward)
and takes the same number of steps on every rank (the fewest any shard has); Chorus averages
size-weighted gradients with one flat all-reduce per step (its default). Both do the same
bookkeeping: a resumable checkpoint (model and optimizer state) after every epoch -- Chorus's job
checkpoint, and in Ray Train rank 0's `ray.train.report` with a checkpoint, as Ray Train's guide
writes its loops.

Measured for each contender, in the same window:
- start-up: seconds from the call that starts training (`TrainingJob.run()`, `TorchTrainer.fit()`)
  to the first completed optimizer step on any worker (placement, worker processes, process
  group, model and data set-up, first batch);
- steady samples/s: training utterances per second from the end of epoch 1 (every feature cache
  warm) to the end of the last epoch.

Every run gets a fresh local Ray instance (`ray.init(num_cpus=2)`), so neither profits from worker
processes the other left; the contenders run interleaved (`harness.stats.interleaved`, order rotating),
5 repeats by default, summarised as median [IQR]. Each model's entry records the commit and the time
it was measured at; a run of some of the models (`--models 10m`) keeps the earlier file's entries for
the others, as they were measured. Targets (issue 19), for each model: Chorus
samples/s >= 1.10x Ray Train's with the two IQRs apart (`harness.stats.compare` says 'higher'); Chorus
start-up <= 0.5x Ray Train's. Writes `bench/results/vs_ray_train.json` and `vs_ray_train.png`.

Usage: .venv/bin/python bench/vs_ray_train.py [--models tiny,10m] [--epochs 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness import ray_train  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import compare, interleaved, summary  # noqa: E402

from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "vs_ray_train"
WORKERS = 2
TARGET_THROUGHPUT = 1.10  # Chorus samples/s over Ray Train's, at least, with the IQRs apart
TARGET_STARTUP = 0.5  # Chorus start-up over Ray Train's, at most
MODELS = {  # name -> overrides of tiny.yaml's model section
    "tiny": [],
    "10m": ["model.d_model=256", "model.hidden=520", "model.layers=2", "model.subsample_channels=64"],
}


def job_spec(corpus: Path, epochs: int, model: str):
    return load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [*MODELS[model],
        f"data.train={corpus}/train.jsonl", "data.dev=null", "data.test=null", "data.test_unseen=null",
        "data.test_unseen_engine=null",
        f"budget.epochs={epochs}", "budget.wall_seconds=null", f"learners={WORKERS}", "group.kind=allreduce",
        "cpus_per_learner=1", "name=vs-ray-train"])


def steady_rate(marks: list[tuple[float, int]]) -> float:
    """Samples/s between the first and the last (time, cumulative samples) epoch-end mark."""
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (s1 - s0) / (t1 - t0)


def run_chorus(corpus: Path, epochs: int, model: str) -> dict:
    job = TrainingJob(job_spec(corpus, epochs, model), WORK / "chorus", overwrite=True)
    summary = job.run()
    marks = [(e["wall_s"], e["samples"]) for e in job.evals]
    return {"startup_s": summary["startup_s"], "samples_per_s": steady_rate(marks), "samples": summary["samples"],
            "epochs": len(job.evals), "wall_s": summary["wall_s"]}


def run_ray_train(corpus: Path, epochs: int, model: str) -> dict:
    spec = job_spec(corpus, epochs, model)
    plan = ray_train.Plan(workload=spec.workload_config.model_dump(mode="json"), seed=spec.seed, epochs=epochs)
    m, started = ray_train.fit(plan, WORKERS, WORK / "ray_train", "vs-chorus")
    marks = [(t, s) for t, s in m["marks"]]
    return {"startup_s": round(m["first_step_at"] - started, 3), "samples_per_s": steady_rate(marks),
            "samples": marks[-1][1], "epochs": len(marks), "wall_s": round(time.time() - started, 2)}


def run_fresh(name: str, corpus: Path, epochs: int, model: str) -> dict:
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    try:
        result = (run_chorus if name == "chorus" else run_ray_train)(corpus, epochs, model)
    finally:
        ray.shutdown()
    print(f"[{model} {name}] start-up {result['startup_s']:.2f} s, steady {result['samples_per_s']:.1f} samples/s, "
          f"{result['samples']} samples in {result['wall_s']:.1f} s", flush=True)
    return result


def compare_on(model: str, corpus: Path, epochs: int, repeats: int) -> dict:
    """Both contenders on one model, interleaved: every run's figures, their summaries, the ratios
    and whether this model meets the targets."""
    runs: dict[str, list[dict]] = {"ray_train": [], "chorus": []}
    measured = {"commit": commit(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    def contender(name: str):
        def measure(_repeat: int) -> float:
            runs[name].append(run_fresh(name, corpus, epochs, model))
            return runs[name][-1]["samples_per_s"]
        return measure

    interleaved({name: contender(name) for name in runs}, repeats=repeats)
    stats = {name: {key: summary([r[key] for r in rs], 3) for key in ("startup_s", "samples_per_s")}
             for name, rs in runs.items()}
    throughput = compare(stats["chorus"]["samples_per_s"], stats["ray_train"]["samples_per_s"])
    startup = compare(stats["chorus"]["startup_s"], stats["ray_train"]["startup_s"])
    passed = (throughput["ratio"] >= TARGET_THROUGHPUT and throughput["verdict"] == "higher"
              and startup["ratio"] <= TARGET_STARTUP)
    from jobs.workload import AsrWorkload
    spec = job_spec(corpus, epochs, model)
    parameters = sum(p.numel() for p in AsrWorkload(spec.workload_config, seed=spec.seed).build_model().parameters())
    return {**measured, "parameters": parameters, "stats": stats, "samples_per_s": throughput, "startup": startup,
            "passed": passed, "runs": runs}


def plot(result: dict, path: Path) -> None:
    models = list(result["models"])
    fig, axes = plt.subplots(len(models), 2, figsize=(9, 3.6 * len(models)), squeeze=False)
    labels = ["Ray Train\nTorchTrainer (DDP)", "Chorus\nallreduce"]
    for row, model in zip(axes, models, strict=True):
        entry = result["models"][model]
        for ax, key, unit, target, sign in ((row[0], "startup_s", "start-up to first step (s)", TARGET_STARTUP, "<="),
                                            (row[1], "samples_per_s", "steady samples/s", TARGET_THROUGHPUT, ">=")):
            for x, name in enumerate(("ray_train", "chorus")):
                stat = entry["stats"][name][key]
                low, high = stat["iqr"]
                ax.bar(x, stat["median"], color=["tab:gray", "tab:blue"][x], alpha=0.8,
                       yerr=[[stat["median"] - low], [high - stat["median"]]], capsize=6)
                ax.scatter([x] * len(stat["runs"]), stat["runs"], color="black", s=10, zorder=3)
            ax.set_xticks([0, 1], labels)
            cmp = entry["startup" if key == "startup_s" else "samples_per_s"]
            ax.set_title(f"{model}: {unit}\nChorus / Ray Train = {cmp['ratio']:.3f} ({cmp['verdict']}; target "
                         f"{sign} {target:g})", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Chorus allreduce vs Ray Train DDP, {WORKERS} CPU workers (bars: median, whiskers: IQR, dots: runs)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def earlier_entries(path: Path, epochs: int, repeats: int) -> dict:
    """The models' entries of an earlier run at the same epochs and repeats (none when there is no
    such file), kept for the models this run does not measure; each says where it was measured, or
    'earlier run' if it predates that record."""
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text())
    if (earlier.get("epochs"), earlier.get("repeats")) != (epochs, repeats):
        return {}
    return {model: {"commit": "earlier run", **entry} for model, entry in earlier.get("models", {}).items()
            if model in MODELS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names from MODELS")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; known: {sorted(MODELS)}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local instance
    corpus = WORK / "corpus-2000-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=2000, eval_utterances=20, seed=0, progress=False)
    started = time.time()
    entries = {**earlier_entries(RESULTS / "vs_ray_train.json", args.epochs, args.repeats),
               **{model: compare_on(model, corpus, args.epochs, args.repeats) for model in models}}
    result = {"benchmark": "vs_ray_train", "workers": WORKERS, "epochs": args.epochs, "repeats": args.repeats,
              "model_overrides": {m: MODELS[m] for m in entries}, "wall_s": round(time.time() - started, 1),
              "targets": {"samples_per_s_ratio_min": TARGET_THROUGHPUT, "samples_per_s_iqrs_apart": True,
                          "startup_ratio_max": TARGET_STARTUP},
              "models": entries, "passed": all(e["passed"] for e in entries.values())}
    write_results(RESULTS / "vs_ray_train.json", result, plot)
    for model, e in entries.items():
        print(f"{model}: samples/s {e['samples_per_s']}, start-up {e['startup']}, passed {e['passed']}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
