"""Graceful preemption against a kill: a node drained (`ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION`, what the autoscaler does before a spot node goes) against the same
node killed (all its processes SIGKILLed), under a running gossip and allreduce job.

Each run: a `ray.cluster_utils.Cluster` with a head (no learners), node A (2 learner slots) and a
fresh node B (1 slot); a 3-learner job (`learner_slot` keeps learners off the head) trains until
it has evaluated once; then node B is drained (deadline 60 s) or killed. Measured per run:

- `recover_s`: the fault -> the group stepping again without B's learner (the job's
  `recoveries`: stepping_at - fault);
- `steps_lost`: steps B's learner had completed that the job never received (its step count at
  the fault, read by a heartbeat just before it, minus the last step the driver got from it:
  a drained learner reports its last chunk, a killed one cannot);
- `failures`: `failure` events (a drain should make none).

Contenders are interleaved (gossip-drain, gossip-kill, allreduce-drain, allreduce-kill, then
again), REPEATS rounds; the table gives each one's median and interquartile range. Writes
bench/results/preemption.json and .png.

    python bench/preemption.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CONTENDERS = [("gossip", "drain"), ("gossip", "kill"), ("allreduce", "drain"), ("allreduce", "kill")]
SMALL_MODEL = {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1}


def wait(what: str, condition, timeout: float = 180.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def one_run(cluster, corpus: Path, group: str, fault: str, out: Path) -> dict:
    from orchestrator.driver.config import parse_spec
    from orchestrator.driver.job import TrainingJob

    node_b = cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    cluster.wait_for_nodes()
    spec = parse_spec({
        "name": f"preempt-{group}-{fault}", "seed": 0, "learners": {"min": 1, "max": 3},
        "learner_resources": {"learner_slot": 1}, "group": {"kind": group},
        "data": {"train": str(corpus / "train.jsonl"), "dev": str(corpus / "dev.jsonl"), "max_batch_seconds": 10},
        "model": SMALL_MODEL, "optim": {"lr": 3e-3, "warmup_steps": 10, "schedule": "constant"},
        "budget": {"epochs": 10_000, "wall_seconds": 600, "eval_every_seconds": 10}})
    job = TrainingJob(spec, out)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=job.run()), daemon=True)
    thread.start()
    try:
        def events(kind):
            return [e for e in (job.events.recorded if job.events else []) if e["kind"] == kind]

        wait("3 learners and an evaluation", lambda: len(job.roster.live if job.roster else []) == 3
             and job.evals)
        victim = wait("a learner on node B", lambda: [s for s in list(job.roster.live.values())
                                                     if s.node == node_b.node_id])[0]
        stepped = victim.stats.get("step", 0)
        wait("a few more steps", lambda: victim.stats.get("step", 0) >= stepped + 5)
        at_fault = ray.get(victim.handle.heartbeat.remote(), timeout=30)["step"]
        fault_at = time.time()
        if fault == "drain":
            gcs = ray._raylet.GcsClient(address=cluster.address)
            from ray.core.generated import autoscaler_pb2
            accepted, why = gcs.drain_node(node_b.node_id, autoscaler_pb2.DrainNodeReason.Value(
                "DRAIN_NODE_REASON_PREEMPTION"), "spot", int((time.time() + 60) * 1000))
            assert accepted, why
        else:
            cluster.remove_node(node_b, allow_graceful=False)
        cause = "drain" if fault == "drain" else "failure"
        recovery = wait("the group stepping again", lambda: [r for r in list(job.recoveries) if r["cause"] == cause
                                                            and r["learner"] == victim.id and r["stepping_at"]])[0]
        received = (events("drain") or [{}])[0].get("step") if fault == "drain" else victim.stats.get("step", 0)
        return {"group": group, "fault": fault, "recover_s": round(recovery["stepping_at"] - fault_at, 3),
                "steps_lost": max(0, at_fault - (received or 0)), "failures": len(events("failure")),
                "drains": len(events("drain"))}
    finally:
        job.stop()
        thread.join(timeout=120)
        if fault == "drain":
            cluster.remove_node(node_b, allow_graceful=False)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report-only", action="store_true",
                        help="re-make the table and figure from bench/results/preemption.json")
    args = parser.parse_args()
    if args.report_only:
        runs = json.loads((RESULTS / "preemption.json").read_text())["runs"]
        report(runs, max(r["repeat"] for r in runs) + 1)
        return
    from ray.cluster_utils import Cluster

    from jobs.synth.corpus import synthesize
    from orchestrator.cluster.local_head import free_port

    work = Path(tempfile.mkdtemp(prefix="chorus-preemption-"))
    corpus = work / "corpus"
    synthesize(corpus, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "dashboard_agent_listen_port": free_port()})
    cluster.add_node(num_cpus=2, resources={"learner_slot": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    runs = []
    try:
        for repeat in range(args.repeats):
            for group, fault in CONTENDERS:  # interleaved: every contender once per round
                run = one_run(cluster, corpus, group, fault, work / f"run-{repeat}-{group}-{fault}")
                run["repeat"] = repeat
                runs.append(run)
                print(json.dumps(run, allow_nan=False), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    report(runs, args.repeats)


def report(runs: list[dict], repeats: int) -> None:
    """Each contender's median and interquartile range: the JSON, the figure and a Markdown table."""
    table = []
    for group, fault in CONTENDERS:
        mine = [r for r in runs if r["group"] == group and r["fault"] == fault]
        rec, lost = quartiles([r["recover_s"] for r in mine]), quartiles([r["steps_lost"] for r in mine])
        table.append({"group": group, "fault": fault, "runs": len(mine),
                      "recover_s": {"q1": rec[0], "median": rec[1], "q3": rec[2]},
                      "steps_lost": {"q1": lost[0], "median": lost[1], "q3": lost[2]},
                      "failures": sum(r["failures"] for r in mine), "drains": sum(r["drains"] for r in mine)})
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"repeats": repeats, "table": table, "runs": runs}
    (RESULTS / "preemption.json").write_text(json.dumps(record, allow_nan=False, indent=2) + "\n")
    plot(runs, RESULTS / "preemption.png")
    print("| group | fault | recover_s median (IQR) | steps lost median (IQR) | failure events |")
    print("|---|---|---|---|---|")
    for t in table:
        r, s = t["recover_s"], t["steps_lost"]
        print(f"| {t['group']} | {t['fault']} | {r['median']:.2f} ({r['q1']:.2f}–{r['q3']:.2f}) | "
              f"{s['median']:g} ({s['q1']:g}–{s['q3']:g}) | {t['failures']} |")


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "recover_s", "fault -> stepping again (s)"),
                           (axes[1], "steps_lost", "steps of the node's learner lost")):
        data = [[r[key] for r in runs if (r["group"], r["fault"]) == c] for c in CONTENDERS]
        ax.boxplot(data, tick_labels=[f"{g}\n{f}" for g, f in CONTENDERS])
        ax.set_ylabel(label)
    fig.suptitle(f"drain vs kill of the same node ({len(runs) // len(CONTENDERS)} interleaved repeats each)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
