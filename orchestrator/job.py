"""TrainingJob: run a job spec to the end of its budget, evaluating on `dev` as it goes, then on
`test` and `test_unseen`; checkpoint into the output folder and write `summary.json`.

For now the job runs one learner in-process; learner groups on Ray build on the same loop.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from jobs.workload import AsrWorkload
from orchestrator.config import JobSpec

Report = Callable[[dict], None]


class TrainingJob:
    """Train `spec` and write its results into `out_dir`.

    Args:
        spec: a validated job spec.
        out_dir: where `checkpoint.pt`, `evals.jsonl` and `summary.json` go.
        report: called with each evaluation's record (the CLI prints a console line from it).
    """

    def __init__(self, spec: JobSpec, out_dir: str | Path, report: Report | None = None):
        self.spec, self.out_dir = spec, Path(out_dir)
        self.report = report or (lambda record: None)
        self.workload = AsrWorkload(spec, seed=spec.seed)
        self.evals: list[dict] = []

    def _progress(self, epoch: int, batch_no: int, batches: int, elapsed: float) -> float:
        b = self.spec.budget
        fractions = []
        if b.epochs is not None:
            fractions.append((epoch + batch_no / max(1, batches)) / b.epochs)
        if b.wall_seconds is not None:
            fractions.append(elapsed / b.wall_seconds)
        return max(fractions)

    def run(self) -> dict:
        spec, w = self.spec, self.workload
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "evals.jsonl").write_text("")
        start = time.monotonic()
        model = w.build_model()
        optimizer = w.build_optimizer(model)
        model.train()
        step = samples = 0
        epoch, position = 0, 0.0  # position: epochs done, fractional
        loss_sum, loss_n = 0.0, 0
        first_loss = None
        last_eval = start
        out_of_time = False
        while not out_of_time and (spec.budget.epochs is None or epoch < spec.budget.epochs):
            batches = w.batches(rank=0, world_size=1, epoch=epoch)
            for batch_no, batch in enumerate(batches):
                elapsed = time.monotonic() - start
                if spec.budget.wall_seconds is not None and elapsed >= spec.budget.wall_seconds:
                    out_of_time = True
                    break
                optimizer.zero_grad(set_to_none=True)
                loss = w.loss(model, batch)
                loss.backward()
                w.optimizer_step(model, optimizer, step, self._progress(epoch, batch_no, len(batches), elapsed))
                step += 1
                samples += batch.size
                position = epoch + (batch_no + 1) / len(batches)
                loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
                first_loss = loss.item() if first_loss is None else first_loss
                every = spec.budget.eval_every_seconds
                if every is not None and time.monotonic() - last_eval >= every:
                    self._evaluate(model, optimizer, position, step, samples, loss_sum / loss_n, start)
                    loss_sum, loss_n, last_eval = 0.0, 0, time.monotonic()
            else:
                epoch += 1
                if epoch % spec.budget.eval_every_epochs == 0 and loss_n:
                    self._evaluate(model, optimizer, epoch, step, samples, loss_sum / loss_n, start)
                    loss_sum, loss_n, last_eval = 0.0, 0, time.monotonic()
        train_wall = time.monotonic() - start
        if loss_n:  # the last partial stretch still gets its evaluation
            self._evaluate(model, optimizer, position, step, samples, loss_sum / loss_n, start)
        summary = self._summarize(model, step, samples, train_wall, time.monotonic() - start, first_loss)
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _evaluate(self, model, optimizer, epoch: float, step: int, samples: int, train_loss: float,
                  start: float) -> None:
        record = {"epoch": round(epoch, 3), "step": step, "samples": samples,
                  "train_loss": round(train_loss, 4)}
        if self.spec.data.dev is not None:
            dev = self.workload.evaluate(model, self.spec.data.dev)
            record.update(dev_wer=round(dev["wer"], 2), dev_loss=round(dev["loss"], 4))
        record["wall_s"] = round(time.monotonic() - start, 2)
        self.evals.append(record)
        with open(self.out_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self.save_checkpoint(model, optimizer, {"epoch": epoch, "step": step, "samples": samples})
        self.report(record)

    def save_checkpoint(self, model, optimizer, counters: dict) -> Path:
        """Write the job's state atomically to `checkpoint.pt` (spec, model, optimizer, counters)."""
        path = self.out_dir / "checkpoint.pt"
        state = {"spec": self.spec.model_dump(mode="json"), "counters": counters,
                 **self.workload.state_dict(model, optimizer)}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def _summarize(self, model, steps: int, samples: int, train_wall: float, wall: float,
                   first_loss: float | None) -> dict:
        d = self.spec.data
        finals = {}
        for key, source in (("test", d.test), ("test_unseen", d.test_unseen)):
            result = self.workload.evaluate(model, source) if source is not None else None
            finals[f"wer_{key}"] = round(result["wer"], 2) if result else None
            finals[f"utterances_{key}"] = result["utterances"] if result else 0
        last = self.evals[-1] if self.evals else {}
        skipped = self.workload.skipped()
        return {
            "name": self.spec.name,
            **finals,
            "wer_dev": last.get("dev_wer"),
            "first_train_loss": round(first_loss, 4) if first_loss is not None else None,
            "final_train_loss": last.get("train_loss"),
            "steps": steps,
            "samples": samples,
            "epochs": last.get("epoch", 0),
            "wall_s": round(wall, 2),
            "train_wall_s": round(train_wall, 2),
            "samples_per_s": round(samples / max(train_wall, 1e-9), 2),
            "learners": 1,
            "skipped_utterances": dict(skipped.counts),
            "checkpoint": str(self.out_dir / "checkpoint.pt"),
        }
