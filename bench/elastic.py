"""Benchmark: how long a group takes to step again after its membership changes, for Chorus
`gossip` and `allreduce` and for Ray Train's elastic `TorchTrainer`, measured in one run.

Each contender runs `tiny.yaml`'s model on a `ray.cluster_utils.Cluster` on this machine: a head
without learner slots and node A with 2 slots (a custom `learner_slot` resource), so the job
starts with 2 learners and may grow to 3 (`learners: {min: 2, max: 3}`; Ray Train:
`ScalingConfig(num_workers=(2, 3))` with `FailureConfig(max_failures=...)`, its elastic mode).
Then, while it trains:

1. arrival: node B with one slot joins the cluster (`ray start --block` in a child process,
   stopped by its process group afterwards). Measured: to the first step the group completes
   with the newcomer in it, from the node's start ("capacity added"), and for Chorus also from
   the new learner being ready ("ready": its process started, model built, state loaded — the
   arrival the targets are about; the few seconds before it are Ray starting a worker process
   and torch being imported, which no group can skip).
2. failure, `--kills` times (5 by default): one learner's process is killed with SIGKILL, the
   same for every contender (Chorus: the learner actor's process; Ray Train: one worker
   process); until 092cbcc Chorus's learners were stopped with `ray.kill` instead. Measured:
   from the kill to the first step completed by the group without it. The freed slot is placed
   again, so each kill is followed by another arrival (measured as in 1, capacity added = the
   moment the dead learner's slot was released; Ray Train restarts its group with whatever
   fits, so it has no separate arrival there).

Chorus's times come from the job's `recoveries` (the time of the change, of the re-formed group,
of the first step after it); Ray Train's from every worker logging each step's time and world
size. Targets (Chorus, this machine): failure and arrival (ready -> stepping) <= 2 s for
gossip, <= 5 s for allreduce. Writes `bench/results/elastic.json` and `elastic.png`.

Every figure is the median [IQR] over the events.

Usage: .venv/bin/python bench/elastic.py [--kills 5]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness import ray_train  # noqa: E402
from harness.faults import sigkill, train_worker_pids  # noqa: E402
from harness.results import write_results  # noqa: E402
from harness.stats import MIN_REPEATS, summary  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402
from orchestrator.testing.cluster import start_worker_node, stop_worker_node, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "elastic"
TARGETS = {"gossip": 2.0, "allreduce": 5.0}


def start_cluster() -> Cluster:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"learner_slot": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def over_events(values) -> dict:
    """Median, IQR and every event's figure, in seconds (`harness.stats.summary`)."""
    return summary(list(values), 3)


def job_spec(corpus: Path, kind: str):
    return load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
        f"data.train={corpus}/train.jsonl", "data.dev=null", "data.test=null", "data.test_unseen=null",
        "data.test_unseen_engine=null",
        "budget.epochs=null", "budget.wall_seconds=900", "learners={min: 2, max: 3}", "cpus_per_learner=1",
        "learner_resources={learner_slot: 1}", f"group.kind={kind}", f"name=elastic-{kind}"])


def run_chorus(corpus: Path, kind: str, kills: int) -> dict:
    cluster = start_cluster()
    job = TrainingJob(job_spec(corpus, kind), WORK / kind, overwrite=True)
    outcome, node_b = {}, []
    thread = threading.Thread(target=lambda: outcome.update(summary=job.run()), daemon=True)
    thread.start()
    try:
        recovered = lambda cause, learner: [r for r in job.recoveries  # noqa: E731
                                            if r["cause"] == cause and r["learner"] == learner and r["stepping_at"]]
        joined = lambda: [e for e in (job.events.recorded if job.events else []) if e["kind"] == "join"]  # noqa: E731
        wait_until("2 learners stepping", lambda: len(joined()) == 2 and job.roster and all(
            s.stats.get("step", 0) >= 16 for s in job.roster.live.values()))
        arrivals, failures = [], []

        def arrival(since: float, learners_before: set[int]) -> dict:
            event = wait_until("a learner joining",
                               lambda: [e for e in joined() if e["learner"] not in learners_before])[0]
            r = wait_until("the group stepping with it", lambda: recovered("join", event["learner"]))[0]
            return {"since_capacity_s": round(r["stepping_at"] - since, 3),
                    "ready_to_stepping_s": round(r["stepping_at"] - event["ready_at"], 3),
                    "learner_start_s": event["ready_s"]}

        before = {e["learner"] for e in joined()}
        added = time.time()
        node_b.append(start_worker_node(cluster.address, 1, {"learner_slot": 1}))
        arrivals.append(arrival(added, before))
        for _ in range(kills):
            before = {e["learner"] for e in joined()}
            victim = sorted(job.roster.live)[0]
            pid = next(e["pid"] for e in joined() if e["learner"] == victim)
            killed = time.time()
            sigkill(pid)
            r = wait_until("the group stepping without it", lambda: recovered("failure", victim))[0]  # noqa: B023
            failures.append({"since_kill_s": round(r["stepping_at"] - killed, 3),
                             "detected_s": round(r["at"] - killed, 3)})
            arrivals.append(arrival(r["at"], before))
            steps = max(s.stats.get("step", 0) for s in job.roster.live.values())
            wait_until("a few more steps", lambda: max(s.stats.get("step", 0)  # noqa: B023
                                                        for s in job.roster.live.values()) >= steps + 8)  # noqa: B023
        job.stop()
        thread.join(timeout=120)
        return {"arrivals": arrivals, "failures": failures,
                "failure_s": over_events(f["since_kill_s"] for f in failures),
                "arrival_ready_to_stepping_s": over_events(a["ready_to_stepping_s"] for a in arrivals),
                "arrival_since_capacity_s": over_events(a["since_capacity_s"] for a in arrivals)}
    finally:
        job.stop()
        thread.join(timeout=120)
        for proc in node_b:
            stop_worker_node(proc)
        ray.shutdown()
        cluster.shutdown()


def run_ray_train(corpus: Path, kills: int) -> dict:
    cluster = start_cluster()
    log, stop = WORK / "ray_train_steps.log", WORK / "ray_train.stop"
    log.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    spec = job_spec(corpus, "allreduce")
    plan = ray_train.Plan(workload=spec.workload_config.model_dump(mode="json"), seed=spec.seed, stop_file=str(stop),
                          lr_over="none", report="steps", resume=True, step_log=str(log))

    def steps_after(since: float, world: int | None = None) -> list[float]:
        """Step times logged after `since` by workers of a group started after `since`."""
        if not log.exists():
            return []
        found = []
        for line in log.read_text().splitlines():
            t, w, _, started = line.split()
            if float(started) > since and float(t) > since and (world is None or int(w) == world):
                found.append(float(t))
        return found

    node_b = []

    def drive(out: dict) -> None:
        try:
            wait_until("2 workers stepping", lambda: len(steps_after(0, 2)) >= 32, timeout=300)
            arrivals, failures = [], []
            added = time.time()
            node_b.append(start_worker_node(cluster.address, 1, {"learner_slot": 1}))
            first = min(wait_until("3 workers stepping", lambda: steps_after(added, 3), 300))
            arrivals.append({"since_capacity_s": round(first - added, 3)})
            for _ in range(kills):
                workers = wait_until("live workers", train_worker_pids)
                killed = time.time()
                sigkill(workers[0])  # its workers are not named: kill the process
                again = wait_until("stepping again", lambda: steps_after(killed), 300)  # noqa: B023
                failures.append({"since_kill_s": round(min(again) - killed, 3)})
                marks = steps_after(0)
                wait_until("a few more steps", lambda: len(steps_after(0)) >= len(marks) + 16, 300)  # noqa: B023
            out.update(arrivals=arrivals, failures=failures,
                       failure_s=over_events(f["since_kill_s"] for f in failures),
                       arrival_since_capacity_s=over_events(a["since_capacity_s"] for a in arrivals))
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = repr(exc)
        finally:
            stop.write_text("stop")

    out: dict = {}
    driver = threading.Thread(target=drive, args=(out,), daemon=True)
    driver.start()
    try:
        ray_train.fit(plan, (2, 3), WORK / "ray_train", "elastic", resources={"CPU": 1, "learner_slot": 1},
                      max_failures=kills + 2, resize_every_s=1.0)  # in the main thread, as Ray Train expects
    finally:
        driver.join(timeout=60)
        for proc in node_b:
            stop_worker_node(proc)
        ray.shutdown()
        cluster.shutdown()
    if "error" in out:
        raise RuntimeError(f"Ray Train contender: {out['error']}")
    return out


def plot(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    rows = [("gossip", "Chorus gossip"), ("allreduce", "Chorus allreduce"), ("ray_train", "Ray Train\nelastic DDP")]
    bars = [("failure_s", "learner killed -> stepping", "tab:red"),
            ("arrival_ready_to_stepping_s", "new learner ready -> stepping", "tab:blue"),
            ("arrival_since_capacity_s", "capacity added -> stepping", "tab:gray")]
    width = 0.27
    for k, (name, _) in enumerate(rows):
        c = result["contenders"][name]
        for j, (key, label, color) in enumerate(bars):
            if key not in c:
                continue
            x = k + (j - 1) * width
            median, (low, high) = c[key]["median"], c[key]["iqr"]
            ax.bar(x, median, width, color=color, alpha=0.85, label=label if k == 0 else None,
                   yerr=[[median - low], [high - median]], capsize=4)
            ax.text(x, high, f"{median:.1f}", ha="center", va="bottom", fontsize=8)
        if name in TARGETS:
            ax.hlines(TARGETS[name], k - 0.45, k + 0.45, color="black", ls="--", lw=1)
    ax.set_xticks(range(len(rows)), [label for _, label in rows])
    ax.set_yscale("log")
    ax.set_ylabel(f"seconds (median, whiskers: IQR over {result['kills']} kills)")
    ax.set_title("Time until the group steps with its new membership (dashed: Chorus targets)\n"
                 "capacity added: a node joins the cluster or a killed learner's slot is free again", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # throwaway local clusters
    RESULTS.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    corpus = WORK / "corpus-2000-0"
    synthesize(corpus, utterances=2000, eval_utterances=20, seed=0, progress=False)
    contenders = {}
    for name in ("gossip", "allreduce", "ray_train"):
        started = time.time()
        contenders[name] = run_ray_train(corpus, args.kills) if name == "ray_train" else \
            run_chorus(corpus, name, args.kills)
        print(f"[{name}] {json.dumps(contenders[name])} ({time.time() - started:.0f} s)", flush=True)
    checks = {name: {"failure_s": contenders[name]["failure_s"]["median"],
                     "arrival_s": contenders[name]["arrival_ready_to_stepping_s"]["median"], "target_s": target,
                     "passed": max(contenders[name]["failure_s"]["median"],
                                   contenders[name]["arrival_ready_to_stepping_s"]["median"]) <= target}
              for name, target in TARGETS.items()}
    passed = all(c["passed"] for c in checks.values()) and args.kills >= MIN_REPEATS
    result = {"benchmark": "elastic", "kills": args.kills, "targets_s": TARGETS, "contenders": contenders,
              "checks": checks, "passed": passed}
    write_results(RESULTS / "elastic.json", result, plot)
    print(json.dumps({"checks": checks, "passed": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
