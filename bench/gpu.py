"""Benchmark: the GPU path, on whatever GPUs the machine has (issue 19, part 5).

Four measurements, each median [IQR] over interleaved repeats (`harness.stats`):

1. `steps`: one learner's training step (the workload's forward, CTC loss, backward and AdamW
   step, exactly what a Chorus learner runs) on one GPU, for `tiny.yaml`'s model (~1.1M
   parameters) and the ~10M one of bench/vs_ray_train.py, in float32 and in mixed precision
   (`model.precision: bf16`), on the same batches (`--batch-seconds` of padded audio, 320 by
   default: a GPU's batch), the learner's flat weight buffer in place. Reported: seconds per step,
   bf16's speed-up, and the warnings raised (cuDNN's "not part of single contiguous chunk" is a failure).
2. `all_reduce` (2 GPUs or more): the raw NCCL all_reduce of 10M / 30M / 100M float32 values
   between two GPUs (plain Ray actors), and the seconds a Chorus `allreduce` learner pair (the
   `linear` workload, 10 square layers of the size, NCCL) waits on the all-reduce after its
   backward pass, with one bucket and with overlapped buckets. The raw pair is measured first
   and let go, then the Chorus pairs, interleaved, so two GPUs suffice.
3. `gossip_exchange` (2 GPUs or more): a Chorus gossip exchange between two GPU learners of the
   size (`mix`: both send their weights over their link, the pair averages), against the raw
   NCCL all_reduce of the same bytes. The links run over gloo (host memory), so each exchange
   also copies the weights from and to the device: that cost is what this figure shows.

4. `learners` (`bench/gpu_learners.py`): samples/s, GPU busy % and the seconds a step waits for
   data, for one Chorus learner, two sharing the GPU, and the baseline, a standard
   `DataLoader(num_workers=..., pin_memory=True)` loop as a Ray Train worker runs it (in Ray Train's
   `TorchTrainer` where `ray.train` imports, else in a plain Ray actor: `--baseline`), per recipe
   (tiny.yaml and conformer.yaml at 320 s batches, conformer_gpu.yaml), in `--window`-second windows.

Without a CUDA device it says so and writes nothing (exit 2). `--device cpu` runs every part on
the CPU with gloo instead, as a check that the code runs (written to bench/work/gpu-cpu.json, never
to bench/results). `passed` is issue 40's targets: every part the machine's GPUs allow measured (communication
needs 2); one Chorus learner >= 10,000 samples/s for tiny.yaml and conformer.yaml's models;
conformer_gpu.yaml's learner keeping the GPU >= 70% busy; bf16 >= 1.2x float32 for the 10M model;
Chorus above the DataLoader baseline for every recipe, IQRs apart; two tiny.yaml learners sharing the
GPU >= 1.3x one; no cuDNN compaction warning; and the run complete. A target whose part or recipe
the run did not measure is None in `checks` (listed in `not_measured`) and `passed` is false; the
exit status is 0 when every target measured is met. The JSON (and figure) is written after every
part and recipe (`complete: false` until the end), so a run cut off keeps what it measured;
`--merge` adds an earlier run's recipes to this one's (the GPU kit measures conformer_gpu.yaml first).

On CUDA, a Chorus allreduce learner's wait is what `comm_seconds` says: the group synchronizes the
device inside the timed block (an NCCL call returns to the host before the transfer is done).

Writes bench/results/gpu.json and gpu.png (`--out`).
Usage: .venv/bin/python bench/gpu.py [--repeats 5] [--parts steps,learners,communication] [--window 8]
       [--recipes tiny,conformer,conformer_gpu] [--workers 7] [--sizes 10,30,100] [--device cpu]
       [--baseline auto|ray_train|torch] [--out PATH] [--merge EARLIER.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from gpu_learners import RECIPES, measure  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import compare, interleaved, summary  # noqa: E402

from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.groups.allreduce import AllreduceMember  # noqa: E402
from orchestrator.groups.gossip import GossipMember  # noqa: E402
from orchestrator.groups.overlap import BUCKET_BYTES  # noqa: E402
from orchestrator.groups.registry import call  # noqa: E402
from orchestrator.testing.groups import FixedLearners  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "gpu"
MODELS = {"tiny": [], "10m": ["model.d_model=256", "model.hidden=520", "model.layers=2",
                              "model.subsample_channels=64"]}  # as bench/vs_ray_train.py
STEPS_PER_REPEAT, LAYERS = 10, 10  # training steps timed per repeat; the allreduce model's layers
ONE_BUCKET = 1 << 62


def step_seconds(corpus: Path, device: str, repeats: int, steps: int, batch_seconds: float) -> dict:
    """Seconds per training step for each model in fp32 and bf16, interleaved, with the learner's
    flat weight buffer (cuDNN's layout first) in place; the warnings the steps raised."""
    import warnings

    from jobs.workload import AsrWorkload
    from orchestrator.base.flat import cudnn_weights, flat_weight_buffer

    setups = {}
    for model_name, overrides in MODELS.items():
        for precision in ("fp32", "bf16"):
            spec = load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
                *overrides, f"model.precision={precision}", f"data.train={corpus}/train.jsonl", "data.dev=null",
                "data.test=null", "data.test_unseen=null", "data.test_unseen_engine=null",
                f"data.max_batch_seconds={batch_seconds}", "features.compute_on=device"])
            workload = AsrWorkload(spec.workload_config, seed=0)
            model = workload.build_model().to(device)
            params = [p for p in model.parameters() if p.requires_grad]
            flat_weight_buffer(params, torch.device(device), cudnn_weights(model))
            batches = [b for _, b in zip(range(steps), workload.batches(0, 1, 0), strict=False)]
            setups[f"{model_name}_{precision}"] = (workload, model, workload.build_optimizer(model), batches)

    def timed(name: str):
        workload, model, optimizer, batches = setups[name]

        def measure(_repeat: int) -> float:
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            sync()
            start = time.perf_counter()
            for step, batch in enumerate(batches):
                optimizer.zero_grad()
                workload.loss(model, batch).backward()
                workload.optimizer_step(model, optimizer, step, 0.5)
            sync()
            return (time.perf_counter() - start) / len(batches)
        measure(-1)  # warm-up: kernels chosen, memory allocated
        return measure

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = interleaved({name: timed(name) for name in setups}, repeats=repeats)
    stats = {name: summary(values) for name, values in runs.items()}
    said = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return {"seconds_per_step": stats, "batch_seconds": batch_seconds, "steps_per_repeat": steps,
            "bf16_speedup": {m: compare(stats[f"{m}_fp32"], stats[f"{m}_bf16"]) for m in MODELS},
            "warnings": said, "cudnn_compaction_warning": any("contiguous chunk" in w for w in said)}


@ray.remote
class Peer:
    """One end of a 2-process group holding a vector (NCCL on its GPU, or gloo on the CPU)."""

    def __init__(self, device: str):
        self.device = device
        self.vector = None

    def address(self) -> str:
        from orchestrator.cluster.local_head import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def join(self, address: str, rank: int) -> None:
        """The library's own process group, as a plain torch.distributed user makes it (a TCPStore
        at rank 0): the baseline measures the library, not Chorus's rendezvous."""
        import datetime

        import torch.distributed as dist

        dist.init_process_group("nccl" if self.device == "cuda" else "gloo", init_method=f"tcp://{address}",
                                rank=rank, world_size=2, timeout=datetime.timedelta(seconds=600))

    def all_reduces(self, numel: int, count: int) -> float:
        import torch.distributed as dist

        self.vector = torch.randn(numel, device=self.device)
        dist.all_reduce(self.vector)  # warm-up
        self._sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(self.vector)
            self.vector.div_(2)
        self._sync()
        self.vector = None
        return (time.perf_counter() - start) / count

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def communication(sizes_m: list[int], device: str, repeats: int) -> dict:
    """Raw all_reduce, Chorus allreduce's exposed wait and Chorus's gossip exchange, per size. The raw
    pair is measured first and let go (two devices then suffice for the Chorus pairs, which take
    one device a learner); the Chorus contenders run interleaved."""
    gpu = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
    peers = [Peer.options(**gpu).remote(device) for _ in range(2)]
    address = ray.get(peers[0].address.remote())
    ray.get([p.join.remote(address, rank) for rank, p in enumerate(peers)])
    raw = {m: [ray.get([p.all_reduces.remote(m * 1_000_000, 5) for p in peers])[0] for _ in range(repeats)]
           for m in sizes_m}
    for p in peers:
        ray.kill(p)
    rows = {}
    for m in sizes_m:
        pair = ChorusPair(m, m * 1_000_000)
        try:
            runs = interleaved({
                "allreduce_one_bucket": lambda _r: pair.allreduce_wait(ONE_BUCKET),  # noqa: B023
                "allreduce_overlapped": lambda _r: pair.allreduce_wait(  # noqa: B023
                    BUCKET_BYTES["nccl" if device == "cuda" else "gloo"]),
                "gossip_exchange": lambda _r: pair.exchange(5)}, repeats=repeats)  # noqa: B023
        finally:
            pair.close()
        stats = {"raw_all_reduce": summary(raw[m]), **{name: summary(values) for name, values in runs.items()}}
        median_raw = stats["raw_all_reduce"]["median"]
        rows[f"{m}M"] = {"seconds": stats,
                         "gossip_over_raw_all_reduce": round(stats["gossip_exchange"]["median"] / median_raw, 2),
                         "exposed_over_raw": {k: round(stats[k]["median"] / median_raw, 2)
                                              for k in ("allreduce_one_bucket", "allreduce_overlapped")},
                         "raw_bus_gb_per_s": round(m * 4e6 / median_raw / 1e9, 2)}
    return rows


class ChorusPair:
    """Two Chorus learners (the `linear` workload) for the gossip exchange and two for allreduce,
    one device each, for one model size; placed one pair at a time (two GPUs suffice)."""

    def __init__(self, millions: int, numel: int):
        self.millions = millions
        side = round(numel ** 0.5)
        self.gossip_config = {"data": {"samples": 8, "features": side, "classes": side, "batch_size": 8,
                                       "compute_seconds": 0.0, "eval_splits": ["dev"]}}
        width = round((numel / LAYERS) ** 0.5)
        self.allreduce_config = {"data": {"samples": 1024, "features": width, "classes": width, "batch_size": 64,
                                          "compute_seconds": 0.0, "eval_splits": ["dev"]},
                                 "model": {"hidden_layers": LAYERS - 1}}
        self.placed: tuple | None = None

    def _learners(self, kind: str) -> list:
        if self.placed is not None and self.placed[0] == kind:
            return self.placed[2]
        self.close()
        config = self.gossip_config if kind == "gossip" else self.allreduce_config
        fixed = FixedLearners(f"gpu-{kind}-{self.millions}m-{time.time_ns()}", 2, 1.0, "linear", config)
        learners = fixed.actors
        self.placed = (kind, fixed, learners)
        if kind == "gossip":
            active, passive = learners
            ray.get([active.join.remote(GossipMember(0, [passive])), passive.join.remote(GossipMember(1, []))])
        return learners

    def exchange(self, count: int) -> float:
        active = self._learners("gossip")[0]
        ray.get(call(active, "gossip", "mix", 1))  # the link opened and warm
        start = time.perf_counter()
        ray.get(call(active, "gossip", "mix", count))
        return (time.perf_counter() - start) / count

    def allreduce_wait(self, bucket_bytes: int) -> float:
        reducers = self._learners("allreduce")
        meeting = self.placed[1].meeting()
        ray.get([r.join.remote(AllreduceMember(i, 2, meeting, "nccl" if ray.get(r.device.remote()) == "cuda"
                                               else "gloo", bucket_bytes=bucket_bytes))
                 for i, r in enumerate(reducers)])
        ray.get([r.run.remote(1, None, None, 0.0) for r in reducers])  # warm-up
        stats = ray.get([r.run.remote(4, None, None, 0.0) for r in reducers])
        return statistics.median(w for s in stats for w in s["comm_seconds"])

    def close(self) -> None:
        if self.placed is not None:
            self.placed[1].release()
            self.placed = None


def plot(result: dict, path: Path) -> None:
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(15, 4))
    steps = (result.get("steps") or {}).get("seconds_per_step", {})
    names = list(steps)
    ax1.bar(range(len(names)), [steps[n]["median"] for n in names],
            yerr=[[steps[n]["median"] - steps[n]["iqr"][0] for n in names],
                  [steps[n]["iqr"][1] - steps[n]["median"] for n in names]], capsize=4,
            color=["tab:gray", "tab:green"] * (len(names) // 2))
    ax1.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])
    ax1.set(ylabel="seconds per step (median, IQR)", title=f"learner step on {result['device_name']}"
            if steps else "learner step: not run")
    recipes = (result.get("learners") or {}).get("recipes", {})
    for k, contender in enumerate(("chorus_1", "chorus_2_sharing", "baseline")):
        rows = [r["samples_per_s"].get(r.get("baseline") if contender == "baseline" else contender,
                                       {"median": 0, "iqr": [0, 0]}) for r in recipes.values()]
        x = [i + (k - 1) * 0.27 for i in range(len(rows))]
        name = ((result.get("learners") or {}).get("baseline") or {}).get("name", "") if k == 2 else contender
        ax3.bar(x, [r["median"] for r in rows], width=0.27, label=name.replace("_", " "),
                yerr=[[r["median"] - r["iqr"][0] for r in rows], [r["iqr"][1] - r["median"] for r in rows]], capsize=3)
    ax3.set_xticks(range(len(recipes)), list(recipes))
    ax3.set(yscale="log" if recipes else "linear", ylabel="samples/s (median, IQR)",
            title="one GPU's learners" if recipes else "learners: not run")
    if recipes:
        ax3.legend(fontsize=8)
    comm = result.get("communication")
    comm = comm if isinstance(comm, dict) else {}  # one device: why it was not measured, a string
    for key in ("raw_all_reduce", "allreduce_one_bucket", "allreduce_overlapped", "gossip_exchange"):
        if comm:
            ax2.plot([int(s[:-1]) for s in comm], [r["seconds"][key]["median"] for r in comm.values()], marker="o",
                     label=key.replace("_", " "))
    ax2.set(xscale="log", yscale="log", xlabel="parameters (millions)", ylabel="seconds (median)",
            title="communication" if comm else "communication: needs 2 devices")
    if comm:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    args = arguments()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device on this machine; nothing measured, nothing written "
              "(--device cpu runs the same code on the CPU as a check)")
        return 2
    parts = set(args.parts.split(","))
    devices = torch.cuda.device_count() if args.device == "cuda" else 2
    corpus = args.corpus or WORK / f"corpus-{args.utterances}-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=args.utterances, eval_utterances=10, seed=0, progress=False)
    workers = args.workers if args.workers is not None else max(1, (os.cpu_count() or 2) // 2 - 1)
    out = args.out or (RESULTS / "gpu.json" if args.device == "cuda" else WORK.parent / "gpu-cpu.json")
    run = Run(out, parts, args.merge)
    run.result.update({"benchmark": "gpu", "device": args.device, "devices": devices,
                       "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                       "torch": torch.__version__, "repeats": args.repeats, "commit": commit()})
    run.save()  # what runs, on which device, before anything is measured
    if "steps" in parts:
        run.save(steps=step_seconds(corpus, args.device, args.repeats, args.steps, args.batch_seconds))
    ray.init(address="local", num_cpus=max(8, os.cpu_count() or 8), include_dashboard=False, log_to_driver=False)
    try:
        if "learners" in parts:
            measure(corpus, args.device, args.repeats, args.window, workers, args.recipes.split(","), args.set,
                    args.baseline, on_recipe=lambda learners: run.save(learners=learners))
        if devices >= 2 and "communication" in parts:
            run.save(communication=communication([int(s) for s in args.sizes.split(",")], args.device,
                                                 args.repeats))
    finally:
        ray.shutdown()
    run.save(complete=True)
    print(f"{out}: passed {run.result['passed']}; {json.dumps(run.result['checks'])}")
    # exit 0 when every target this run measured is met (a run of one part or recipe, as the GPU kit's g1)
    return 0 if all(ok is not False for ok in run.result["checks"].values()) else 1


class Run:
    """The result as it grows: written (JSON and figure) after every part and every recipe, so that a
    run cut off by its time limit still leaves what it measured (`complete: false`, `passed: false`).
    `merge`: an earlier run's JSON whose recipes (and steps, when this run has none) complete this
    one's, the GPU kit's way of measuring its most important recipe first, in a step of its own."""

    def __init__(self, out: Path, parts: set[str], merge: Path | None):
        self.out, self.parts, self.started = out, set(parts), time.time()
        self.result = {"steps": None, "learners": None, "communication": "needs 2 devices: not measured",
                       "complete": False}
        self.earlier = json.loads(merge.read_text()) if merge else None
        if self.earlier:
            self.parts |= set(self.earlier.get("parts", []))
            self.result["merged_from"] = {"path": str(merge), "commit": self.earlier.get("commit"),
                                          "recipes": sorted((self.earlier.get("learners") or {}).get("recipes", {}))}

    def save(self, complete: bool = False, **parts) -> None:
        self.result.update(parts)
        result, earlier = self.result, self.earlier
        if earlier and earlier.get("learners"):
            mine = result["learners"] or {**earlier["learners"], "recipes": {}}
            result["learners"] = {**mine, "recipes": {**earlier["learners"]["recipes"], **mine["recipes"]}}
        if earlier and result["steps"] is None:
            result["steps"] = earlier.get("steps")
        result.update(parts=sorted(self.parts), complete=complete, wall_s=round(time.time() - self.started, 1))
        result["checks"] = checks(result, self.parts)
        result["passed"] = complete and all(ok is True for ok in result["checks"].values())
        result["not_measured"] = sorted(name for name, ok in result["checks"].items() if ok is None)
        write_results(self.out, result, plot)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", default="steps,learners,communication", help="which parts to run")
    parser.add_argument("--sizes", default="10,30,100", help="millions of parameters (communication)")
    parser.add_argument("--steps", type=int, default=STEPS_PER_REPEAT, help="training steps timed per repeat")
    parser.add_argument("--batch-seconds", type=float, default=320.0, help="padded audio seconds per batch (steps)")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of each learners window")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="learners: which recipes")
    parser.add_argument("--workers", type=int, default=None, help="learners: data workers (default: CPUs/2 - 1)")
    parser.add_argument("--baseline", choices=["auto", "ray_train", "torch"], default="auto",
                        help="learners: Ray Train's TorchTrainer (auto: where ray.train imports) or the same "
                        "DataLoader loop in a plain Ray actor")
    parser.add_argument("--utterances", type=int, default=2000, help="the synthesized corpus's training utterances")
    parser.add_argument("--corpus", type=Path, default=None, help="a `chorus synth` corpus to use instead")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a check that the code runs")
    parser.add_argument("--set", action="append", default=[], help="learners: a spec override for every recipe "
                        "(a CPU check's smaller model)")
    parser.add_argument("--out", type=Path, default=None, help="the result's JSON (default: bench/results/gpu.json "
                        "on CUDA, bench/work/gpu-cpu.json on the CPU); written after every part and recipe")
    parser.add_argument("--merge", type=Path, default=None, help="an earlier result whose recipes (and steps) "
                        "this run adds to its own before its checks")
    return parser.parse_args()


def checks(result: dict, parts: set[str]) -> dict:
    """Issue 40's and 59's targets: each true or false, or None where this run (with what it merged)
    did not measure what the target needs (its part, or its recipe). `passed` needs every one true."""
    steps, learners = result["steps"] or {}, (result["learners"] or {}).get("recipes", {})

    def measured(needed, value) -> bool | None:
        return bool(value()) if needed else None

    def rate(recipe: str) -> float:
        return learners[recipe]["samples_per_s"]["chorus_1"]["median"]

    def busy() -> float:
        return ((learners["conformer_gpu"].get("gpu_busy_mean") or {}).get("chorus_1") or {}).get("median") or 0

    return {
        "communication_measured": result["devices"] < 2 or "communication" not in parts
        or isinstance(result["communication"], dict),
        "tiny_chorus_1_at_least_10000_samples_per_s": measured("tiny" in learners, lambda: rate("tiny") >= 10_000),
        "conformer_chorus_1_at_least_10000_samples_per_s": measured(
            "conformer" in learners, lambda: rate("conformer") >= 10_000),
        "conformer_gpu_chorus_1_gpu_at_least_70_percent_busy": measured("conformer_gpu" in learners,
                                                                        lambda: busy() >= 70),
        "bf16_at_least_1.2x_fp32_10m": measured(steps, lambda: (steps["bf16_speedup"]["10m"]["ratio"] or 0) >= 1.2),
        "chorus_above_baseline_every_recipe": measured(learners, lambda: all(
            r["chorus_over_baseline"]["verdict"] == "higher" for r in learners.values())),
        "tiny_two_sharing_at_least_1.3x_one": measured(
            "tiny" in learners, lambda: (learners["tiny"]["two_sharing_over_one"]["ratio"] or 0) >= 1.3),
        "no_cudnn_compaction_warning": measured(steps, lambda: not steps["cudnn_compaction_warning"]),
    }


if __name__ == "__main__":
    raise SystemExit(main())
