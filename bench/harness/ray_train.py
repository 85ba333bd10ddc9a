"""The Ray Train baseline, once, for every benchmark that races Chorus against it: Ray Train's
`TorchTrainer` (DDP over gloo) training the same workload as a Chorus learner
(`jobs.workload.AsrWorkload`: its shards, batches, features, loss, AdamW step and learning-rate
schedule), the way Ray Train's guide writes a loop. A benchmark says what differs in a `Plan`: when
the run stops (an epoch budget, seconds after the first step, a time, a file appearing, a dev WER
reached), how often rank 0 evaluates `dev`, which rank is slowed and by how much, when it reports a
checkpoint, whether it resumes from Ray Train's latest checkpoint (its elastic restarts), and which
window's samples it counts.

Every rank takes the same number of steps an epoch (the fewest any shard has: DistributedSampler's
`drop_last`). After each step rank 0 decides (`Plan.decide`) and broadcasts two flags, evaluate
now and stop, so all ranks agree when to do either; rank 0 evaluates while the others wait, as a
DDP loop does. Reports (every rank, rank 0 with a checkpoint of its model and optimizer, so Ray
Train keeps their metrics as the result's) come at the points the plan asks for and always at the
end; the metrics are global: samples, samples in the window, the earliest first step, a mark
(time, samples so far) at each epoch's end, rank 0's dev curve (time, WER, loss), the time the
target WER was reached.

Example:
    >>> plan = Plan(workload=spec.workload_config.model_dump(mode="json"), seed=0, epochs=4)  # doctest: +SKIP
    >>> metrics, started = fit(plan, workers=2, storage=Path("/tmp/rt"), name="vs-chorus")  # doctest: +SKIP
    >>> metrics["first_step_at"] - started  # the start-up  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from ray import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray Train's workers cannot import bench/ modules


@dataclasses.dataclass
class Plan:
    """What one baseline run does; the fields left None do not apply.

    Attributes:
        workload: the Chorus job's workload section (`WorkloadConfig`, as JSON).
        seed: the job's seed.
        epochs: stop after this many epochs.
        wall_s: stop this many seconds after the first step.
        until: stop at this `time.time()`.
        stop_file: stop once this file exists.
        target_wer: stop once rank 0's dev WER is at or below it (with `eval_every_s`).
        eval_every_s: rank 0 evaluates `dev` this often; `final_eval`: once more at the end.
        lr_over: what the schedule's progress is a fraction of: "epochs" (`lr_epochs`, else
            `epochs`), "wall" (`wall_s` after the first step) or "none" (always 0).
        report: when every rank reports, besides the end: "epoch" (each epoch's end), "eval" (each
            evaluation), "steps" (every `report_steps` steps, with the step and epoch to resume
            from), "end" (only at the end).
        resume: start from Ray Train's latest checkpoint when there is one (its restarts).
        slow_rank, slow_factor: that rank sleeps (factor - 1) x its compute before its gradients
            are all-reduced, as a Chorus learner under `simulate.slowdown` does.
        step_log: every rank appends "time world rank group-start" for each step it takes.
        window: (from, to) in `time.time()`: the samples of steps finished inside it are counted.
    """

    workload: dict
    seed: int
    epochs: int | None = None
    wall_s: float | None = None
    until: float | None = None
    stop_file: str | None = None
    target_wer: float | None = None
    eval_every_s: float | None = None
    final_eval: bool = False
    lr_over: str = "epochs"
    lr_epochs: int | None = None
    report: str = "epoch"
    report_steps: int = 10
    resume: bool = False
    slow_rank: int | None = None
    slow_factor: float = 1.0
    step_log: str | None = None
    window: tuple[float, float] | None = None

    def progress(self, epoch: int, now: float, first: float) -> float:
        """The learning-rate schedule's progress in [0, 1]."""
        if self.lr_over == "wall":
            return min(1.0, (now - first) / self.wall_s)
        if self.lr_over == "epochs":
            return min(1.0, epoch / (self.lr_epochs or self.epochs))
        return 0.0

    def decide(self, now: float, first: float, last_eval: float) -> tuple[bool, bool]:
        """Rank 0's (evaluate now, stop) after a step."""
        stop = (self.wall_s is not None and now - first >= self.wall_s) or \
            (self.until is not None and now >= self.until) or \
            (self.stop_file is not None and Path(self.stop_file).exists())
        evaluate = self.eval_every_s is not None and now - last_eval >= self.eval_every_s and not stop
        return evaluate, stop


def loop(config: dict) -> None:
    """One Ray Train worker, following the plan in `config["plan"]`."""
    import itertools

    import torch
    import torch.distributed as dist

    plan = Plan(**config["plan"])
    worker = _Worker(plan)
    flags = torch.zeros(2)  # [evaluate now, stop], rank 0's decision
    while not flags[1] and (plan.epochs is None or worker.epoch < plan.epochs):
        batches = worker.workload.batches(worker.rank, worker.world, worker.epoch)
        count = torch.tensor([float(len(batches))])
        dist.all_reduce(count, op=dist.ReduceOp.MIN)  # the same steps on every rank (drop_last)
        for batch in itertools.islice(batches, int(count.item())):
            worker.step(batch)
            if worker.rank == 0:
                flags[:] = torch.tensor([float(f) for f in plan.decide(time.time(), worker.first, worker.last_eval)])
            dist.broadcast(flags, 0)
            if flags[0]:
                worker.evaluate(flags)
                dist.broadcast(flags, 0)  # a target reached stops everyone
                if plan.report == "eval":
                    worker.report()
            if plan.report == "steps" and worker.steps % plan.report_steps == 0:
                worker.report()
            if flags[1]:
                break
        else:
            worker.epoch += 1
            worker.mark()
            if plan.report == "epoch":
                worker.report()
    if flags[1]:  # stopped inside an epoch: its samples so far
        worker.mark()
    if plan.final_eval:
        worker.evaluate(flags)
    if plan.final_eval or worker.reported != (worker.steps, worker.epoch):
        worker.report()


class _Worker:
    """One rank's model, optimizer and counts; its step, evaluation and report."""

    def __init__(self, plan: Plan):
        import ray.train
        import ray.train.torch
        import torch

        from jobs.sections import WorkloadConfig
        from jobs.workload import AsrWorkload

        ctx = ray.train.get_context()
        self.plan, self.rank, self.world = plan, ctx.get_world_rank(), ctx.get_world_size()
        torch.set_num_threads(1)
        self.workload = AsrWorkload(WorkloadConfig.model_validate(plan.workload), seed=plan.seed)
        model = self.workload.build_model()
        self.optimizer = self.workload.build_optimizer(model)
        self.steps = self.epoch = self.samples = self.in_window = 0
        self.first, self.last_eval, self.reached, self.reported = None, None, None, None
        self.marks: list[tuple[float, int]] = []
        self.curve: list[tuple[float, float, float]] = []
        checkpoint = ray.train.get_checkpoint() if plan.resume else None
        if checkpoint:
            with checkpoint.as_directory() as path:
                state = torch.load(Path(path, "checkpoint.pt"), weights_only=True)
            model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.steps, self.epoch = state["step"], state["epoch"]
        self.model = ray.train.torch.prepare_model(model)
        self.started = time.time()  # this worker group's start (Ray Train restarts the whole group)
        self.clock = {"compute": 0.0, "step": 0, "slept": -1, "slept_s": 0.0}
        if self.rank == plan.slow_rank:
            self.model.register_comm_hook(self.clock, slow_allreduce_hook(plan.slow_factor))

    def step(self, batch) -> None:
        now = time.time()
        self.first, self.last_eval = self.first or now, self.last_eval or now
        began, self.clock["step"], self.clock["slept_s"] = time.perf_counter(), self.steps, 0.0
        self.optimizer.zero_grad()
        self.workload.loss(self.model, batch).backward()
        self.clock["compute"] = time.perf_counter() - began - self.clock["slept_s"]
        self.workload.optimizer_step(self.model, self.optimizer, self.steps,
                                     self.plan.progress(self.epoch, now, self.first))
        self.steps, self.samples = self.steps + 1, self.samples + batch.size
        done = time.time()
        if self.plan.window and self.plan.window[0] <= done <= self.plan.window[1]:
            self.in_window += batch.size
        if self.plan.step_log:
            with open(self.plan.step_log, "a") as f:
                f.write(f"{done} {self.world} {self.rank} {self.started}\n")

    def evaluate(self, flags) -> None:
        """Rank 0 scores `dev` (the others wait in the next collective); a target reached stops."""
        if self.rank != 0:
            return
        result = self.workload.evaluate(self.model.module, "dev")
        self.curve.append((time.time(), result["wer"], result["loss"]))
        self.last_eval = time.time()
        if self.plan.target_wer is not None and result["wer"] <= self.plan.target_wer and self.reached is None:
            self.reached, flags[1] = time.time(), 1.0

    def total(self, value: float, op: str = "SUM") -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return float(tensor.item())

    def mark(self) -> None:
        self.marks.append((time.time(), int(self.total(self.samples))))

    def report(self) -> None:
        import tempfile

        import ray.train
        import torch

        metrics = {"epochs": self.epoch, "steps": self.steps, "samples": int(self.total(self.samples)),
                   "in_window": int(self.total(self.in_window)),
                   "first_step_at": self.total(self.first or time.time(), "MIN"), "marks": self.marks,
                   "curve": self.curve, "reached_at": self.reached}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if self.rank == 0:
                torch.save({"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "step": self.steps, "epoch": self.epoch}, Path(tmp, "checkpoint.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)
        self.reported = (self.steps, self.epoch)


def slow_allreduce_hook(factor: float):
    """A DDP communication hook for the slowed rank: before its first gradient bucket of a step is
    all-reduced it sleeps (factor - 1) x the compute (forward + backward) of its previous step --
    the place and length of a Chorus learner's `simulate.slowdown`, which sleeps before its
    gradients are exchanged. Sleeping after the all-reduce instead would let the other ranks
    compute during the sleep and the slowed rank compute alone on the shared cores, which a slow
    GPU does not buy. Not quite the same place: DDP's first bucket (1 MiB: the output layer and
    the last LSTM layer's smaller weights) is ready before backward ends, so the slowed rank does
    the rest of its backward after the sleep while the others wait on that bucket, a few percent
    of a step that the slowed rank computes on emptier cores than a Chorus learner would."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(clock: dict, bucket):
        if clock["slept"] != clock["step"]:
            clock["slept"] = clock["step"]
            pause = clock["compute"] * (factor - 1.0)
            time.sleep(pause)
            clock["slept_s"] = pause
        return allreduce_hook(None, bucket)

    return hook


def fit(plan: Plan, workers: int | tuple[int, int], storage: Path, name: str, resources: dict | None = None,
        max_failures: int = 0, resize_every_s: float | None = None) -> tuple[dict, float]:
    """Train with Ray Train on the connected cluster: `workers` (a (min, max) pair: its elastic
    mode, checking for room every `resize_every_s`), each with `resources` (one CPU by default),
    restarted up to `max_failures` times. Returns rank 0's last report and the time `fit()` was
    called."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    scaling = {"elastic_resize_monitor_interval_s": resize_every_s} if resize_every_s else {}
    trainer = TorchTrainer(
        loop, train_loop_config={"plan": dataclasses.asdict(plan)},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                     resources_per_worker=resources or {"CPU": 1}, **scaling),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=f"{name}-{time.time_ns()}", storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=max_failures)))
    started = time.time()
    return trainer.fit().metrics, started
