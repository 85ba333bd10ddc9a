"""The Ray Train baseline of benchmarks that race Chorus against a wall budget: `TorchTrainer` (DDP
over gloo) training the same workload as a Chorus learner (`jobs.workload.AsrWorkload`: its
shards, batches, features, loss and AdamW step, and its learning-rate schedule over the budget's
fraction spent), the way Ray Train's guide writes a loop. Used by bench/network.py.

Every rank takes the same number of steps an epoch (the fewest any shard has: DistributedSampler's
`drop_last`); after each step rank 0 broadcasts two flags, evaluate now and stop (the budget is
spent), so all ranks agree when to do either. Rank 0 evaluates `dev` every `eval_every` seconds
while the others wait (as a DDP loop does), and always once at the end. It reports (at the end,
from rank 0): the first step's time (the earliest rank's), the end, the global samples and steps,
and the dev curve as (time.time(), WER, loss), with a checkpoint of its model and optimizer.

Example:
    >>> result = run(workload_config, seed=0, workers=4, wall_seconds=60, eval_every=None,  # doctest: +SKIP
    ...              storage=Path("/tmp/rt"), resources={"CPU": 1})
    >>> result["samples"] / (result["ended_at"] - result["first_step_at"])  # doctest: +SKIP
"""

from __future__ import annotations

import time
from pathlib import Path


def loop(config: dict) -> None:
    """One Ray Train worker."""
    import itertools
    import tempfile

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
    wall, every = config["wall_seconds"], config["eval_every"]
    flags = torch.zeros(2)  # [evaluate now, stop], rank 0's decision
    step = samples = epoch = 0
    first = last_eval = None
    curve: list[tuple[float, float, float]] = []

    def evaluate() -> None:
        result = workload.evaluate(model.module, "dev")
        curve.append((time.time(), result["wer"], result["loss"]))

    while not flags[1]:
        batches = workload.batches(rank, world, epoch)
        count = torch.tensor([float(len(batches))])
        dist.all_reduce(count, op=dist.ReduceOp.MIN)  # the same steps on every rank (drop_last)
        for batch in itertools.islice(batches, int(count.item())):
            now = time.time()
            first = first or now
            last_eval = last_eval or now
            optimizer.zero_grad()
            workload.loss(model, batch).backward()
            workload.optimizer_step(model, optimizer, step, min(1.0, (now - first) / wall))
            step, samples = step + 1, samples + batch.size
            if rank == 0:
                flags[0] = float(every is not None and time.time() - last_eval >= every)
                flags[1] = float(time.time() - first >= wall)
            dist.broadcast(flags, 0)
            if flags[0] and not flags[1]:
                if rank == 0:
                    evaluate()
                    last_eval = time.time()
                dist.barrier()
            if flags[1]:
                break
        epoch += 1
    ended = time.time()
    totals = torch.tensor([float(samples)])
    dist.all_reduce(totals)
    earliest = torch.tensor([first], dtype=torch.float64)
    dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
    if rank == 0:
        evaluate()
    metrics = {"first_step_at": float(earliest.item()), "ended_at": ended, "samples": int(totals.item()),
               "steps": step, "epochs": epoch, "curve": curve}
    # with a checkpoint of rank 0's (Ray Train keeps the metrics that come with one as the result's;
    # a Chorus job also checkpoints at its last evaluation)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                       Path(tmp, "checkpoint.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def run(workload_config: dict, seed: int, workers: int, wall_seconds: float, eval_every: float | None,
        storage: Path, resources: dict) -> dict:
    """Train with Ray Train on the connected cluster for `wall_seconds` after the first step;
    returns rank 0's report and `started_at` (the time `fit()` was called)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        loop, train_loop_config={"workload": workload_config, "seed": seed, "wall_seconds": wall_seconds,
                                 "eval_every": eval_every},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker=resources),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=f"baseline-{time.time_ns()}", storage_path=str(storage)))
    started = time.time()
    metrics = trainer.fit().metrics
    return {**metrics, "started_at": started}
