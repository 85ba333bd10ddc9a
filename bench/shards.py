"""Benchmark: training data as shards in object storage, at scale (issue 41, part 4).

A corpus of >= 100,000 utterances (>= 50 h) is packed into 64 MB shards (`chorus shards`) on an S3
API on loopback (moto's server, as the suite's tests use), and so is a 10-hour one. The speech is
the open-vocabulary corpus of bench/openvocab.py (`chorus synth --task openvocab --hours 20`),
its files hard-linked under new names as many times as the size needs: what is measured here
(start-up, memory, read rate) depends on the bytes and counts, not on the sentences.

Both corpora are written with their utterances' log-mel power (`chorus shards --features`), as
openvocab.yaml trains on them (`data.shard_features`); the shards carry the audio too.

Measured:
- start-up: `startup_s` of a job (its start to its first step: the driver's checks, BPE units
  from the texts' sample, 2 learners placed and streaming) of `jobs/configs/openvocab.yaml` on the
  10-hour and on the large corpus, interleaved, `--repeats` each. Target: ratio of medians <= 1.2.
- memory and data rate, the recipe's path: 2 learner processes (1 torch thread each, as 2
  learners on this 2-core machine, with the learners' `MALLOC_ARENA_MAX`) each stream their half
  of one epoch of the large corpus from S3 (the shards' log-mels, openvocab.yaml's augmentation in
  the log-mel domain, padding, as a learner's input path does), with the recipe's read-ahead. Each
  samples its resident memory every 50 batches. Growth: the largest sample after the first 5% of
  the epoch minus the sample then. Target: <= 32 MB.
- the data's rate against the model's, interleaved: 2 processes, each keeping 100 batches drawn
  evenly across its half of the epoch (so their lengths are the epoch's), then 5 rounds of: a fifth
  of its half of the next epoch streamed as above (the data's utterances/s), and one pass of
  openvocab.yaml's model (forward, backward, optimizer step) over the kept batches in a new order
  (the model's utterances/s); the two processes start each window and each pass together. Each
  round's ratio: the slower learner's data over the faster learner's model. Target: >= 3x, met
  when the ratio's lower quartile over the rounds is at or above 3x (a median above 3x with a
  quartile below is a tie). The whole epoch's data rate over the median pass is kept too
  (`data_to_model_epoch`).
- for comparison, the audio path (`data.shard_features=false`: decode, waveform augmentation,
  filterbanks) over the first `--audio-utterances` of each learner's half of the same epoch, and
  2,000 utterances of the next epoch without augmentation: what augmentation costs, told apart.

Writes `bench/results/shards.json` and `shards.png`.

Usage: .venv/bin/python bench/shards.py [--repeats 5] [--utterances 100000] [--audio-utterances 6000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import interleaved, summary  # noqa: E402

from jobs.data.audio_shards import write_audio_shards  # noqa: E402
from orchestrator.cluster.runtime import LEARNER_MALLOC_ARENAS  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.testing.s3 import local_s3, uri  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "shards"
SOURCE = ROOT / "bench" / "work" / "openvocab" / "corpus-20h-0"
RECIPE = ROOT / "jobs" / "configs" / "openvocab.yaml"
RSS_EVERY = 50  # batches between memory samples
MODEL_BATCHES = 100  # the model's rate: batches drawn evenly across the epoch
RATE_ROUNDS = 5  # rounds of a data window and a model pass over those batches
TARGETS = {"startup_ratio": 1.2, "rss_growth_mb": 32.0, "data_to_model": 3.0}


def scaled_manifest(utterances: int) -> Path:
    """A manifest of `utterances` rows over SOURCE's training audio, each file hard-linked under
    as many new names as it takes (made once)."""
    out = WORK / f"corpus-{utterances}"
    manifest = out / "train.jsonl"
    if manifest.is_file():
        return manifest
    rows = [json.loads(line) for line in (SOURCE / "train.jsonl").open()]
    (out / "audio").mkdir(parents=True, exist_ok=True)
    with open(manifest.with_suffix(".tmp"), "w") as f:
        for n in range(utterances):
            row = rows[n % len(rows)]
            link = out / "audio" / f"c{n // len(rows)}-{Path(row['audio_filepath']).name}"
            if not link.exists():
                os.link(SOURCE / row["audio_filepath"], link)
            f.write(json.dumps({**row, "audio_filepath": str(link.relative_to(out))}, allow_nan=False) + "\n")
    manifest.with_suffix(".tmp").rename(manifest)
    return manifest


def spec_for(train: str, **more: str):
    sets = [f"data.train={train}", *(f"data.{s}=null" for s in ("dev", "test", "test_unseen", "test_unseen_engine")),
            "decoding.kind=greedy", "decoding.lm=null", *(f"{k}={v}" for k, v in more.items())]
    return load_spec(RECIPE, sets)


def startup_s(train: str, repeat: int) -> float:
    """A 2-learner job of the recipe on `train`: seconds from its start to its first step."""
    import ray

    from orchestrator.driver.job import TrainingJob

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = spec_for(train, **{"budget.wall_seconds": "8", "budget.epochs": "null", "seed": str(repeat)})
        outcome = TrainingJob(spec, WORK / "startup-run", overwrite=True).run()
    finally:
        ray.shutdown()
    return outcome["startup_s"]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def stream_learner(train: str, rank: int, answers, audio_utterances: int | None = None) -> None:
    """One learner's half of epoch 0, streamed as the recipe says: utterances/s and resident memory
    samples. With `audio_utterances`, the audio path instead (`data.shard_features=false`) over
    that many utterances, and its rate without augmentation."""
    import torch

    from jobs.workload import AsrWorkload

    torch.set_num_threads(1)
    spec = spec_for(train, **({"data.shard_features": "false"} if audio_utterances else {}))
    workload = AsrWorkload(spec.workload_config, seed=spec.seed)
    stream = workload.batches(rank, 2, 0)
    samples, utterances, batches, start = [], 0, 0, time.perf_counter()
    for batch in stream:
        utterances, batches = utterances + batch.size, batches + 1
        if batches % RSS_EVERY == 0:
            samples.append((stream.position / len(stream), _rss_mb()))
        if audio_utterances and utterances >= audio_utterances:
            break
    seconds = time.perf_counter() - start
    answer = {"rank": rank, "utterances": utterances, "planned": len(stream), "seconds": round(seconds, 1),
              "utt_per_s": round(utterances / seconds, 2), "rss_mb": samples,
              "skipped": dict(workload.train.skipped.counts)}
    if audio_utterances:
        answer["utt_per_s_unaugmented"] = _unaugmented_rate(spec, rank)
    answers.put(answer)


def _unaugmented_rate(spec, rank: int, utterances: int = 2000) -> float:
    """The same stream's rate without augmentation (decode, filterbanks, padding), over its first
    `utterances` of epoch 1: what the augmentation costs, told apart."""
    from jobs.sections import AugmentConfig
    from jobs.workload import AsrWorkload

    workload = AsrWorkload(spec.workload_config.model_copy(update={"augment": AugmentConfig()}), seed=spec.seed)
    workload.tokenizer  # noqa: B018 - learnt before the clock starts
    done, start = 0, time.perf_counter()
    for batch in workload.batches(rank, 2, 1):
        done += batch.size
        if done >= utterances:
            break
    return round(done / (time.perf_counter() - start), 2)


def model_learner(train: str, rank: int, answers, barrier) -> None:
    """The data and the model, interleaved: openvocab.yaml's model trained on `MODEL_BATCHES`
    batches drawn evenly across the learner's half of epoch 0 (the first batches alone are the
    shortest utterances: each shard holds its utterances in order of duration), then `RATE_ROUNDS`
    rounds of a window of the learner's half of epoch 1 streamed (a `RATE_ROUNDS`th of it: the
    data's rate), then a pass over the kept batches in a new order (the model's rate). Both learners
    start each window and each pass together (`barrier`), so each round's two rates are measured
    at the same hour of the machine, with the same other learner's work beside them."""
    import torch

    from jobs.workload import AsrWorkload

    torch.set_num_threads(1)
    spec = spec_for(train)
    workload = AsrWorkload(spec.workload_config, seed=spec.seed)
    model, kept = workload.build_model(), []
    optimizer = workload.build_optimizer(model)
    stream = workload.batches(rank, 2, 0)
    for batch in stream:
        if stream.position / len(stream) >= len(kept) / MODEL_BATCHES:
            kept.append(batch)

    def step(batch, i: int) -> None:
        optimizer.zero_grad()
        workload.loss(model, batch).backward()
        workload.optimizer_step(model, optimizer, i, 0.0)

    for i, batch in enumerate(kept[:2]):
        step(batch, i)
    order, data, rates = random.Random(rank), [], []
    window = workload.batches(rank, 2, 1)
    batches = iter(window)
    for r in range(RATE_ROUNDS):
        barrier.wait()
        done, start = 0, time.perf_counter()
        for batch in batches:
            done += batch.size
            if window.position >= (r + 1) * len(window) / RATE_ROUNDS:
                break
        data.append(round(done / (time.perf_counter() - start), 2))
        barrier.wait()
        start = time.perf_counter()
        for i, batch in enumerate(order.sample(kept, len(kept))):
            step(batch, i)
        rates.append(round(sum(b.size for b in kept) / (time.perf_counter() - start), 2))
    answers.put({"rank": rank, "batches": len(kept), "utterances": sum(b.size for b in kept),
                 "data_utt_per_s_rounds": data, "utt_per_s_passes": rates, "utt_per_s": statistics.median(rates)})


def two_learners(target, train: str, in_step: bool = False) -> list[dict]:
    """`target(train, rank, answers)` in 2 processes at once (spawned: a learner's fresh process);
    `in_step`: with a barrier of the two as its fourth argument."""
    ctx = mp.get_context("spawn")
    answers = ctx.Queue()
    more = (ctx.Barrier(2),) if in_step else ()
    procs = [ctx.Process(target=target, args=(train, rank, answers, *more)) for rank in range(2)]
    for p in procs:
        p.start()
    found = sorted((answers.get(timeout=7200) for _ in procs), key=lambda a: a["rank"])
    for p in procs:
        p.join(timeout=60)
    return found


def rss_growth(samples: list) -> float:
    """The largest sample after the first 5% of the epoch, minus the sample then (MB)."""
    later = [rss for where, rss in samples if where >= 0.05]
    return round(max(later) - later[0], 1) if later else float("nan")


def plot(result: dict, path: Path) -> None:
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for learner in result["epoch"]:
        a.plot([100 * w for w, _ in learner["rss_mb"]], [r for _, r in learner["rss_mb"]],
               label=f"learner {learner['rank']}: +{learner['rss_growth_mb']} MB")
    a.set_xlabel("epoch streamed (%)")
    a.set_ylabel("resident memory (MB)")
    a.set_title(f"{result['large']['utterances']:,} utterances, {result['large']['hours']:.0f} h from S3", fontsize=9)
    a.legend(fontsize=8)
    names = list(result["startup_s"])
    b.bar(names, [result["startup_s"][n]["median"] for n in names],
          yerr=[[result["startup_s"][n]["median"] - result["startup_s"][n]["iqr"][0] for n in names],
                [result["startup_s"][n]["iqr"][1] - result["startup_s"][n]["median"] for n in names]], capsize=4)
    b.set_ylabel("start to first step (s), median and IQR")
    b.set_title(f"ratio {result['startup_ratio']:.2f} (target <= 1.2)", fontsize=9)
    rates = {"shard log-mels\n(the recipe's)": min(e["utt_per_s"] for e in result["epoch"]),
             "audio": min(a["utt_per_s"] for a in result["audio"]["epoch"]),
             "audio, no\naugmentation": min(a["utt_per_s_unaugmented"] for a in result["audio"]["epoch"])}
    c.bar(list(rates), list(rates.values()))
    model = max(m["utt_per_s"] for m in result["model"])
    c.axhline(3 * model, color="k", linestyle="--", label=f"3x the model's {model:.0f} utt/s")
    c.set_ylabel("utterances/s, the slower learner")
    ratio = result["data_to_model_rounds"]
    c.set_title(f"data rate per learner (2 at once, 1 thread each); interleaved rounds: data/model "
                f"{ratio['median']:.2f}x [{ratio['iqr'][0]:.2f}, {ratio['iqr'][1]:.2f}]", fontsize=8)
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--utterances", type=int, default=100_000)
    parser.add_argument("--small-utterances", type=int, default=10_000, help="the 10-hour corpus")
    parser.add_argument("--audio-utterances", type=int, default=6_000, help="each learner's, on the audio path")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("MALLOC_ARENA_MAX", LEARNER_MALLOC_ARENAS)  # as a learner actor's process has it
    started = time.time()
    with local_s3() as endpoint:  # its credentials in this process's environment, for the learners too
        mel_bins = load_spec(RECIPE, check_paths=False).workload_config.features.num_mel_bins
        made = {name: write_audio_shards(scaled_manifest(n), uri(endpoint, name), shard_mb=64, mel_bins=mel_bins)
                for name, n in (("small", args.small_utterances), ("large", args.utterances))}
        trains = {name: uri(endpoint, name) for name in made}
        startups = interleaved({name: (lambda r, name=name: startup_s(trains[name], r)) for name in trains},
                               repeats=args.repeats)
        epoch = two_learners(stream_learner, trains["large"])
        model = two_learners(model_learner, trains["large"], in_step=True)
        audio = two_learners(partial(stream_learner, audio_utterances=args.audio_utterances), trains["large"])
    for learner in epoch:
        learner["rss_growth_mb"] = rss_growth(learner["rss_mb"])
    startup = {name: summary(values, 3) for name, values in startups.items()}
    model_rate = max(m["utt_per_s"] for m in model)
    rounds = [min(m["data_utt_per_s_rounds"][r] for m in model) / max(m["utt_per_s_passes"][r] for m in model)
              for r in range(RATE_ROUNDS)]  # each round: the slower learner's data over the faster one's model
    result = {"benchmark": "shards", "commit": commit(), "small": made["small"], "large": made["large"],
              "startup_s": startup, "startup_ratio": round(startup["large"]["median"] / startup["small"]["median"], 3),
              "epoch": epoch, "model": model,
              "data_to_model_rounds": summary(rounds, 3),
              "data_to_model_epoch": round(min(e["utt_per_s"] for e in epoch) / model_rate, 2),
              "audio": {"epoch": audio,
                        "data_to_model": round(min(a["utt_per_s"] for a in audio) / model_rate, 2),
                        "unaugmented_data_to_model":
                            round(min(a["utt_per_s_unaugmented"] for a in audio) / model_rate, 2)},
              "every_utterance_once": sum(e["utterances"] for e in epoch) == made["large"]["utterances"],
              "malloc_arena_max": os.environ["MALLOC_ARENA_MAX"],
              "targets": TARGETS, "repeats": args.repeats, "wall_s": round(time.time() - started, 1)}
    result["checks"] = {"startup_ratio": result["startup_ratio"] <= TARGETS["startup_ratio"],
                        "rss_growth_mb": max(e["rss_growth_mb"] for e in epoch) <= TARGETS["rss_growth_mb"],
                        # met only outside the rounds' noise: the lower quartile of the ratio at or above the target
                        "data_to_model": result["data_to_model_rounds"]["iqr"][0] >= TARGETS["data_to_model"]}
    result["passed"] = all(result["checks"].values()) and result["every_utterance_once"]
    write_results(RESULTS / "shards.json", result, plot)
    print(json.dumps({**{k: result[k] for k in ("startup_ratio", "data_to_model_rounds", "checks", "passed")},
                      "rss_growth_mb": [e["rss_growth_mb"] for e in epoch], "audio": {
                          k: result["audio"][k] for k in ("data_to_model", "unaugmented_data_to_model")}}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
