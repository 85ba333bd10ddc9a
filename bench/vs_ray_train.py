"""Benchmark: Chorus `allreduce` against Ray Train's `TorchTrainer` (DDP), same model, data and
number of workers, measured in the same run.

Both train `jobs/configs/tiny.yaml`'s model (BiLSTM-CTC, ~1.1M parameters) on the same 2,000
synthesized utterances with the same workload code (`jobs.workload.AsrWorkload`: sharding, batches,
features, loss, AdamW step), 2 workers of one CPU (one torch thread) each, gloo, for the same
number of epochs. Ray Train wraps the model in DistributedDataParallel (`prepare_model`) and uses
`model.join()` for shards of unequal batch counts; Chorus averages size-weighted gradients with one
flat all-reduce per step. Both do the same bookkeeping: a resumable checkpoint (model and optimizer
state) after every epoch -- Chorus's job checkpoint, and in Ray Train rank 0's `ray.train.report`
with a checkpoint, as Ray Train's guide writes its loops.

Measured for each contender:
- start-up: seconds from the call that starts training (`TrainingJob.run()`, `TorchTrainer.fit()`)
  to the first completed optimizer step on any worker (placement, worker processes, process
  group, model and data set-up, first batch);
- steady samples/s: training utterances per second from the end of epoch 1 (every feature cache
  warm) to the end of the last epoch.

Every contender gets a fresh local Ray instance (`ray.init(num_cpus=2)`), so neither profits from
worker processes the other left; the order alternates between repeats and the medians are
compared. Targets: Chorus samples/s >= 1.0x Ray Train's; Chorus start-up <= 0.5x Ray Train's.
Writes `bench/results/vs_ray_train.json` and `vs_ray_train.png`.

Usage: .venv/bin/python bench/vs_ray_train.py [--epochs 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402

from jobs.synth import synthesize  # noqa: E402
from orchestrator.config import load_spec  # noqa: E402
from orchestrator.job import TrainingJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "vs_ray_train"
WORKERS = 2
TARGET_THROUGHPUT = 1.0  # Chorus samples/s over Ray Train's, at least
TARGET_STARTUP = 0.5  # Chorus start-up over Ray Train's, at most


def job_spec(corpus: Path, epochs: int):
    return load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
        f"data.train={corpus}/train.jsonl", "data.dev=null", "data.test=null", "data.test_unseen=null",
        f"budget.epochs={epochs}", "budget.wall_seconds=null", f"learners={WORKERS}", "group.kind=allreduce",
        "cpus_per_learner=1", "name=vs-ray-train"])


def steady_rate(marks: list[tuple[float, int]]) -> float:
    """Samples/s between the first and the last (time, cumulative samples) epoch-end mark."""
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (s1 - s0) / (t1 - t0)


def run_chorus(corpus: Path, epochs: int) -> dict:
    job = TrainingJob(job_spec(corpus, epochs), WORK / "chorus", overwrite=True)
    summary = job.run()
    marks = [(e["wall_s"], e["samples"]) for e in job.evals]
    return {"startup_s": summary["startup_s"], "samples_per_s": steady_rate(marks), "samples": summary["samples"],
            "epochs": len(job.evals), "wall_s": summary["wall_s"]}


def ray_train_loop(config: dict) -> None:
    """One Ray Train worker: the same workload as a Chorus learner, under DDP."""
    import tempfile
    import time
    from pathlib import Path

    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from jobs.sections import WorkloadConfig
    from jobs.workload import AsrWorkload

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(1)
    workload = AsrWorkload(WorkloadConfig.model_validate(config["workload"]), seed=config["seed"])
    model = ray.train.torch.prepare_model(workload.build_model())
    optimizer = workload.build_optimizer(model)
    epochs, step, samples, first_step_at, marks = config["epochs"], 0, 0, None, []
    for epoch in range(epochs):
        with model.join():  # shards may hold different numbers of batches
            for batch in workload.batches(rank, world, epoch):
                optimizer.zero_grad()
                workload.loss(model, batch).backward()
                workload.optimizer_step(model, optimizer, step, epoch / epochs)
                step, samples = step + 1, samples + batch.size
                first_step_at = first_step_at or time.time()
        total = torch.tensor([float(samples)])
        dist.all_reduce(total)
        marks.append((time.time(), int(total.item())))
        if epoch == 0:
            first = torch.tensor([first_step_at], dtype=torch.float64)
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
            first_step_at = float(first.item())
        # the same work as a Chorus job: a resumable checkpoint after every epoch (rank 0 writes it)
        metrics = {"epoch": epoch + 1, "first_step_at": first_step_at, "marks": marks, "steps": step}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                           Path(tmp, "checkpoint.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)


def run_ray_train(corpus: Path, epochs: int) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    spec = job_spec(corpus, epochs)
    workload = spec.workload_config.model_dump(mode="json")
    trainer = TorchTrainer(
        ray_train_loop, train_loop_config={"workload": workload, "seed": spec.seed, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=f"vs-chorus-{time.time_ns()}", storage_path=str(WORK / "ray_train")))
    started = time.time()
    result = trainer.fit()
    wall = time.time() - started
    m = result.metrics
    marks = [(t, s) for t, s in m["marks"]]
    return {"startup_s": round(m["first_step_at"] - started, 3), "samples_per_s": steady_rate(marks),
            "samples": marks[-1][1], "epochs": len(marks), "wall_s": round(wall, 2)}


def run_fresh(name: str, corpus: Path, epochs: int) -> dict:
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    try:
        result = (run_chorus if name == "chorus" else run_ray_train)(corpus, epochs)
    finally:
        ray.shutdown()
    print(f"[{name}] start-up {result['startup_s']:.2f} s, steady {result['samples_per_s']:.1f} samples/s, "
          f"{result['samples']} samples in {result['wall_s']:.1f} s", flush=True)
    return result


def plot(runs: dict, ratios: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    names = ["ray_train", "chorus"]
    labels = ["Ray Train\nTorchTrainer (DDP)", "Chorus\nallreduce"]
    for ax, key, unit, target in ((ax1, "startup_s", "start-up to first step (s)", TARGET_STARTUP),
                                  (ax2, "samples_per_s", "steady samples/s", TARGET_THROUGHPUT)):
        for x, name in enumerate(names):
            values = [r[key] for r in runs[name]]
            ax.bar(x, statistics.median(values), color=["tab:gray", "tab:blue"][x], alpha=0.8)
            ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
        ax.set_xticks([0, 1], labels)
        ratio = ratios["startup" if key == "startup_s" else "samples_per_s"]
        ax.set_title(f"{unit}\nChorus / Ray Train = {ratio:.2f} (target {'<=' if key == 'startup_s' else '>='}"
                     f" {target:g})", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Chorus allreduce vs Ray Train DDP: tiny.yaml model, {WORKERS} CPU workers (bars: median)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local instance
    RESULTS.mkdir(parents=True, exist_ok=True)
    corpus = WORK / "corpus-2000-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=2000, eval_utterances=20, seed=0, progress=False)
    runs: dict[str, list[dict]] = {"ray_train": [], "chorus": []}
    for repeat in range(args.repeats):
        order = ["ray_train", "chorus"] if repeat % 2 == 0 else ["chorus", "ray_train"]
        for name in order:
            runs[name].append(run_fresh(name, corpus, args.epochs))
    median = {name: {key: statistics.median(r[key] for r in rs) for key in ("startup_s", "samples_per_s")}
              for name, rs in runs.items()}
    ratios = {"startup": median["chorus"]["startup_s"] / median["ray_train"]["startup_s"],
              "samples_per_s": median["chorus"]["samples_per_s"] / median["ray_train"]["samples_per_s"]}
    passed = ratios["samples_per_s"] >= TARGET_THROUGHPUT and ratios["startup"] <= TARGET_STARTUP
    result = {"benchmark": "vs_ray_train", "workers": WORKERS, "epochs": args.epochs, "repeats": args.repeats,
              "targets": {"samples_per_s_ratio_min": TARGET_THROUGHPUT, "startup_ratio_max": TARGET_STARTUP},
              "median": median, "ratios": {k: round(v, 3) for k, v in ratios.items()}, "passed": passed,
              "runs": runs}
    (RESULTS / "vs_ray_train.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, ratios, RESULTS / "vs_ray_train.png")
    print(json.dumps({"ratios": result["ratios"], "median": median, "passed": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
