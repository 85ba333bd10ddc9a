"""Benchmark: what the control plane costs as a job grows from 2 to 32 learners (issue 18).

For each group kind (gossip, allreduce, hierarchical) and N = 2, 4, 8, 16, 32, one job of the
tests' `linear` workload (a 512 x 64 softmax regression: 32,832 parameters, 131 kB of weights;
each step sleeps 0.1 s as a stand-in for a real model's step, so 32 learners fit this 2-core
machine and what is measured is the orchestration, not CPU contention) runs on a
`ray.cluster_utils.Cluster` of a head and 4 nodes of 2 CPUs, each learner holding 0.25 CPU, so
the 32 learners are 4 nodes x 8 (hierarchical: 4 node groups of 8). Each job evaluates every 5 s.
Measured, once every learner has stepped and an evaluation is done, over a window of 5 slices
of 5 s (median and interquartile range over the slices):

- bytes through the driver per evaluation (`job.snapshots.driver_bytes`: everything the driver
  received for it, pickled) and per checkpoint (the manifest the driver writes), against one
  model's bytes; and the bytes the learners and the evaluator wrote for each checkpoint;
- the driver's CPU seconds per training round (a round: every learner runs one chunk of steps);
- the rounds' overhead in the learners' step time: the share of each learner's wall time not
  spent inside a step (waiting for the driver's next chunk, a lockstep round's slowest member,
  an evaluation's copy of the weights), over the steps begun in the slice, each with the gap
  before it (so a gap counts in one slice whatever the chunks' phase against the slices), and
  the part of it spent between chunks (waiting for the driver);
- the share of this machine's CPU time that was busy (all processes, /proc/stat): how close the
  2 cores are to saturated, which is what the kill/add times below depend on;
- peak memory (VmHWM, which counts the shared pages of torch's libraries too) of the driver's
  process and of the largest learner, and their own memory (USS: private pages) at the end.

Then, at N = 32, 5 times per kind: 4 learners' processes, drawn at random (hierarchical: one of
each of 4 nodes; seeded, the same draws every run), are killed at once (SIGKILL) and their slots
are placed again, so 4 newcomers join at once; the next event waits for all 32 to step. Measured
per event: from the kill to the group stepping without them (the first step completed after the
group took in the slowest of the 4 deaths), from each newcomer being ready (process started,
model built, state loaded) to the group stepping with it (the slowest of the 4); reported beside
them, when Ray's GCS marked the last of the 4 dead (its actor table's end time), when the driver
heard of it, and when the slowest survivor completed a step begun after the kill. Judged on the
medians of the 5 events; targets as in bench/elastic.py: <= 2 s gossip, <= 5 s allreduce
(hierarchical is reported against the allreduce target).

Targets (`passed`): bytes through the driver per evaluation and per checkpoint at most one
model's bytes at every N (what grows with N is each learner's counters and file name: reported as
bytes per learner);
overhead (median of the slices) <= 5% at N = 32; the kill/add times above.

Writes bench/results/scale.json and scale.png. Usage: .venv/bin/python bench/scale.py
[--kinds gossip,allreduce,hierarchical] [--sizes 2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness.results import commit  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator.driver.config import parse_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402
from orchestrator.driver.loop import CHUNK_STEPS  # noqa: E402
from orchestrator.testing import cluster as testing_cluster  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "scale"
NODES, CPUS_PER_NODE, CPUS_PER_LEARNER = 4, 2, 0.25
FEATURES, CLASSES, STEP_S, BATCH = 512, 64, 0.1, 16
SLICES, SLICE_S, EVAL_EVERY_S = 5, 5.0, 5.0
KILLED = 4
KILL_EVENTS = 5  # kill 4 + add 4, at N = 32, this many times per kind
RECOVERY_TARGETS = {"gossip": 2.0, "allreduce": 5.0, "hierarchical": 5.0}
OVERHEAD_TARGET = 0.05


def start_cluster() -> Cluster:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(NODES):
        cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def job_spec(kind: str, n: int):
    return parse_spec({
        "name": f"scale-{kind}-{n}", "workload": "linear", "seed": 0,
        "learners": {"min": max(1, n - KILLED), "max": n}, "cpus_per_learner": CPUS_PER_LEARNER,
        "group": {"kind": kind},
        "data": {"samples": BATCH * n * 16, "features": FEATURES, "classes": CLASSES, "batch_size": BATCH,
                 "compute_seconds": STEP_S, "eval_splits": ["dev"]},
        "optim": {"lr": 0.05},
        "budget": {"epochs": None, "wall_seconds": 900, "eval_every_seconds": EVAL_EVERY_S},
    })


def memory_kb(pid: int | str, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def private_mb(pid: int | str) -> float:
    """The process's own memory (USS: private pages; its libraries' shared pages not counted)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0.0
    kb = sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean:", "Private_Dirty:")))
    return round(kb / 1024, 1)


def cpu_ticks() -> tuple[int, int]:
    """This machine's CPU time so far, all of it and the idle part (/proc/stat, every core)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values[:8]), values[3] + values[4]  # user..steal; idle + iowait


# the shared wait, with the longer timeout a group of up to 8 learners on 2 cores needs
wait_until = functools.partial(testing_cluster.wait_until, timeout=300.0)


class Chunks:
    """Every chunk report the driver takes, by learner: (step start times, step seconds)."""

    def __init__(self, job):
        self.by_learner: dict[int, list[tuple[float, float]]] = {}
        observe = job.observe

        def recording(learner_id, stats):
            self.by_learner.setdefault(learner_id, []).extend(zip(stats["step_began"], stats["step_seconds"],
                                                                  strict=True))
            if stats["step_began"]:
                self.chunk_starts.setdefault(learner_id, set()).add(stats["step_began"][0])
            return observe(learner_id, stats)

        self.chunk_starts: dict[int, set[float]] = {}  # the first step's start time of every chunk

        job.observe = recording

    def overhead(self, start: float, end: float, between_chunks: bool = False) -> float | None:
        """Median over learners of the share of their time not in a step, over the steps begun in
        [start, end): each such step with the gap before it (since the previous step's end), so
        every gap falls in exactly one slice whatever the phase of the chunks against the slices
        (`between_chunks`: only the gaps before a chunk's first step, where a learner waits for
        the driver)."""
        shares = []
        for learner_id, steps in self.by_learner.items():
            firsts, steps = self.chunk_starts.get(learner_id, set()), sorted(steps)
            pairs = [(b - (pb + ps), s, b in firsts) for (pb, ps), (b, s) in zip(steps, steps[1:], strict=False)
                     if start <= b < end]
            if len(pairs) < 4:
                continue
            gaps = sum(max(gap, 0.0) for gap, _, first in pairs if first or not between_chunks)
            shares.append(gaps / (sum(max(gap, 0.0) for gap, _, _ in pairs) + sum(s for _, s, _ in pairs)))
        return statistics.median(shares) if shares else None

    def chunks(self, start: float, end: float) -> int:
        """Chunks begun in [start, end) (every learner's)."""
        return sum(1 for firsts in self.chunk_starts.values() for b in firsts if start <= b < end)


def summarize(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"median": None, "iqr": [None, None], "n": 0}
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": round(statistics.median(values), 6), "iqr": [round(q[0], 6), round(q[2], 6)],
            "n": len(values)}


def run(kind: str, n: int, kill: bool) -> dict:
    out = WORK / f"{kind}-{n}"
    job = TrainingJob(job_spec(kind, n), out, overwrite=True)
    chunks = Chunks(job)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=job.run()), daemon=True)
    thread.start()
    try:
        wait_until(f"{n} learners stepping and an evaluation", lambda: job.roster and len(job.roster.live) == n
                   and all(s.stats.get("step", 0) >= CHUNK_STEPS for s in job.roster.live.values())
                   and len(job.evals) >= 1)
        slices, machine_busy = [], []
        for _ in range(SLICES):
            t0, cpu0, stat0 = time.time(), time.process_time(), cpu_ticks()
            time.sleep(SLICE_S)
            t1, cpu1, stat1 = time.time(), time.process_time(), cpu_ticks()
            slices.append((t0, t1, cpu1 - cpu0))
            machine_busy.append(1 - (stat1[1] - stat0[1]) / max(stat1[0] - stat0[0], 1))
        time.sleep(10.0)  # the slices' last chunks reach the driver (a round of 32 allreduce learners: ~4 s)
        cpu_per_round = [cpu / max(chunks.chunks(t0, t1) / n, 1e-9) for t0, t1, cpu in slices]
        overhead = [chunks.overhead(t0, t1) for t0, t1, _ in slices]
        between = [chunks.overhead(t0, t1, between_chunks=True) for t0, t1, _ in slices]
        pids = {e["learner"]: e["pid"] for e in job.events.recorded if e["kind"] == "join"}
        learner_peak = max(memory_kb(pids[i], "VmHWM") for i in job.roster.live if i in pids)
        learner_private = max(private_mb(pids[i]) for i in job.roster.live if i in pids)
        driver_private = private_mb("self")
        recovery = recoveries(job, chunks) if kill else None
        manifests = sorted(out.glob("checkpoint-*.pt"))
        manifest = json_bytes_of(manifests[-1]) if manifests else None
    finally:
        job.stop()
        thread.join(timeout=300)
    summary = outcome.get("summary") or {}
    model_bytes = (FEATURES * CLASSES + CLASSES) * 4
    return {
        "kind": kind, "learners": n, "model_bytes": model_bytes,
        "driver_bytes_per_evaluation": summarize(job.snapshots.driver_bytes),
        "manifest_bytes_per_checkpoint": manifest["manifest"] if manifest else None,
        "store_bytes_per_checkpoint": manifest["store"] if manifest else None,
        "evaluations": len(job.snapshots.driver_bytes),
        "driver_cpu_s_per_round": summarize(cpu_per_round),
        "driver_cpu_share": summarize([cpu / (t1 - t0) for t0, t1, cpu in slices]),
        "machine_cpu_busy": summarize(machine_busy),
        "overhead": summarize(overhead),
        "overhead_between_chunks": summarize(between),
        "peak_rss_mb": {"driver": round(memory_kb("self", "VmHWM") / 1024, 1),
                        "learner": round(learner_peak / 1024, 1)},
        "private_mb": {"driver": driver_private, "learner": learner_private},
        "recovery": recovery,
        "summary_learners": summary.get("learners"),
    }


def json_bytes_of(manifest_path: Path) -> dict:
    """The manifest's size and the sizes of the files it names (the learners' and evaluator's writes)."""
    import torch

    state = torch.load(manifest_path, weights_only=True)
    files = {e["file"]: e["bytes"] for e in [state["model"], *state["learners"]]}
    return {"manifest": manifest_path.stat().st_size, "store": sum(files.values()), "files": len(files)}


def recoveries(job, chunks: Chunks) -> dict:
    """KILL_EVENTS times: kill 4 learners at once and wait for the 4 newcomers to step; each
    event's figures and their median and IQR."""
    events = []
    for event in range(KILL_EVENTS):
        n = len(job.roster.live)
        events.append(kill_and_add(job, chunks, random.Random(event)))
        wait_until(f"{n} learners again", lambda n=n: len(job.roster.live) == n)
    keys = ["kill_to_stepping_s", "detected_s", "ray_marked_dead_s", "survivors_stepping_s", "ready_to_stepping_s"]
    return {**{k: summarize([e[k] for e in events]) for k in keys}, "events": events}


def kill_and_add(job, chunks: Chunks, rng: random.Random) -> dict:
    """SIGKILL 4 learners at once; time until the group steps without them, then until it steps
    with the 4 newcomers placed in their slots."""
    done = lambda cause, i: [r for r in job.recoveries if r["cause"] == cause and r["learner"] == i  # noqa: E731
                             and r["stepping_at"]]
    pids = {e["learner"]: e["pid"] for e in job.events.recorded if e["kind"] == "join"}
    victims = sorted(rng.sample(sorted(job.roster.live), KILLED)) if job.group.name != "hierarchical" else \
        sorted(rng.choice(g) for g in job.node_groups[:KILLED])  # hierarchical: one learner of each of 4 nodes
    survivors = set(job.roster.live) - set(victims)
    actor_ids = [job.roster.live[i].handle._actor_id.hex() for i in victims]
    before = {e["learner"] for e in job.events.recorded if e["kind"] == "join"}
    killed = time.time()
    for i in victims:
        os.kill(pids[i], signal.SIGKILL)
    failures = [wait_until(f"stepping without {i}", lambda i=i: done("failure", i))[0] for i in victims]
    joins = wait_until("4 newcomers", lambda: (lambda js: js if len(js) >= KILLED else None)(
        [e for e in job.events.recorded if e["kind"] == "join" and e["learner"] not in before]))
    stepping = [wait_until(f"stepping with {e['learner']}", lambda e=e: done("join", e["learner"]))[0] for e in joins]
    # every survivor's first step begun after the kill, done (its chunk reached the driver by now)
    again = [min((b + d for b, d in chunks.by_learner.get(i, []) if b >= killed), default=None) for i in survivors]
    return {"killed": victims, "kill_to_stepping_s": round(max(r["stepping_at"] for r in failures) - killed, 3),
            "detected_s": round(max(r["at"] for r in failures) - killed, 3),
            # when Ray's GCS marked the last of them dead (its actor table's end time): the rest of
            # detected_s is the driver's (hearing of it, getting round to it)
            "ray_marked_dead_s": round(max(ray._private.state.actors(a)["EndTime"] for a in actor_ids) / 1000
                                       - killed, 3),
            "regrouped_s": round(max(r["regrouped_at"] for r in failures) - killed, 3),
            "survivors_stepping_s": round(max(a for a in again if a is not None) - killed, 3)
            if any(a is not None for a in again) else None,
            "newcomers": [e["learner"] for e in joins],
            # each newcomer, from the kill: its slot placed, it ready (process started, model built,
            # state loaded), the driver taking it in (join), the group taking it in (regrouped),
            # its first step done; and its first 3 steps (start, seconds)
            "newcomer_timeline_s": [{"learner": e["learner"], "placed": round(e["ready_at"] - e["ready_s"] - killed, 3),
                                     "ready": round(e["ready_at"] - killed, 3), "joined": round(r["at"] - killed, 3),
                                     "regrouped": round(r["regrouped_at"] - killed, 3),
                                     "stepping": round(r["stepping_at"] - killed, 3),
                                     "first_steps": [(round(b - killed, 3), round(d, 3)) for b, d in
                                                     sorted(chunks.by_learner.get(e["learner"], []))[:3]]}
                                    for e, r in zip(joins, stepping, strict=True)],
            "ready_to_stepping_s": round(max(r["stepping_at"] - e["ready_at"]
                                             for r, e in zip(stepping, joins, strict=True)), 3)}


def judge(runs: list[dict]) -> dict:
    verdict = {}
    for kind in sorted({r["kind"] for r in runs}):
        mine = sorted((r for r in runs if r["kind"] == kind), key=lambda r: r["learners"])
        model = mine[0]["model_bytes"]
        evaluation = [r["driver_bytes_per_evaluation"]["median"] for r in mine]
        manifest = [r["manifest_bytes_per_checkpoint"] for r in mine]
        largest = mine[-1]
        # no model passes through the driver at any N: what does is each learner's counters and
        # file name (a fixed ~100 bytes per learner, whatever the model's size), reported as a slope
        flat = max(evaluation) <= model and max(manifest) <= model
        ns = [r["learners"] for r in mine]
        overhead = largest["overhead"]["median"]
        rec = largest["recovery"]
        target = RECOVERY_TARGETS[kind]
        verdict[kind] = {
            "driver_bytes_flat": flat,
            "driver_bytes_per_learner": {"evaluation": _slope(ns, evaluation), "manifest": _slope(ns, manifest)},
            "overhead_at_largest": overhead, "overhead_ok": overhead is not None and overhead <= OVERHEAD_TARGET,
            "recovery_ok": rec is not None and rec["kill_to_stepping_s"]["median"] <= target
            and rec["ready_to_stepping_s"]["median"] <= target,
            "recovery_target_s": target,
        }
    return verdict


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares bytes per additional learner."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                 / sum((x - mx) ** 2 for x in xs), 1)


def plot(result: dict, path: Path) -> None:
    runs = result["runs"]
    fig, axes = plt.subplots(1, 5, figsize=(23, 4.2))
    for kind in sorted({r["kind"] for r in runs}):
        mine = sorted((r for r in runs if r["kind"] == kind), key=lambda r: r["learners"])
        ns = [r["learners"] for r in mine]
        axes[0].plot(ns, [r["driver_bytes_per_evaluation"]["median"] / 1e3 for r in mine], "o-",
                     label=f"{kind}: per evaluation")
        axes[0].plot(ns, [r["manifest_bytes_per_checkpoint"] / 1e3 for r in mine], "s--",
                     label=f"{kind}: manifest per checkpoint")
        axes[1].errorbar(ns, [r["driver_cpu_s_per_round"]["median"] * 1e3 for r in mine],
                         yerr=_iqr_bars(mine, "driver_cpu_s_per_round", 1e3), fmt="o-", capsize=3, label=kind)
        axes[2].errorbar(ns, [r["overhead"]["median"] * 100 for r in mine], yerr=_iqr_bars(mine, "overhead", 100),
                         fmt="o-", capsize=3, label=kind)
        axes[3].plot(ns, [r["peak_rss_mb"]["learner"] for r in mine], "o-", label=f"{kind}: largest learner")
    _plot_recovery(axes[4], [r for r in runs if r["recovery"]])
    model_kb = runs[0]["model_bytes"] / 1e3
    axes[0].axhline(model_kb, color="grey", ls=":", label=f"one model ({model_kb:.0f} kB)")
    axes[0].set(title="bytes through the driver", xlabel="learners", ylabel="kB", xscale="log", yscale="log")
    axes[1].set(title="driver CPU per round (median, IQR)", xlabel="learners", ylabel="ms", xscale="log")
    axes[2].axhline(OVERHEAD_TARGET * 100, color="grey", ls=":", label="target")
    axes[2].set(title="learners' time outside steps", xlabel="learners", ylabel="%", xscale="log")
    axes[3].set(title=f"peak RSS (driver: {max(r['peak_rss_mb']['driver'] for r in runs):.0f} MB)",
                xlabel="learners", ylabel="MB", xscale="log")
    sizes = sorted({r["learners"] for r in runs})
    for ax in axes[:4]:
        ax.legend(fontsize=7)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
    fig.suptitle(f"bench/scale.py: linear workload, {STEP_S:g} s steps, 4 nodes x 2 CPUs, "
                 f"{CPUS_PER_LEARNER:g} CPU per learner; passed: {result['passed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_recovery(ax, runs: list[dict]) -> None:
    """Kill 4 -> stepping and newcomers ready -> stepping per kind: medians, IQR, every event, targets."""
    for k, r in enumerate(runs):
        for j, (key, color) in enumerate([("kill_to_stepping_s", "tab:red"), ("ready_to_stepping_s", "tab:blue")]):
            x, rec = 3 * k + j, r["recovery"]
            ax.bar(x, rec[key]["median"], color=color, alpha=0.6,
                   yerr=[[rec[key]["median"] - rec[key]["iqr"][0]], [rec[key]["iqr"][1] - rec[key]["median"]]],
                   capsize=3, label=("kill 4 -> stepping", "4 newcomers ready -> stepping")[j] if k == 0 else None)
            ax.plot([x] * len(rec["events"]), [e[key] for e in rec["events"]], "k.", ms=4)
        ax.hlines(RECOVERY_TARGETS[r["kind"]], 3 * k - 0.4, 3 * k + 1.4, color="grey", ls=":")
    ax.set_xticks([3 * k + 0.5 for k in range(len(runs))], [f"{r['kind']}-{r['learners']}" for r in runs])
    ax.set(title=f"recovery ({KILL_EVENTS} events; median, IQR; target dotted)", ylabel="s")
    ax.legend(fontsize=7)


def _iqr_bars(runs, key, scale):
    return [[(r[key]["median"] - r[key]["iqr"][0]) * scale for r in runs],
            [(r[key]["iqr"][1] - r[key]["median"]) * scale for r in runs]]


def passed_all(verdict: dict) -> bool:
    return all(v["driver_bytes_flat"] and v["overhead_ok"] and v["recovery_ok"] for v in verdict.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="gossip,allreduce,hierarchical")
    parser.add_argument("--sizes", default="2,4,8,16,32")
    parser.add_argument("--rejudge", action="store_true",
                        help="judge the runs of the existing scale.json again (and redraw it); measure nothing")
    args = parser.parse_args()
    if args.rejudge:
        result = json.loads((RESULTS / "scale.json").read_text())
        result["verdict"] = verdict = judge(result["runs"])
        result["passed"] = passed_all(verdict)
        (RESULTS / "scale.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        plot(result, RESULTS / "scale.png")
        print(json.dumps({"passed": result["passed"], "verdict": verdict}, indent=2))
        return 0
    kinds, sizes = args.kinds.split(","), [int(s) for s in args.sizes.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    cluster = start_cluster()
    runs = []
    started = time.time()
    try:
        for n in sizes:  # the kinds interleaved at each size
            for kind in kinds:
                result = run(kind, n, kill=n == max(sizes))
                print(json.dumps(result), flush=True)
                runs.append(result)
    finally:
        ray.shutdown()
        cluster.shutdown()
    verdict = judge(runs)
    passed = passed_all(verdict)
    result = {"benchmark": "scale", "passed": passed, "verdict": verdict, "runs": runs,
              "wall_s": round(time.time() - started, 1),
              "setup": {"nodes": NODES, "cpus_per_node": CPUS_PER_NODE, "cpus_per_learner": CPUS_PER_LEARNER,
                        "features": FEATURES, "classes": CLASSES, "step_s": STEP_S, "batch": BATCH,
                        "slices": SLICES, "slice_s": SLICE_S, "eval_every_s": EVAL_EVERY_S, "killed": KILLED},
              "commit": commit()}
    (RESULTS / "scale.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    plot(result, RESULTS / "scale.png")
    print(json.dumps({"passed": passed, "verdict": verdict}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
