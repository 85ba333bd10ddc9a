"""TrainingJob: place the learners, run their group for the spec's budget, evaluate the average of
all learners' weights on `dev` as it goes and on `test`/`test_unseen` at the end, checkpoint the
whole job (every learner's state and counters) into the output folder, resume from it, and write
`summary.json`.

Jobs with more than one learner run on Ray (one actor per learner, one placement group per job);
a one-learner job runs the same learner in this process.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from jobs.workload import AsrWorkload, WorkloadConfig
from orchestrator.config import JobSpec
from orchestrator.groups import AllreduceMember, GossipMember, HierarchicalMember, SoloMember, ring_partners
from orchestrator.metrics import JobMetrics
from orchestrator.placement import InProcessLearner, fetch, place_learners, release

Report = Callable[[dict], None]
CHUNK_STEPS = 8  # steps per `run` call: how often the driver looks at budget and evaluations


class TrainingJob:
    """Train `spec` and write its results into `out_dir`.

    Args:
        spec: a validated job spec.
        out_dir: where `checkpoint.pt`, `evals.jsonl` and `summary.json` go.
        report: called with each evaluation's record (the CLI prints a console line from it).
        resume: continue from `out_dir/checkpoint.pt` (its counters, weights and curve).
        use_ray: run the learners as Ray actors (default: when there is more than one learner).
    """

    def __init__(self, spec: JobSpec, out_dir: str | Path, report: Report | None = None, resume: bool = False,
                 use_ray: bool | None = None):
        self.use_ray = spec.learners > 1 if use_ray is None else use_ray
        self.node_groups: list[list[int]] = []  # hierarchical: learner indices per node
        self.spec, self.out_dir, self.resume = spec, Path(out_dir), resume
        self.report = report or (lambda record: None)
        self.workload = AsrWorkload(spec, seed=spec.seed)  # the driver's copy, for evaluation
        self.job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        self.evals: list[dict] = []
        self.eval_model = self.workload.build_model()
        self.metrics: JobMetrics | None = None  # made once Ray is connected (or known not to be)

    # -- placement ------------------------------------------------------------------------------
    def _start_learners(self):
        spec = self.spec
        config = WorkloadConfig.model_validate(spec.model_dump(include={"data", "features", "model", "optim"}))
        raw = config.model_dump(mode="json")
        if not self.use_ray:
            threads = int(spec.cpus_per_learner) if spec.cpus_per_learner else (os.cpu_count() or 1)
            handles = [InProcessLearner(raw, spec.seed, 0, 1, threads)]
            members = [SoloMember()]
            return None, handles, members
        import ray

        if not ray.is_initialized():
            ray.init()
        pg, handles = place_learners(self.job_id, spec.learners, spec.cpus_per_learner or 1.0, raw, spec.seed)
        return pg, handles, self._members(handles)

    def _members(self, handles) -> list:
        n, kind = len(handles), self.spec.group.kind
        if n == 1:
            return [SoloMember()]
        if kind == "gossip":
            return [GossipMember(i, [handles[q] for q in ring_partners(i, n)], self.spec.seed) for i in range(n)]
        backend = "nccl" if set(fetch([h.device.remote() for h in handles])) == {"cuda"} else "gloo"
        if kind == "hierarchical":
            return self._hierarchical_members(handles, backend)
        ip, port = fetch([handles[0].ip.remote(), handles[0].free_port.remote()])
        return [AllreduceMember(i, n, f"{ip}:{port}", backend) for i in range(n)]

    def _hierarchical_members(self, handles, backend: str) -> list:
        """Learners grouped by the node they run on; each node's first learner leads it on the
        leaders' gossip ring."""
        by_node: dict[str, list[int]] = {}
        for i, node in enumerate(fetch([h.node_id.remote() for h in handles])):
            by_node.setdefault(node, []).append(i)
        nodes = list(by_node.values())
        leaders = [idxs[0] for idxs in nodes]
        members: list = [None] * len(handles)
        for k, idxs in enumerate(nodes):
            ip, port = fetch([handles[idxs[0]].ip.remote(), handles[idxs[0]].free_port.remote()])
            ring = GossipMember(k, [handles[leaders[q]] for q in ring_partners(k, len(nodes))], self.spec.seed)
            for j, i in enumerate(idxs):
                members[i] = HierarchicalMember(j, len(idxs), f"{ip}:{port}", ring if j == 0 else None, backend)
        self.node_groups = nodes
        return members

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        self.started_at = time.time()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        pg, handles = None, []
        try:
            pg, handles, members = self._start_learners()
            wall_before = self._restore(handles) if self.resume else 0.0
            if not self.resume:
                (self.out_dir / "evals.jsonl").write_text("")
            fetch([h.join.remote(m) for h, m in zip(handles, members, strict=True)])
            fetch([handles[i].set_slowdown.remote(f) for i, f in self.spec.simulate.slowdown.items()])
            return self._train(handles, members, wall_before)
        finally:
            if handles:
                try:
                    fetch([h.close.remote() for h in handles])
                except Exception:
                    pass
            if pg is not None:
                release(pg, handles)

    def _train(self, handles, members, wall_before: float) -> dict:
        b = self.spec.budget
        start = time.time() - wall_before
        deadline = start + b.wall_seconds if b.wall_seconds is not None else None
        collective = members[0].lockstep  # learners must take the same steps: the driver decides when to stop
        lockstep = collective or isinstance(handles[0], InProcessLearner)  # drive in rounds
        self.metrics = JobMetrics(self.job_id, self._group_name(len(handles)), enabled=self.use_ray)
        self.metrics.learners(len(handles))
        stats = fetch([h.counters.remote() for h in handles])
        first_loss = None
        next_eval_epoch = (min(s["epoch"] for s in stats) // b.eval_every_epochs + 1) * b.eval_every_epochs
        last_eval = time.time()
        losses: list[float] = []

        def progress() -> float:
            fractions = []
            if b.epochs is not None:
                fractions.append(sum(s["epoch"] for s in stats) / len(stats) / b.epochs)
            if deadline is not None:
                fractions.append((time.time() - start) / b.wall_seconds)
            return min(1.0, max(fractions))

        def done(s) -> bool:
            out_of_epochs = b.epochs is not None and s["epoch"] >= b.epochs
            return out_of_epochs or (deadline is not None and time.time() >= deadline)

        def dispatch(i):
            return handles[i].run.remote(CHUNK_STEPS, None if collective else deadline, b.epochs, progress())

        pending = {} if lockstep else {dispatch(i): i for i in range(len(handles)) if not done(stats[i])}
        while True:
            if lockstep:
                if done(stats[0]):
                    break
                results = list(enumerate(fetch([dispatch(i) for i in range(len(handles))])))
            else:
                if not pending:
                    break
                results = _wait_any(pending)
            for i, s in results:
                stats[i] = s
                self.metrics.learner_chunk(i, s)
                if s["loss"] is not None:
                    losses.append(s["loss"])
                    first_loss = s["loss"] if first_loss is None else first_loss
                if not lockstep and not done(s):
                    pending[dispatch(i)] = i
            epoch_now = min(s["epoch"] for s in stats)
            due = epoch_now >= next_eval_epoch or (
                b.eval_every_seconds is not None and time.time() - last_eval >= b.eval_every_seconds)
            if due and losses:
                self._evaluate(handles, stats, sum(losses) / len(losses), start)
                losses, last_eval = [], time.time()
                next_eval_epoch = (epoch_now // b.eval_every_epochs + 1) * b.eval_every_epochs
        train_wall = time.time() - start
        if losses:
            self._evaluate(handles, stats, sum(losses) / len(losses), start)
        summary = self._summarize(stats, train_wall, time.time() - start, first_loss)
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    # -- evaluation and checkpoints ---------------------------------------------------------------
    def _average_model(self, states: list[dict]) -> float:
        """Load the average of the learners' models into the evaluation model (floating-point
        parameters and buffers averaged, integer buffers taken from learner 0); returns the
        consensus distance (mean L2 distance of each learner's trainable weights to their mean)."""
        models = [s["model"] for s in states]
        mean = {k: torch.stack([m[k] for m in models]).mean(0) if v.is_floating_point() else v
                for k, v in models[0].items()}
        self.eval_model.load_state_dict(mean)
        trainable = [k for k, p in self.eval_model.named_parameters() if p.requires_grad]
        flat = torch.stack([torch.cat([m[k].reshape(-1) for k in trainable]) for m in models])
        flat_mean = torch.cat([mean[k].reshape(-1) for k in trainable])
        return float((flat - flat_mean).norm(dim=1).mean())

    def _evaluate(self, handles, stats: list[dict], train_loss: float, start: float) -> None:
        states = fetch([h.state.remote() for h in handles])  # one read serves the average and the checkpoint
        consensus = self._average_model(states)
        epoch = sum(s["epoch"] for s in stats) / len(stats)
        record = {"epoch": round(epoch, 3), "step": sum(s["step"] for s in stats) // len(stats),
                  "samples": sum(s["samples"] for s in stats), "train_loss": round(train_loss, 4)}
        if len(handles) > 1:
            record["consensus_distance"] = round(consensus, 6)
            self.metrics.consensus(consensus)
        if self.spec.data.dev is not None:
            dev = self.workload.evaluate(self.eval_model, self.spec.data.dev)
            record.update(dev_wer=round(dev["wer"], 2), dev_loss=round(dev["loss"], 4))
            self.metrics.evaluation("dev", dev["wer"])
        record["wall_s"] = round(time.time() - start, 2)
        self.evals.append(record)
        with open(self.out_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self.save_checkpoint(states, record["wall_s"])
        self.report(record)

    def save_checkpoint(self, states: list[dict], wall_s: float) -> Path:
        """Write the whole job atomically to `checkpoint.pt`: spec, every learner's state, the
        averaged model (what `chorus eval` reads) and the curve so far."""
        path = self.out_dir / "checkpoint.pt"
        state = {"spec": self.spec.model_dump(mode="json"), "learners": states,
                 "model": self.eval_model.state_dict(), "job": {"wall_s": wall_s, "evals": self.evals}}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    def _restore(self, handles) -> float:
        path = self.out_dir / "checkpoint.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no checkpoint to resume from")
        state = torch.load(path, map_location="cpu", weights_only=False)
        if len(state["learners"]) != len(handles):
            raise ValueError(f"{path}: has {len(state['learners'])} learners, the spec asks for {len(handles)}")
        fetch([h.load_state.remote(s) for h, s in zip(handles, state["learners"], strict=True)])
        self.evals = list(state["job"]["evals"])
        # the curve as of the checkpoint: drop evaluations a stopped run wrote after it
        (self.out_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.evals))
        return float(state["job"]["wall_s"])

    def _startup_s(self, stats: list[dict]) -> float | None:
        """Seconds from `run()` to the first completed training step of any learner."""
        firsts = [s["first_step_at"] for s in stats if s.get("first_step_at") is not None]
        return round(min(firsts) - self.started_at, 3) if firsts else None

    def _group_name(self, learners: int) -> str:
        return self.spec.group.kind if learners > 1 else "solo"

    def _summarize(self, stats: list[dict], train_wall: float, wall: float, first_loss: float | None) -> dict:
        d = self.spec.data
        finals = {}
        for key, source in (("test", d.test), ("test_unseen", d.test_unseen)):
            result = self.workload.evaluate(self.eval_model, source) if source is not None else None
            if result:
                self.metrics.evaluation(key, result["wer"])
            finals[f"wer_{key}"] = round(result["wer"], 2) if result else None
            finals[f"utterances_{key}"] = result["utterances"] if result else 0
        last = self.evals[-1] if self.evals else {}
        samples = sum(s["samples"] for s in stats)
        return {
            "name": self.spec.name,
            "job_id": self.job_id,
            **finals,
            "wer_dev": last.get("dev_wer"),
            "first_train_loss": round(first_loss, 4) if first_loss is not None else None,
            "final_train_loss": last.get("train_loss"),
            "steps": max(s["step"] for s in stats),
            "samples": samples,
            "epochs": last.get("epoch", 0),
            "wall_s": round(wall, 2),
            "startup_s": self._startup_s(stats),
            "train_wall_s": round(train_wall, 2),
            "samples_per_s": round(samples / max(train_wall, 1e-9), 2),
            "learners": len(stats),
            "group": self._group_name(len(stats)),
            "consensus_distance": last.get("consensus_distance"),
            "skipped_utterances": dict(self.workload.train.skipped.counts) if self.evals else {},
            "checkpoint": str(self.out_dir / "checkpoint.pt"),
        }


def _wait_any(pending: dict) -> list[tuple[int, dict]]:
    import ray

    ready, _ = ray.wait(list(pending), num_returns=1)
    return [(pending.pop(ref), ray.get(ref)) for ref in ready]
