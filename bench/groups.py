"""Benchmark: tiny.yaml with each learner group, with 2 and with 3 learners, each within the same
6-minute wall budget as the one-learner benchmark (bench/tiny_asr.py); target WER <= 5% on `test`.

Runs on a `ray.cluster_utils.Cluster` on this machine with one node per learner slot group, so that
`hierarchical` really has several nodes: 2 learners = 2 one-CPU nodes (its node groups are single
learners, so it is gossip between the two), 3 learners = a two-CPU node and a one-CPU node (an
allreduce pair plus a single learner, whose leaders gossip). Learners get one CPU (one thread) each;
the machine has 2 cores, so 3 learners share them. Results are written after every configuration:
`bench/results/groups.json` and `groups.png` (dev WER against wall time, one line per run).

DiLoCo (issue 57) runs with its defaults (50 inner steps a round, no compression on one machine);
`--only gossip-2,diloco-2` is the demo's comparison: 2 learners of each in the same run.

Usage: .venv/bin/python bench/groups.py [--only gossip-2,allreduce-3] [--wall-seconds 345]
"""

from __future__ import annotations

import argparse
import json
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
WORK = ROOT / "bench" / "work" / "groups"
WER_TARGET = 5.0
WALL_LIMIT = 360.0
NODE_CPUS = {2: [1, 1], 3: [2, 1]}


def run_one(kind: str, learners: int, corpus: Path, wall_seconds: float, overrides: tuple[str, ...] = ()) -> dict:
    """One job of tiny.yaml with `learners` learners of group `kind` on its own cluster (spec `overrides` last)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": NODE_CPUS[learners][0],
                                                             "include_dashboard": False})
    for cpus in NODE_CPUS[learners][1:]:
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        spec = load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
            *data_overrides(corpus), f"budget.wall_seconds={wall_seconds}",
            "budget.epochs=null", f"learners={learners}", f"group.kind={kind}", f"name={kind}-{learners}", *overrides])
        job = TrainingJob(spec, WORK / f"{kind}-{learners}",
                          report=lambda r: print(f"[{kind}-{learners}]", format_eval(r), flush=True),
                          overwrite=True)
        summary = job.run()
        return {"group": kind, "learners": learners, "wer_test": summary["wer_test"],
                "wer_test_unseen": summary["wer_test_unseen"],
                "wer_test_unseen_engine": summary.get("wer_test_unseen_engine"), "wall_s": summary["wall_s"],
                "samples_per_s": summary["samples_per_s"], "samples": summary["samples"], "epochs": summary["epochs"],
                "consensus_distance": summary["consensus_distance"],
                "passed": summary["wer_test"] <= WER_TARGET and summary["wall_s"] <= WALL_LIMIT,
                "node_groups": job.node_groups, "evals": job.evals}
    finally:
        ray.shutdown()
        cluster.shutdown()


def plot(runs: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for r in runs:
        ax.plot([e["wall_s"] for e in r["evals"]], [e["dev_wer"] for e in r["evals"]], marker=".", ms=3,
                label=f"{r['group']} x{r['learners']}: test {r['wer_test']:.2f}%")
    ax.axhline(WER_TARGET, color="red", ls="--", lw=1, label=f"target {WER_TARGET:g}% (test)")
    ax.set(xlabel="wall time (s)", ylabel="dev WER (%)", yscale="log",
           title="tiny.yaml by learner group, 2 CPU cores: dev WER against wall time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated kind-learners, e.g. gossip-2")
    parser.add_argument("--wall-seconds", type=float, default=345.0)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    corpus = WORK / "corpus-2000-0"
    synthesize(corpus, utterances=2000, eval_utterances=200, seed=0, progress=False)
    configs = [(k, n) for n in (2, 3) for k in ("gossip", "allreduce", "hierarchical", "diloco")]
    if args.only:
        wanted = set(args.only.split(","))
        configs = [(k, n) for k, n in configs if f"{k}-{n}" in wanted]
    out = RESULTS / "groups.json"
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    for kind, learners in configs:
        started = time.time()
        result = run_one(kind, learners, corpus, args.wall_seconds)
        runs = [r for r in runs if (r["group"], r["learners"]) != (kind, learners)] + [result]
        out.write_text(json.dumps({"benchmark": "groups", "wer_target": WER_TARGET, "wall_limit_s": WALL_LIMIT,
                                   "runs": runs}, indent=2) + "\n")
        plot(runs, RESULTS / "groups.png")
        print(json.dumps({k: result[k] for k in ("group", "learners", "wer_test", "wer_test_unseen", "wall_s",
                                                  "samples_per_s", "passed")}),
              f"({time.time() - started:.0f} s)", flush=True)
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
