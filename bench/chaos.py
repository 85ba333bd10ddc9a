"""Benchmark: `tiny.yaml` trained to the end while learners and nodes come and go, next to the
same job undisturbed, for `gossip` and `allreduce`.

Cluster (`ray.cluster_utils.Cluster` on this machine, Ray's default failure detection): a head
without learner slots (the driver's node), node A with 2 learner slots and node B with 1 (a
custom `learner_slot` resource), so the job (`learners: {min: 2, max: 3}`) runs 3 learners.
During the disturbed run, at fixed times:

1. one learner on node A is killed (its slot is placed again and a new learner joins),
2. node B is removed with its learner (the job goes on with 2, its third slot waits),
3. node C with one slot is added (the waiting slot is placed there and a learner joins).

Both runs train the same number of epochs (tiny.yaml's 40, not its wall budget), so the wall
time shows what the events cost. Batches: allreduce learners take tiny.yaml's 40 s each; gossip
learners 20 s, as in bench/heterogeneous.py (a gossip learner steps on its own batch, and with 3
learners at 40 s gossip was at 4.8% on test after 38 epochs in bench/groups.py, too close to
call). Target: each disturbed run reaches WER <= 5% on `test`. Writes
`bench/results/chaos.json` and `chaos.png` (dev WER against wall time, events marked).

Usage: .venv/bin/python bench/chaos.py [--epochs 40] [--at 80,160,240] [--only gossip]
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
from ray.cluster_utils import Cluster  # noqa: E402

from jobs.synth.corpus import data_overrides, synthesize  # noqa: E402
from orchestrator.cli.train import format_eval  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "chaos"
WER_TARGET = 5.0
BATCH_SECONDS = {"gossip": 20, "allreduce": 40}  # padded audio seconds per learner and step


def run_one(corpus: Path, kind: str, epochs: int, disturb_at: list[float] | None) -> dict:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node_a = cluster.add_node(num_cpus=2, resources={"learner_slot": 2})
    node_b = cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    name = f"{kind}-{'disturbed' if disturb_at else 'undisturbed'}"
    spec = load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
        *data_overrides(corpus), f"budget.epochs={epochs}", "budget.wall_seconds=null",
        "learners={min: 2, max: 3, wait_timeout_s: 600}", "cpus_per_learner=1", "learner_resources={learner_slot: 1}",
        f"group.kind={kind}", f"name=chaos-{name}", f"data.max_batch_seconds={BATCH_SECONDS[kind]}"])
    job = TrainingJob(spec, WORK / name, report=lambda r: print(f"[{name}]", format_eval(r), flush=True),
                      overwrite=True)
    outcome: dict = {}

    def train():
        try:
            outcome["summary"] = job.run()
        except BaseException as exc:  # noqa: BLE001 - reported in the results
            outcome["error"] = repr(exc)

    thread = threading.Thread(target=train, daemon=True)
    started = time.time()
    thread.start()
    done_events = []
    try:
        if disturb_at:
            actions = [("kill a learner on node A", lambda: ray.kill(next(
                           s.handle for s in job.roster.live.values() if s.node == node_a.node_id))),
                       ("remove node B", lambda: cluster.remove_node(node_b, allow_graceful=False)),
                       ("add node C", lambda: cluster.add_node(num_cpus=1, resources={"learner_slot": 1}))]
            for at, (what, act) in zip(disturb_at, actions, strict=True):
                thread.join(timeout=max(0.0, started + at - time.time()))
                if not thread.is_alive():
                    break
                act()
                done_events.append({"at_s": round(time.time() - started, 2), "what": what})
                print(f"[{name}] {done_events[-1]}", flush=True)
        thread.join()
    finally:
        ray.shutdown()
        cluster.shutdown()
    if "error" in outcome:
        return {"group": kind, "disturbed": bool(disturb_at), "error": outcome["error"], "passed": False}
    summary = outcome["summary"]
    return {"group": kind, "disturbed": bool(disturb_at), "wer_test": summary["wer_test"],
            "wer_test_unseen": summary["wer_test_unseen"],
            "wer_test_unseen_engine": summary.get("wer_test_unseen_engine"), "wall_s": summary["wall_s"],
            "epochs": summary["epochs"], "samples": summary["samples"], "learners_at_end": summary["learners"],
            "events": summary["events"], "recoveries": summary["recoveries"], "disturbances": done_events,
            "membership_events": [{k: e[k] for k in ("wall_s", "kind", "message")} for e in job.events.recorded],
            "evals": [{"wall_s": e["wall_s"], "dev_wer": e.get("dev_wer"), "learners": e.get("learners")}
                      for e in job.evals],
            "passed": summary["wer_test"] <= WER_TARGET}


def plot(runs: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    colors = {"gossip": "tab:green", "allreduce": "tab:blue"}
    for r in runs:
        if "evals" not in r:
            continue
        ax.plot([e["wall_s"] for e in r["evals"]], [e["dev_wer"] for e in r["evals"]], color=colors[r["group"]],
                ls="-" if r["disturbed"] else ":", marker="." if r["disturbed"] else None, ms=3,
                label=f"{r['group']} {'disturbed' if r['disturbed'] else 'undisturbed'}: test {r['wer_test']:.2f}%, "
                      f"{r['wall_s']:.0f} s")
        for d in r.get("disturbances", []):
            ax.axvline(d["at_s"], color=colors[r["group"]], lw=0.8, alpha=0.5)
            ax.text(d["at_s"], 90, d["what"], rotation=90, fontsize=6, va="top", color=colors[r["group"]])
    ax.axhline(WER_TARGET, color="red", ls="--", lw=1, label=f"target {WER_TARGET:g}% (test)")
    ax.set(xlabel="wall time (s)", ylabel="dev WER (%)", yscale="log",
           title="tiny.yaml, 3 learners: kill a learner, lose node B, gain node C (vertical lines)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=40)  # tiny.yaml's own
    parser.add_argument("--at", default="80,160,240", help="seconds after the start of each disturbance")
    parser.add_argument("--only", default="", help="gossip or allreduce (default: both)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # throwaway local clusters
    RESULTS.mkdir(parents=True, exist_ok=True)
    corpus = WORK / "corpus-2000-0"
    synthesize(corpus, utterances=2000, eval_utterances=200, seed=0, progress=False)
    disturb_at = [float(x) for x in args.at.split(",")]
    out = RESULTS / "chaos.json"
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    for kind in [k for k in ("gossip", "allreduce") if not args.only or k == args.only]:
        for disturbed in (True, False):
            started = time.time()
            result = run_one(corpus, kind, args.epochs, disturb_at if disturbed else None)
            runs = [r for r in runs if (r["group"], r["disturbed"]) != (kind, disturbed)] + [result]
            out.write_text(json.dumps({"benchmark": "chaos", "wer_target": WER_TARGET, "epochs": args.epochs,
                                       "disturb_at_s": disturb_at, "runs": runs}, indent=2) + "\n")
            plot(runs, RESULTS / "chaos.png")
            print(json.dumps({k: result.get(k) for k in ("group", "disturbed", "wer_test", "wall_s", "events",
                                                          "passed", "error")}),
                  f"({time.time() - started:.0f} s)", flush=True)
    return 0 if all(r["passed"] for r in runs if r["disturbed"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
