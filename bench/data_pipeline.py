"""Benchmark: the input pipeline on a corpus that does not fit in the feature cache.

A corpus of 20,000 training utterances from `chorus synth` (about 9 hours of audio, about 1 GB of
float32 filterbanks against a 64 MB cache), four measurements, one torch thread as a learner with
one CPU has:

1. Rates, interleaved, 5 repeats: the input pipeline's utterances/s (audio decode, filterbanks,
   padding: iterating a learner's batches with no model; reading the manifest at the start is not
   timed) from audio and from precomputed features (`chorus features`), against the model's
   consumption (tiny.yaml's BiLSTM training on batches already in memory). Target: pipeline from
   audio >= 3x the model.
2. Step time with and without prefetch, interleaved, 5 repeats: 30 training steps of tiny.yaml's
   model from a cold cache (every batch decoded), `data.prefetch_batches` 0 against 2.
3. A learner's memory over 3 epochs: `chorus train` of one learner (the small model of the tests,
   `data.cache_mb=64`, from audio) on a one-node Ray cluster, the resident set of the learner's
   process (a Ray actor) sampled every 0.5 s. Targets: flat after the first epoch (at most 32 MB
   above its end-of-epoch-1 value); within the cache's bound: the cache's share of the peak (the
   peak above the resident set when the learner was ready, before its first batch, less the same
   for the same job with `data.cache_mb=1`) at most cache_mb + 16 MB (16: twice the spread seen
   between two cache_mb=1 runs, 139.7 and 147.6 MB; what the learner holds besides the cache is
   the training step's working set, reported, not judged); and flat in the corpus's size: the
   same learner on the corpus's first 5,000 utterances, its peak at most 32 MB below the full
   corpus's (what grows with the corpus is only its manifest's records). Reported beside it, not
   judged: the same job in one process (no Ray: driver, learner and evaluator together).
4. The input pipeline's memory alone: a process that iterates one epoch of a learner's batches
   from audio with no model, its resident set after every 2,000 utterances (what the pipeline
   holds, apart from what training on the batches adds).

5. Worker processes (`data.workers`), `--only workers`: the conformer recipe's augmented input
   (its speed, noise, reverberation and VTLP draws and 24-bin filterbanks, 20 s batches, cache
   64 MB) prepared by 1 and 2 workers, interleaved, 5 repeats: utterances/s from the first batch
   handed over to the `--batches`-th (the workers' start is not timed). Target: 2 workers >= 1.7x
   1 worker, IQRs apart. Then 2 epochs with 2 workers, each worker's resident set at each
   epoch's end. Target: each worker grows at most 32 MB in its second epoch (its cache full
   within its bound in the first). Merged into the results as `workers`, with its commit.

Writes `bench/results/data_pipeline.json` (with `passed`) and `data_pipeline.png`.

Usage: .venv/bin/python bench/data_pipeline.py [--utterances 20000] [--repeats 5] [--only workers]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from harness.results import commit  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from jobs.data.feature_shards import is_features_folder, write_shards  # noqa: E402
from jobs.sections import WorkloadConfig  # noqa: E402
from jobs.synth.corpus import synthesize  # noqa: E402
from jobs.workload import AsrWorkload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "data_pipeline"
TINY_MODEL = {"subsample_channels": 32, "d_model": 144, "hidden": 160, "layers": 2}
SMALL_MODEL = {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1}
CACHE_MB, RATIO_TARGET, FLAT_MB, SHARE_SLACK_MB = 64, 3.0, 32, 16
NO_CACHE_MB = 1  # the cache_mb of the run that measures what the learner holds besides its cache
BATCH_SECONDS = 40  # tiny.yaml's
SMALL_CORPUS = 5_000  # utterances of the memory run on a quarter of the corpus


def corpus(utterances: int) -> tuple[Path, Path]:
    """The synthesized corpus and its train split's features folder (made once, kept in WORK)."""
    audio = WORK / f"corpus-{utterances}"
    if not (audio / "corpus.json").is_file():
        synthesize(audio, utterances=utterances, eval_utterances=20, seed=3, workers=2)
    features = WORK / f"features-{utterances}"
    if not is_features_folder(features):
        write_shards(audio / "train.jsonl", features)
    return audio, features


def workload(train: Path, prefetch: int = 0, model: dict = TINY_MODEL) -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": train, "max_batch_seconds": BATCH_SECONDS, "cache_mb": CACHE_MB,
                                            "prefetch_batches": prefetch}, model=model), seed=0)


def pipeline_rate(train: Path, batches: int) -> float:
    """Utterances/s of a learner's batches of epoch 0 (a shard of the whole corpus), cold cache;
    reading the manifest (a learner does it once, at its start) is not timed."""
    w = workload(train)
    len(w.train)
    start, n = time.perf_counter(), 0
    for i, batch in enumerate(w.batches(0, 1, 0)):
        n += batch.size
        if i + 1 == batches:
            break
    return n / (time.perf_counter() - start)


def train_steps(w: AsrWorkload, batches) -> tuple[float, int]:
    """Seconds and utterances of one training step per batch of `batches` (an iterable)."""
    model = w.build_model()
    model.train()
    optimizer = w.build_optimizer(model)
    start, n = time.perf_counter(), 0
    for step, batch in enumerate(batches):
        optimizer.zero_grad()
        w.loss(model, batch).backward()
        w.optimizer_step(model, optimizer, step, 0.0, 1.0)
        n += batch.size
    return time.perf_counter() - start, n


def rates(audio: Path, features: Path, repeats: int, batches: int) -> dict:
    w = workload(audio / "train.jsonl")
    kept = []
    for i, batch in enumerate(w.batches(0, 1, 0)):  # the model's batches, in memory before it is timed
        kept.append(batch)
        if i + 1 == batches:
            break
    runs = {"pipeline_from_audio": [], "pipeline_from_features": [], "model": []}
    for r in range(repeats):  # interleaved: each repeat measures every contender once
        runs["pipeline_from_audio"].append(pipeline_rate(audio / "train.jsonl", batches))
        runs["pipeline_from_features"].append(pipeline_rate(features, batches))
        seconds, n = train_steps(w, kept)
        runs["model"].append(n / seconds)
        print(f"rates, repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f} utt/s" for k, v in runs.items()), flush=True)
    return {k: summary(v) for k, v in runs.items()}


def step_times(audio: Path, repeats: int, steps: int) -> dict:
    runs = {"prefetch_0": [], "prefetch_2": []}
    for r in range(repeats):
        for prefetch in (0, 2):
            w = workload(audio / "train.jsonl", prefetch=prefetch)  # a cold cache: every batch decoded

            def first(n, batches):
                for i, batch in enumerate(batches):
                    yield batch
                    if i + 1 == n:
                        return

            shard = w.batches(0, 1, 0)
            seconds, _ = train_steps(w, first(steps, shard))
            runs[f"prefetch_{prefetch}"].append(seconds / steps)
        print(f"step time, repeat {r + 1}: " + ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in runs.items()),
              flush=True)
    return {k: summary(v) for k, v in runs.items()}


def learner_memory(audio: Path, epochs: int, utterances: int, address: str | None, train: Path | None = None,
                   cache_mb: float = CACHE_MB) -> dict:
    """RSS over `epochs` epochs of a one-learner `chorus train`, against its epochs: with `address`
    (a Ray cluster), of the learner's own process (a Ray actor; the evaluator and the driver are
    other processes); without, of the one process that is driver, learner and evaluator at once.
    `train`: a manifest of `utterances` of the corpus's training utterances (default: all of them)."""
    out = WORK / "memory-run"
    args = [sys.executable, "-m", "orchestrator.cli", "train", str(ROOT / "jobs" / "configs" / "tiny.yaml"),
            "--out", str(out), "--overwrite", "--set", f"data.train={train or audio / 'train.jsonl'}",
            "--set", f"data.dev={audio}/dev.jsonl", "--set", "data.test=null", "--set", "data.test_unseen=null",
            "--set", "data.test_unseen_engine=null",
            "--set", f"data.cache_mb={cache_mb}", "--set", f"budget.epochs={epochs}",
            "--set", "budget.wall_seconds=null", "--set", "budget.eval_every_seconds=20", "--set", "learners=1"]
    args += [a for key, value in SMALL_MODEL.items() for a in ("--set", f"model.{key}={value}")]
    args += ["--address", address] if address else []
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started, samples, pid = time.time(), [], None if address else proc.pid
    while proc.poll() is None:
        pid = pid or learner_pid()
        try:
            status = Path(f"/proc/{pid}/status").read_text() if pid else ""
            kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            samples.append((time.time() - started, kb / 1024))
        except (OSError, StopIteration):
            pass
        time.sleep(0.5 if samples else 0.05)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"the memory run failed:\n{output[-3000:]}")
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    # the learner ready (model and optimizer built, no batch read yet): its join event. (Until
    # 2026-11-24 this was the process's start plus the summary's startup_s, which counts from the
    # job's start, after the imports: a point before the model was built, ~140 MB too early.)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    train_start = next(e["time"] for e in events if e["kind"] == "join")
    # epoch at each sample: the evaluations' (wall since the training loop began, samples / epoch's
    # utterances), interpolated (their `epoch` counts whole epochs only)
    points = [(0.0, 0.0)] + [(e["wall_s"], e["samples"] / utterances) for e in evals]
    offset = train_start - started

    def epoch_at(t: float) -> float:
        t -= offset
        for (t0, e0), (t1, e1) in zip(points, points[1:], strict=False):
            if t <= t1:
                return e0 + (e1 - e0) * max(0.0, t - t0) / max(t1 - t0, 1e-9)
        return points[-1][1]

    end = offset + points[-1][0]  # the training loop's last evaluation: what follows is the job's end, not an epoch
    series = [(t, epoch_at(t), mb) for t, mb in samples if t <= end]
    before = max((mb for t, e, mb in series if t <= offset), default=series[0][2])
    after_1 = [mb for _, e, mb in series if e <= 1.0]
    later = [mb for _, e, mb in series if e > 1.0]
    return {"epochs": epochs, "cache_mb": cache_mb, "rss_before_first_batch_mb": round(before, 1),
            "rss_end_of_epoch_1_mb": round(after_1[-1], 1), "rss_peak_after_epoch_1_mb": round(max(later), 1),
            "rss_peak_mb": round(max(mb for *_, mb in series), 1),
            "growth_after_epoch_1_mb": round(max(later) - after_1[-1], 1),
            "peak_above_start_mb": round(max(mb for *_, mb in series) - before, 1),
            "series": [(round(t, 1), round(e, 3), round(mb, 1)) for t, e, mb in series]}


def subset(audio: Path, utterances: int) -> Path:
    """A training manifest of the corpus's first `utterances` training utterances."""
    path = audio / f"train-first-{utterances}.jsonl"  # beside train.jsonl: its audio paths are relative
    lines = (audio / "train.jsonl").read_text().splitlines(keepends=True)[:utterances]
    path.write_text("".join(lines))
    return path


def learner_pid() -> int | None:
    """The process of this machine's Chorus learner actor (Ray titles it `ray::_LearnerProcess...`)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::_LearnerProcess"):
                return int(proc.name)
        except OSError:
            continue
    return None


PIPELINE_ONLY = """
import json, sys, torch
sys.path.insert(0, "bench")
import data_pipeline as dp
torch.set_num_threads(1)
def rss():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS"))) / 1024
w = dp.workload(sys.argv[1])
len(w.train)
points, n, mark = [(0, rss())], 0, 2000
for batch in w.batches(0, 1, 0):
    n += batch.size
    if n >= mark:
        points.append((n, rss()))
        mark += 2000
print(json.dumps({"points": points, "cache_mb": w.cache.nbytes / 2**20}))
"""


def pipeline_memory(audio: Path) -> dict:
    """RSS (MB) of a process iterating one epoch of batches from audio, no model, by utterances."""
    done = subprocess.run([sys.executable, "-c", PIPELINE_ONLY, str(audio / "train.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    points = [(n, round(mb, 1)) for n, mb in result["points"]]
    return {"rss_by_utterances": points, "cache_mb_at_end": round(result["cache_mb"], 1),
            "growth_after_first_2000_mb": round(points[-1][1] - points[1][1], 1)}


WORKERS_RATIO = 1.7


def conformer_input(train: Path, workers: int) -> AsrWorkload:
    """conformer.yaml's training input (features, augmentation, batches) from `train`."""
    recipe = yaml.safe_load((ROOT / "jobs" / "configs" / "conformer.yaml").read_text())
    data = {"train": train, "max_batch_seconds": recipe["data"]["max_batch_seconds"], "cache_mb": CACHE_MB,
            "workers": workers}
    return AsrWorkload(WorkloadConfig(data=data, features=recipe["features"], augment=recipe["augment"]), seed=0)


def worker_pids() -> list[int]:
    """This process's children: the DataLoader's workers."""
    me = str(os.getpid())
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and _read(p / "stat").rpartition(")")[2].split()[1:2] == [me]]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def rss_mb(pid: int) -> float:
    line = next((x for x in _read(Path(f"/proc/{pid}/status")).splitlines() if x.startswith("VmRSS")), "VmRSS: 0 kB")
    return int(line.split()[1]) / 1024


def input_rate(train: Path, workers: int, batches: int) -> float:
    w = conformer_input(train, workers)
    stream = iter(w.batches(0, 1, 0))
    next(stream)  # the workers are up and prepared their first batches
    start, n = time.perf_counter(), 0
    for i, batch in enumerate(stream):
        n += batch.size
        if i + 1 == batches:
            break
    rate = n / (time.perf_counter() - start)
    del stream, w
    gc.collect()  # the DataLoader's workers end with it
    return rate


def worker_section(audio: Path, repeats: int, batches: int) -> dict:
    runs = {"workers_1": [], "workers_2": []}
    for r in range(repeats):
        for name in (runs if r % 2 == 0 else reversed(list(runs))):  # interleaved, the order alternating
            runs[name].append(input_rate(audio / "train.jsonl", int(name[-1]), batches))
        print(f"workers, repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f} utt/s" for k, v in runs.items()), flush=True)
    stats = {k: summary(v) for k, v in runs.items()}
    w = conformer_input(audio / "train.jsonl", 2)
    by_epoch = []
    for epoch in range(2):
        for _ in w.batches(0, 1, epoch):
            pass
        by_epoch.append({pid: round(rss_mb(pid), 1) for pid in worker_pids()})
    growth = max(by_epoch[1][pid] - by_epoch[0].get(pid, 0.0) for pid in by_epoch[1])
    ratio = stats["workers_2"]["median"] / stats["workers_1"]["median"]
    apart = stats["workers_2"]["iqr"][0] > stats["workers_1"]["iqr"][1]
    return {"corpus": str(audio.relative_to(ROOT) if audio.is_relative_to(ROOT) else audio),
            "utterances": len(w.train), "rates_utt_per_s": stats, "ratio_2_to_1": round(ratio, 3), "iqrs_apart": apart,
            "worker_rss_mb_by_epoch": [list(e.values()) for e in by_epoch],
            "worker_growth_epoch_2_mb": round(growth, 1),
            "cache_mb": CACHE_MB, "batches": batches, "repeats": repeats, "commit": commit(),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "targets": {"ratio_2_to_1": f">= {WORKERS_RATIO}, IQRs apart", "worker_growth_epoch_2_mb": f"<= {FLAT_MB}"},
            "passed": ratio >= WORKERS_RATIO and apart and growth <= FLAT_MB}


def summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(q[1], 4), "iqr": [round(q[0], 4), round(q[2], 4)], "runs": [round(v, 4) for v in values]}


def plot(result: dict, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    rates = {**result["rates"], **{f"conformer_input_{k}": v for k, v in
                                   result.get("workers", {}).get("rates_utt_per_s", {}).items()}}
    names = list(rates)
    medians = [rates[k]["median"] for k in names]
    errors = [[m - rates[k]["iqr"][0] for k, m in zip(names, medians, strict=True)],
              [rates[k]["iqr"][1] - m for k, m in zip(names, medians, strict=True)]]
    left.bar([n.replace("_", "\n") for n in names], medians, yerr=errors,
             color=["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860"][:len(names)])
    left.tick_params(axis="x", labelsize=7)
    workers = f"; 2 workers / 1: {result['workers']['ratio_2_to_1']:.2f}x" if "workers" in result else ""
    left.set(ylabel="utterances/s (median, IQR)", yscale="log",
             title=f"pipeline vs model: {result['ratio_audio_to_model']:.1f}x from audio{workers}")
    memory = result["memory"]
    left.grid(True, axis="y", alpha=0.3)
    epochs = [e for _, e, _ in memory["series"]]
    right.plot(epochs, [mb for *_, mb in memory["series"]], lw=1,
               label="the learner's process (Ray actor; chorus train, small model)")
    if "pipeline_memory" in result:
        points = result["pipeline_memory"]["rss_by_utterances"]
        right.plot([n / result["utterances"] for n, _ in points], [mb for _, mb in points], lw=1, marker=".",
                   color="tab:purple", label="input pipeline alone (no model), one epoch")
    if "memory_small_corpus" in result:
        small = result["memory_small_corpus"]
        right.plot([e for _, e, _ in small["series"]], [mb for *_, mb in small["series"]], lw=1, color="tab:orange",
                   label=f"the same learner, first {small['utterances']:,} utterances only")
    if "memory_no_cache" in result:
        bare = result["memory_no_cache"]["series"]
        right.plot([e for _, e, _ in bare], [mb for *_, mb in bare], lw=1, color="tab:green",
                   label=f"the same learner, cache_mb={NO_CACHE_MB}")
    if "memory_in_one_process" in result:
        alone = result["memory_in_one_process"]["series"]
        right.plot([e for _, e, _ in alone], [mb for *_, mb in alone], lw=1, color="grey",
                   label="the same job in one process (driver, learner, evaluator)")
    bound = memory["rss_before_first_batch_mb"] + CACHE_MB + SHARE_SLACK_MB
    if "memory_no_cache" in result:
        bound += result["memory_no_cache"]["peak_above_start_mb"]
    right.axhline(bound, color="red", ls="--", lw=1,
                  label=f"ready + cache_mb={NO_CACHE_MB}'s peak above its ready + {CACHE_MB} + {SHARE_SLACK_MB}: "
                        "the bound")
    right.set(xlabel="epoch", ylabel="learner RSS (MB)",
              title=f"one learner, {result['utterances']} utterances, cache_mb={CACHE_MB}")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=60, help="batches per rate measurement")
    parser.add_argument("--steps", type=int, default=30, help="steps per step-time measurement")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the memory run")
    parser.add_argument("--only", choices=["workers"], help="run one section, merged into the results")
    parser.add_argument("--workers-corpus", type=Path, help="the corpus of the workers section (default: the bench's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if args.only == "workers":
        workers = worker_section(args.workers_corpus or corpus(args.utterances)[0], args.repeats, args.batches)
        path = RESULTS / "data_pipeline.json"
        result = {**json.loads(path.read_text()), "workers": workers}
        result["passed"] = bool(result["passed"] and workers["passed"])
        path.write_text(json.dumps(result, indent=2) + "\n")
        plot(result, RESULTS / "data_pipeline.png")
        print(json.dumps(workers, indent=2))
        return
    audio, features = corpus(args.utterances)
    index = json.loads((features / "features.json").read_text())
    result = {"utterances": len(index["utterances"]),
              "hours": round(sum(r["duration"] for r in index["utterances"]) / 3600, 2),
              "features_mb_float32": round(sum(r["frames"] for r in index["utterances"]) * 80 * 4 / 2**20),
              "torch_threads": 1, "batch_seconds": BATCH_SECONDS, "repeats": args.repeats,
              "rates": rates(audio, features, args.repeats, args.batches),
              "step_seconds": step_times(audio, args.repeats, args.steps)}
    result["ratio_audio_to_model"] = round(result["rates"]["pipeline_from_audio"]["median"]
                                           / result["rates"]["model"]["median"], 2)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        result["memory"] = memory = learner_memory(audio, args.epochs, result["utterances"], cluster.address)
        # the same learner on a quarter of the corpus: what its memory owes to the corpus's size
        small = subset(audio, SMALL_CORPUS)
        result["memory_small_corpus"] = learner_memory(audio, args.epochs, SMALL_CORPUS, cluster.address, small)
        result["memory_small_corpus"]["utterances"] = SMALL_CORPUS
        # the same learner with no cache to speak of: what it holds besides the cache
        result["memory_no_cache"] = learner_memory(audio, args.epochs, result["utterances"], cluster.address,
                                                   cache_mb=NO_CACHE_MB)
    finally:
        cluster.shutdown()
    small_peak = result["memory_small_corpus"]["rss_peak_mb"]
    result["peak_above_small_corpus_mb"] = round(memory["rss_peak_mb"] - small_peak, 1)
    result["cache_share_of_peak_mb"] = round(memory["peak_above_start_mb"]
                                             - result["memory_no_cache"]["peak_above_start_mb"], 1)
    result["memory_in_one_process"] = learner_memory(audio, args.epochs, result["utterances"], None)
    result["pipeline_memory"] = pipeline_memory(audio)
    result["targets"] = {"ratio_audio_to_model": f">= {RATIO_TARGET}", "growth_after_epoch_1_mb": f"<= {FLAT_MB}",
                         "cache_share_of_peak_mb": f"<= cache_mb + {SHARE_SLACK_MB} = {CACHE_MB + SHARE_SLACK_MB}",
                         "peak_above_small_corpus_mb": f"<= {FLAT_MB}"}
    result["passed"] = (result["ratio_audio_to_model"] >= RATIO_TARGET and memory["growth_after_epoch_1_mb"] <= FLAT_MB
                        and result["cache_share_of_peak_mb"] <= CACHE_MB + SHARE_SLACK_MB
                        and result["peak_above_small_corpus_mb"] <= FLAT_MB)
    result["bench_wall_s"] = round(time.time() - started)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "data_pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "data_pipeline.png")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("memory")}, indent=2))
    for name in ("memory", "memory_small_corpus", "memory_no_cache", "memory_in_one_process"):
        print(name, json.dumps({k: v for k, v in result[name].items() if k != "series"}))
    print(json.dumps(result["pipeline_memory"]))


if __name__ == "__main__":
    main()
