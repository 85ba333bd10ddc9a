"""Benchmark: the GPU path, on whatever GPUs the machine has (issue 19, part 5).

Three measurements, each median [IQR] over interleaved repeats (`_common`):

1. `steps`: one learner's training step (the workload's forward, CTC loss, backward and AdamW
   step, exactly what a Chorus learner runs) on one GPU, for `tiny.yaml`'s model (~1.1M
   parameters) and the ~10M one of bench/vs_ray_train.py, in float32 and in mixed precision
   (`model.precision: bf16`), on the same batches (20 s of padded audio). Reported: seconds per
   step and bf16's speed-up.
2. `all_reduce` (2 GPUs or more): the raw NCCL all_reduce of 10M / 30M / 100M float32 values
   between two GPUs (plain Ray actors), and the seconds a Chorus `allreduce` learner pair (the
   `linear` workload, 10 square layers of the size, NCCL) waits on the all-reduce after its
   backward pass, with one bucket and with overlapped buckets. The raw pair is measured first
   and let go, then the Chorus pairs, interleaved, so two GPUs suffice.
3. `gossip_exchange` (2 GPUs or more): a Chorus gossip exchange between two GPU learners of the
   size (`mix`: both send their weights over their link, the pair averages), against the raw
   NCCL all_reduce of the same bytes. The links run over gloo (host memory), so each exchange
   also copies the weights from and to the device: that cost is what this figure shows.

Without a CUDA device it says so and writes nothing (exit 2). `--device cpu` runs every part on
the CPU with gloo instead, as a check that the code runs (written to bench/work/gpu-cpu.json, never
to bench/results). `passed` is true when every part that the machine's GPUs allow was measured (the
communication parts need 2) and bf16 is not slower than float32 for the 10M model.

On CUDA, a Chorus allreduce learner's wait is what `comm_seconds` says: the group synchronizes the
device inside the timed block (an NCCL call returns to the host before the transfer is done).

Writes bench/results/gpu.json and gpu.png.
Usage: .venv/bin/python bench/gpu.py [--repeats 5] [--sizes 10,30,100] [--device cpu]
"""

from __future__ import annotations

import argparse
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
from _common import compare, interleaved, summary, write_results  # noqa: E402

from jobs.synth import synthesize  # noqa: E402
from orchestrator.capacity import place_learners, release  # noqa: E402
from orchestrator.config import load_spec  # noqa: E402
from orchestrator.groups import AllreduceMember, GossipMember  # noqa: E402
from orchestrator.groups.overlap import BUCKET_BYTES  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "gpu"
MODELS = {"tiny": [], "10m": ["model.d_model=256", "model.hidden=520", "model.layers=2",
                              "model.subsample_channels=64"]}  # as bench/vs_ray_train.py
STEPS_PER_REPEAT, LAYERS = 10, 10  # training steps timed per repeat; the allreduce model's layers
ONE_BUCKET = 1 << 62


def step_seconds(corpus: Path, device: str, repeats: int, steps: int) -> dict:
    """Seconds per training step for each model in fp32 and bf16, interleaved."""
    from jobs.workload import AsrWorkload

    setups = {}
    for model_name, overrides in MODELS.items():
        for precision in ("fp32", "bf16"):
            spec = load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
                *overrides, f"model.precision={precision}", f"data.train={corpus}/train.jsonl", "data.dev=null",
                "data.test=null", "data.test_unseen=null", "data.test_unseen_engine=null", "data.max_batch_seconds=20"])
            workload = AsrWorkload(spec.workload_config, seed=0)
            model = workload.build_model().to(device)
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

    runs = interleaved({name: timed(name) for name in setups}, repeats=repeats)
    stats = {name: summary(values) for name, values in runs.items()}
    return {"seconds_per_step": stats, "batch_seconds": 20, "steps_per_repeat": steps,
            "bf16_speedup": {m: compare(stats[f"{m}_fp32"], stats[f"{m}_bf16"]) for m in MODELS}}


@ray.remote
class Peer:
    """One end of a 2-process group holding a vector (NCCL on its GPU, or gloo on the CPU)."""

    def __init__(self, device: str):
        self.device = device
        self.vector = None

    def address(self) -> str:
        from orchestrator.local_head import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def join(self, address: str, rank: int) -> None:
        from orchestrator.groups.allreduce import join_process_group

        join_process_group("nccl" if self.device == "cuda" else "gloo", address, rank, 2, timeout_s=600)

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
        slots, learners = place_learners(f"gpu-{kind}-{self.millions}m-{time.time_ns()}", 2, 1.0, "linear", config,
                                         seed=0)
        self.placed = (kind, slots, learners)
        if kind == "gossip":
            active, passive = learners
            ray.get([active.join.remote(GossipMember(0, [passive])), passive.join.remote(GossipMember(1, []))])
        return learners

    def exchange(self, count: int) -> float:
        active = self._learners("gossip")[0]
        ray.get(active.mix.remote(1))  # the link opened and warm
        start = time.perf_counter()
        ray.get(active.mix.remote(count))
        return (time.perf_counter() - start) / count

    def allreduce_wait(self, bucket_bytes: int) -> float:
        reducers = self._learners("allreduce")
        ip, port = ray.get([reducers[0].ip.remote(), reducers[0].free_port.remote()])
        ray.get([r.join.remote(AllreduceMember(i, 2, f"{ip}:{port}", "nccl" if ray.get(r.device.remote()) == "cuda"
                                               else "gloo", bucket_bytes=bucket_bytes))
                 for i, r in enumerate(reducers)])
        ray.get([r.run.remote(1, None, None, 0.0) for r in reducers])  # warm-up
        stats = ray.get([r.run.remote(4, None, None, 0.0) for r in reducers])
        return statistics.median(w for s in stats for w in s["comm_seconds"])

    def close(self) -> None:
        if self.placed is not None:
            release(self.placed[1], self.placed[2])
            self.placed = None


def plot(result: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    steps = result["steps"]["seconds_per_step"]
    names = list(steps)
    ax1.bar(range(len(names)), [steps[n]["median"] for n in names],
            yerr=[[steps[n]["median"] - steps[n]["iqr"][0] for n in names],
                  [steps[n]["iqr"][1] - steps[n]["median"] for n in names]], capsize=4,
            color=["tab:gray", "tab:green"] * (len(names) // 2))
    ax1.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])
    ax1.set(ylabel="seconds per step (median, IQR)", title=f"learner step on {result['device_name']}")
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="10,30,100", help="millions of parameters (communication)")
    parser.add_argument("--steps", type=int, default=STEPS_PER_REPEAT, help="training steps timed per repeat")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a check that the code runs")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device on this machine; nothing measured, nothing written "
              "(--device cpu runs the same code on the CPU as a check)")
        return 2
    devices = torch.cuda.device_count() if args.device == "cuda" else 2
    corpus = WORK / "corpus-200-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=200, eval_utterances=10, seed=0, progress=False)
    started = time.time()
    steps = step_seconds(corpus, args.device, args.repeats, args.steps)
    communication_rows = None
    if devices >= 2:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
        try:
            communication_rows = communication([int(s) for s in args.sizes.split(",")], args.device, args.repeats)
        finally:
            ray.shutdown()
    bf16 = steps["bf16_speedup"]["10m"]
    result = {"benchmark": "gpu", "device": args.device, "devices": devices,
              "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "repeats": args.repeats, "steps": steps,
              "communication": communication_rows or "needs 2 devices: not measured",
              "passed": (devices < 2 or communication_rows is not None) and bf16["verdict"] != "lower",
              "wall_s": round(time.time() - started, 1)}
    path = RESULTS / "gpu.json" if args.device == "cuda" else WORK.parent / "gpu-cpu.json"
    write_results(path, result, plot)
    print(f"{path}: passed {result['passed']}; bf16 speed-up (10M) {bf16}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
