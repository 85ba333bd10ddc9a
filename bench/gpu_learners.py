"""bench/gpu.py's `learners` part: how busy one GPU is kept, per recipe (tiny.yaml and
conformer_gpu.yaml), on the same corpus, batch plan and GPU, in interleaved windows (`harness.stats`):

- `chorus_1`: one Chorus learner (`orchestrator.learner.replica.Learner`, as a one-learner job runs it),
  its batches prepared by `data.workers` processes, their augmentation and filterbanks on the GPU
  (`features.compute_on: auto`);
- `chorus_2_sharing`: two such learners on the one GPU (each as with `gpus_per_learner: 0.5`),
  training side by side without a group; their samples/s summed;
- the baseline, what a Ray Train user's training function runs per worker (`LoaderLoop`): a standard
  torch `DataLoader(num_workers=the same count, pin_memory=True, persistent_workers=True)` whose
  workers compute each utterance's augmentation and filterbanks on the CPU (the same `Corpus`,
  `compute_on: cpu`), batches from the same plan, the same model, loss and optimizer step; run by Ray
  Train's `TorchTrainer` (one worker, `use_gpu`: `ray_train`) where `ray.train` imports, else in a
  plain Ray actor (`torch_dataloader`: the GPU kit's Ray has no `ray.data`, so no `ray.train`). The
  result names which, and why (`baseline`).

Each window reports samples/s, GPU busy % (utilization.gpu sampled every 100 ms: NVML through
`pynvml` when it imports, else `nvidia-smi`; none on a CPU) and the mean seconds a step waited for
its batch. Each contender lives in its own Ray actor through every repeat (its workers warm: one
untimed window first) and reserves a fifth of the GPU, so that all stay resident; only one
contender runs at a time, and each empties its CUDA cache after its window.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import ray
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARE = 0.2  # of the GPU each contender's actor reserves (all resident, one running at a time)
# recipe -> (its spec, overrides): tiny.yaml's and conformer.yaml's models at a GPU batch size (as issue 40
# measured them: 4,959 and 365 samples/s), and the GPU recipe as it is
RECIPES = {"tiny": ("tiny.yaml", ["data.max_batch_seconds=320"]),
           "conformer": ("conformer.yaml", ["data.max_batch_seconds=320", "model.precision=bf16"]),
           "conformer_gpu": ("conformer_gpu.yaml", [])}


def recipe_config(recipe: str, corpus: Path, workers: int, compute_on: str, cpu_overrides: list[str]) -> dict:
    """The recipe's workload sections on `corpus`'s training split, no evaluation splits."""
    from orchestrator.driver.config import load_spec

    spec_file, overrides = RECIPES[recipe]
    spec = load_spec(ROOT / "jobs" / "configs" / spec_file, [*overrides,
        f"data.train={corpus}/train.jsonl", "data.dev=null", "data.test=null", "data.test_unseen=null",
        "data.test_unseen_engine=null", f"data.workers={workers}", f"features.compute_on={compute_on}",
        *cpu_overrides])
    return spec.workload_config.model_dump(mode="json")


class GpuBusy:
    """utilization.gpu of GPU 0 sampled every 100 ms while in the `with` block: `mean`, `max` (None without a GPU)."""

    def __init__(self, device: str):
        self.device, self.samples, self._stop = device, [], threading.Event()

    def _read(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:  # no nvidia-ml-py here: the same counter through nvidia-smi
            return lambda: float(subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, timeout=5).stdout.split()[0])

    def __enter__(self) -> GpuBusy:
        if self.device == "cuda":
            read = self._read()

            def sample():
                while not self._stop.wait(0.1):
                    try:
                        self.samples.append(read())
                    except Exception:  # a sample lost (nvidia-smi slow or failing): the window keeps the others
                        continue
            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.device == "cuda":
            self._thread.join()

    @property
    def stats(self) -> dict:
        if not self.samples:
            return {"mean": None, "max": None}
        return {"mean": round(sum(self.samples) / len(self.samples), 1), "max": max(self.samples)}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@ray.remote
class ChorusLearner:
    """A Chorus learner in its own process, trained in timed windows."""

    def __init__(self, config: dict, threads: int):
        from orchestrator.learner.replica import Learner
        from orchestrator.service.shards import ShardPlanner

        self.learner = Learner("asr", config, seed=0, learner_id=0, planner=ShardPlanner([0]), threads=threads,
                               use_gpu=True)

    def window(self, seconds: float, start_at: float) -> dict:
        """Steps from `start_at` (time.time(), so two learners start together) for `seconds`."""
        learner, samples, steps, waited = self.learner, 0, 0, 0.0
        time.sleep(max(0.0, start_at - time.time()))
        _sync()
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            asked = time.perf_counter()
            batch = learner.next_batch()
            if batch is None:
                learner.start_next_epoch()
                continue
            waited += time.perf_counter() - asked
            learner.apply_step(learner.forward_backward(batch), batch.size)
            samples, steps = samples + batch.size, steps + 1
        _sync()
        elapsed = time.perf_counter() - began
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"samples": samples, "seconds": elapsed, "steps": steps, "wait_s": waited}


@ray.remote
class Baton:
    """Hands Ray Train's worker its windows (it polls) and takes back what each measured."""

    def __init__(self):
        self.asked: dict[int, float | None] = {}
        self.results: dict[int, dict] = {}

    def ask(self, n: int, seconds: float | None) -> None:
        self.asked[n] = seconds  # None: stop

    def next(self, n: int):
        return self.asked.get(n, "wait")

    def put(self, n: int, result: dict) -> None:
        self.results[n] = result

    def get(self, n: int):
        return self.results.get(n)


class LoaderLoop:
    """What a Ray Train user's training function runs per worker: a standard torch `DataLoader` over the
    corpus (`num_workers`, `pin_memory`, `persistent_workers`; each utterance's augmentation and
    filterbanks computed on the CPU in its workers), the same model, loss and optimizer step as a Chorus
    learner, trained in timed windows. `prepare_model`: Ray Train's (`ray.train.torch.prepare_model`),
    or None to move the model to this process's GPU (or CPU) as a plain PyTorch script does."""

    def __init__(self, config: dict, prepare_model=None):
        from torch.utils.data import DataLoader

        from jobs.sections import WorkloadConfig
        from jobs.workload import AsrWorkload

        torch.set_num_threads(1)
        self.workload = AsrWorkload(WorkloadConfig.model_validate(config["workload"]), seed=0)
        corpus, workers = self.workload.train, config["workers"]
        corpus.tokenizer()
        model = self.workload.build_model()
        self.model = prepare_model(model) if prepare_model else model.to(
            "cuda" if torch.cuda.is_available() else "cpu")
        self.optimizer = self.workload.build_optimizer(self.model)
        self.device = next(self.model.parameters()).device
        self.plan = _Plan(self.workload)
        self.loader = DataLoader(_Utterances(corpus), batch_sampler=self.plan, num_workers=workers,
                                 collate_fn=_Collate(corpus), pin_memory=self.device.type == "cuda",
                                 persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
        self.batches, self.step = iter(self.loader), 0

    def window(self, seconds: float, start_at: float | None = None) -> dict:
        """Steps for `seconds` (from `start_at`, a time.time(), when given): samples, steps and data wait."""
        workload, model, optimizer = self.workload, self.model, self.optimizer
        samples, steps, waited = 0, 0, 0.0
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
        _sync()
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            asked = time.perf_counter()
            batch = next(self.batches, None)
            if batch is None:  # the plan's next epoch
                self.plan.epoch += 1
                self.batches = iter(self.loader)
                continue
            waited += time.perf_counter() - asked
            optimizer.zero_grad()
            loss = workload.loss(model, batch)
            loss.backward()
            workload.optimizer_step(model, optimizer, self.step, 0.5)
            loss.item()  # as a Chorus learner reads its loss every step
            samples, steps, self.step = samples + batch.size, steps + 1, self.step + 1
        _sync()
        elapsed = time.perf_counter() - began
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"samples": samples, "seconds": elapsed, "steps": steps, "wait_s": waited}


def ray_train_loop(config: dict) -> None:
    """Ray Train's worker: the `LoaderLoop` with Ray Train's `prepare_model`, in the windows the baton hands it."""
    import ray.train.torch

    loop, baton, n = LoaderLoop(config, ray.train.torch.prepare_model), config["baton"], 0
    while True:
        seconds = ray.get(baton.next.remote(n))
        if seconds == "wait":
            time.sleep(0.05)
            continue
        if seconds is None:
            return
        ray.get(baton.put.remote(n, loop.window(seconds)))
        n += 1


@ray.remote
class TorchLoader:
    """The `LoaderLoop` in a plain Ray actor: the baseline where `ray.train` does not import (a Ray
    without `ray.data`, as the GPU kit's): the same loop a Ray Train worker would run, without Ray Train."""

    def __init__(self, config: dict):
        self.loop = LoaderLoop(config)

    def window(self, seconds: float, start_at: float) -> dict:
        return self.loop.window(seconds, start_at)


class _Plan(torch.utils.data.Sampler):
    """The batch plan a one-learner Chorus job trains on (`jobs.data.manifests.shard_batches`), epoch by
    epoch, as lists of (epoch, utterance) for the dataset."""

    def __init__(self, workload):
        self.workload, self.epoch = workload, 0

    def __iter__(self):
        from jobs.data.manifests import shard_batches

        data = self.workload.config.data
        plan = shard_batches(self.workload.train.durations, data.max_batch_seconds, self.epoch, self.workload.seed)
        return iter([[(self.epoch, i) for i in batch] for batch in plan])


class _Utterances(torch.utils.data.Dataset):
    """(epoch, utterance) -> (utterance, its augmented features for that epoch, on the CPU)."""

    def __init__(self, corpus):
        self.corpus = corpus

    def __getitem__(self, item):
        epoch, i = item
        return i, self.corpus.features(i, epoch)


class _Collate:
    def __init__(self, corpus):
        self.corpus = corpus

    def __call__(self, items):
        return self.corpus._batch([(i, f) for i, f in items if f is not None])


def baseline(asked: str) -> dict:
    """The baseline contender, {"name", "why"}: Ray Train's `TorchTrainer` (`ray_train`) where
    `ray.train` imports and `asked` allows it, else the same loop in a plain Ray actor (`torch_dataloader`)."""
    if asked == "torch":
        return {"name": "torch_dataloader", "why": "asked for (--baseline torch)"}
    try:
        import ray.train.torch  # noqa: F401
    except ImportError as exc:  # a Ray without ray.data (the GPU kit's repacked wheel)
        if asked == "ray_train":
            raise SystemExit(f"bench/gpu.py: --baseline ray_train, but ray.train does not import here: {exc}") from exc
        return {"name": "torch_dataloader", "why": f"ray.train does not import here ({exc}): the loop a Ray Train "
                "worker runs, in a plain Ray actor"}
    return {"name": "ray_train", "why": "ray.train imports here" if asked == "auto" else "asked for"}


def measure(corpus: Path, device: str, repeats: int, window: float, workers: int, recipes: list[str],
            cpu_overrides: list[str], asked_baseline: str = "auto", on_recipe=None) -> dict:
    """Every recipe's contenders, interleaved; samples/s, GPU busy and data wait per window.
    `on_recipe(result so far)` after each recipe (a cut-off run keeps the recipes it measured)."""
    result = {"window_s": window, "workers": workers, "repeats": repeats, "baseline": baseline(asked_baseline),
              "recipes": {}}
    for recipe in recipes:
        result["recipes"][recipe] = RecipeRun(recipe, corpus, device, window, workers, cpu_overrides,
                                              result["baseline"]["name"]).run(repeats)
        if on_recipe is not None:
            on_recipe(result)
    return result


class RecipeRun:
    """One recipe's contenders, started once, measured window by window."""

    def __init__(self, recipe: str, corpus: Path, device: str, window: float, workers: int, overrides: list[str],
                 baseline_name: str):
        self.device, self.window, self.baseline = device, window, baseline_name
        gpu = {"num_gpus": SHARE} if device == "cuda" else {}
        self.config = recipe_config(recipe, corpus, workers, "auto", overrides)
        self.one = ChorusLearner.options(num_cpus=0, **gpu).remote(self.config, workers + 1)
        self.two = [ChorusLearner.options(num_cpus=0, **gpu).remote(self.config, workers + 1) for _ in range(2)]
        self.asked, self.fit, self.loader, self.baton = 0, None, None, None
        self.windows: dict[str, list[dict]] = {"chorus_1": [], "chorus_2_sharing": [], baseline_name: []}
        loop_config = {"workload": recipe_config(recipe, corpus, workers, "cpu", overrides), "workers": workers}
        if baseline_name == "torch_dataloader":
            self.loader = TorchLoader.options(num_cpus=0, **gpu).remote(loop_config)
            return
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        self.baton = Baton.remote()
        trainer = TorchTrainer(ray_train_loop, train_loop_config={**loop_config, "baton": self.baton},
            scaling_config=ScalingConfig(num_workers=1, use_gpu=device == "cuda",
                                         resources_per_worker={"CPU": 0.01, **({"GPU": SHARE} if gpu else {})}),
            run_config=RunConfig(name=f"gpu-learners-{recipe}-{time.time_ns()}",
                                 storage_path=str(ROOT / "bench" / "work" / "gpu" / "ray_results")))
        self.fit = threading.Thread(target=trainer.fit, daemon=True)
        self.fit.start()

    def chorus(self, actors: list, name: str) -> float:
        start_at = time.time() + 0.5
        with GpuBusy(self.device) as busy:
            got = ray.get([a.window.remote(self.window, start_at) for a in actors])
        return self.record(name, got, busy)

    def torch_dataloader(self) -> float:
        return self.chorus([self.loader], "torch_dataloader")

    def ray_train(self) -> float:
        n, self.asked = self.asked, self.asked + 1
        with GpuBusy(self.device) as busy:
            self.baton.ask.remote(n, self.window)
            while (got := ray.get(self.baton.get.remote(n))) is None:
                if not self.fit.is_alive():
                    raise RuntimeError("Ray Train's fit() ended before its window")
                time.sleep(0.05)
        return self.record("ray_train", [got], busy)

    def record(self, name: str, got: list[dict], busy: GpuBusy) -> float:
        row = {"samples_per_s": sum(g["samples"] / g["seconds"] for g in got),
               "data_wait_s_per_step": sum(g["wait_s"] for g in got) / max(1, sum(g["steps"] for g in got)),
               "steps": sum(g["steps"] for g in got), "gpu_busy": busy.stats}
        self.windows[name].append(row)
        return row["samples_per_s"]

    def run(self, repeats: int) -> dict:
        from harness.stats import compare, interleaved, summary

        contenders = {"chorus_1": lambda _r: self.chorus([self.one], "chorus_1"),
                      "chorus_2_sharing": lambda _r: self.chorus(self.two, "chorus_2_sharing"),
                      self.baseline: lambda _r: getattr(self, self.baseline)()}
        try:
            for name, run in contenders.items():  # warm-up windows (workers started, kernels chosen), not kept
                run(-1)
                self.windows[name].clear()
            runs = interleaved(contenders, repeats=repeats)
        finally:
            if self.fit is not None:
                self.baton.ask.remote(self.asked, None)
                self.fit.join(timeout=120)
            for actor in [self.one, *self.two, self.baton, self.loader]:
                if actor is not None:
                    ray.kill(actor)
        stats = {name: summary(values) for name, values in runs.items()}
        busy = {n: [w["gpu_busy"]["mean"] for w in ws if w["gpu_busy"]["mean"] is not None]
                for n, ws in self.windows.items()}
        return {"samples_per_s": stats, "window_s": self.window, "repeats": repeats,
                "workers": self.config["data"]["workers"],
                "gpu_busy_mean": {n: summary(b) if len(b) == len(self.windows[n]) else None
                                  for n, b in busy.items()},
                "data_wait_s_per_step": {n: summary([w["data_wait_s_per_step"] for w in ws])
                                         for n, ws in self.windows.items()},
                "windows": self.windows, "baseline": self.baseline,
                "chorus_over_baseline": compare(stats["chorus_1"], stats[self.baseline]),
                "two_sharing_over_one": compare(stats["chorus_2_sharing"], stats["chorus_1"]),
                "parameters": _parameters(self.config)}


def _parameters(config: dict) -> int:
    from jobs.sections import WorkloadConfig
    from jobs.workload import AsrWorkload

    return sum(p.numel() for p in AsrWorkload(WorkloadConfig.model_validate(config), seed=0).build_model().parameters())
