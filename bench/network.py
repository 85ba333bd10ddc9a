"""Benchmark: Chorus and Ray Train across hosts whose links are the bottleneck (issue 39).

Two hosts of 2 CPUs each, with addresses of their own on one machine (`orchestrator/testing/
hosts.py`: network namespaces on a bridge, each a Ray node; the head, holding the drivers, in the
machine's own namespace), each host's link to the bridge limited in both directions (`tc tbf`):
unshaped, 1 Gbit/s, 100 Mbit/s and 20 Mbit/s. Four learners (1 CPU, one torch thread each), two a
host, train the ~10M-parameter BiLSTM-CTC of bench/vs_ray_train.py (tiny.yaml's model widened:
gradients and weights are 40 MB) on 2,000 synthesized utterances (espeak-ng, seed 0), their
filterbanks computed once beforehand (`chorus features`), with tiny.yaml's batches (40 padded
seconds a learner a step; `--batch-seconds` changes it for everyone), optimizer and learning-rate
schedule over the same wall budget.

Contenders, interleaved (`harness.stats.interleaved`, order rotating), on the same hosts, data, batch
and learning rate:
- `ray_train`: Ray Train's `TorchTrainer`, DDP over gloo (`bench/harness/ray_train.py`), with
  GLOO_SOCKET_IFNAME set to the hosts' interface by hand (without it gloo cannot connect across
  these hosts, whose names resolve to a loopback address);
- Chorus `allreduce` (summed host by host: `group.topology_aware`, the default), `allreduce_int8`
  (its sums between hosts int8 with error feedback), `gossip` and `hierarchical` (their exchanges
  between hosts int8 with error feedback, `group.compression: int8`);
- ablations at 20 Mbit/s: `gossip_none` and `hierarchical_none` (no compression) and
  `gossip_blind` (int8, `group.topology_aware: false`: the ring by learner id, every exchange
  crossing between hosts).

Measured per run (`throughput`: a `--budget` of training, evaluated once at the end): samples/s
over the training (the first step to the budget), the bytes each host sent per second through its
link in that window (the link's counters, sampled every half second: gradients, weights, Ray's own
traffic, evaluations), steps, start-up. Per link, median and IQR of each contender; a ratio is a
win only where the IQRs are apart (`harness.stats.compare`).

Time to WER (`time_to_wer`, 100 Mbit/s only): ray_train, gossip, hierarchical and gossip_none,
each for `--wer-budget` seconds, `dev` evaluated every `--eval-every` seconds (Chorus: off the
training loop, by its evaluator; Ray Train: rank 0, the others waiting), with 10 warm-up steps
instead of tiny.yaml's 100 for everyone (100 steps are ~10 minutes of Ray Train at 100 Mbit/s).
Per repeat: the best dev WER Ray Train reached and when (seconds from the call that starts
training: start-up included, what a user waits, as bench/time_to_wer.py), and when each Chorus
contender first had a WER at or below it; the same for Ray Train's best dev loss (a measure that
still moves while the WER is 100%).

Targets (issue 39), `passed` when all hold: at 100 Mbit/s gossip and hierarchical each >= 5x
Ray Train's samples/s and >= 0.95x their own unshaped rate; at 20 Mbit/s both >= 0.85x their
unshaped rate and >= 10x Ray Train; the better of them reaches Ray Train's WER in <= 0.3x Ray
Train's time at 100 Mbit/s; Chorus allreduce with compression >= 1.5x Ray Train (at 100 and at 20
Mbit/s); unshaped, every Chorus contender >= 0.95x Ray Train; IQRs apart wherever a ratio is
claimed as a win. Writes `bench/results/network.json` and `network.png` (`network-batch<N>s.*`
with `--batch-seconds N`).

DiLoCo by link (`--diloco`, issue 57): `diloco` (group.kind diloco, its outer syncs between hosts
int8 with error feedback, 4 fragments, rounds of 60 s: a fragment's sync every 15 s, overlapping
the inner steps) on unshaped, 20 Mbit/s and 5 Mbit/s links, and `allreduce` (float32) unshaped,
interleaved per link, `--repeats` each, the same batch, data and `--budget` (120 s: two rounds).
Checks: DiLoCo's samples/s at 20 Mbit/s >= 0.95x and at 5 Mbit/s >= 0.90x its own
unshaped median (a ratio whose IQRs overlap is a tie, said so); the bytes its learners sent per
sample (summary `sent_bytes_per_sample`: what they sent while training; the end-of-run sync of
what is left, at most one int8 copy of the weights a host, comes after and is not in it) <= 1/50
of allreduce's. Writes `network-diloco.json` and `.png`; `--diloco-links`, `--diloco-contenders` and
`--diloco-out` run part of it (e.g. unshaped and 5 Mbit/s, DiLoCo only: no bytes-per-sample check).

DiLoCo's time to Ray Train's WER (`--diloco-wer`, issue 57): `ray_train` and `diloco` (as above) at
100 Mbit/s, each for `--wer-budget` seconds with `dev` every `--eval-every` seconds, interleaved, as
the `time_to_wer` section measures it (Ray Train's best dev WER and loss per repeat, when each was
first had, start-up included). Check: DiLoCo's time to Ray Train's WER <= 0.5x Ray Train's (median;
the loss's ratio beside it). Writes `network-diloco-wer.json` and `.png`.

What the job's secret costs on the data path (`--secret-cost TREE`, issue 56): gossip and allreduce,
unshaped, each run by `chorus train` from this checkout (`@after`) and from TREE (`@before`: a
checkout of the commit before the secret, e.g. `git worktree add /tmp/before 7a29eb3`), the four
interleaved, each its own driver process against the same hosts; writes `network-secret.json` and
`.png` (samples/s, median and IQR; after / before, a tie unless the IQRs are apart).

Usage (as root: namespaces and tc; run nothing else heavy beside it):
    .venv/bin/python bench/network.py                       # everything (~3.5 h)
    .venv/bin/python bench/network.py --links 100mbit --contenders ray_train,gossip --pilot
    .venv/bin/python bench/network.py --links 100mbit,20mbit --skip ablations,time_to_wer \
        --earlier bench/work/network/runs-ef518e6.jsonl   # some links now, the rest from an earlier run
    .venv/bin/python bench/network.py --secret-cost /tmp/before      # before and after the secret
    .venv/bin/python bench/network.py --diloco-wer                   # DiLoCo's time to Ray Train's WER (~40 min)
    .venv/bin/python bench/network.py --diloco --budget 120          # DiLoCo by link (~65 min)
    .venv/bin/python bench/network.py --diloco --budget 120 --diloco-links unshaped,5mbit \
        --diloco-contenders diloco --diloco-out network-diloco-5mbit.json      # (~35 min)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness import ray_train  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import MIN_REPEATS, compare, interleaved, summary  # noqa: E402

from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402
from orchestrator.testing.hosts import Hosts  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "network"
HOSTS, CPUS, LEARNERS = 2, 2, 4
LINKS = {"unshaped": None, "1gbit": "1gbit", "100mbit": "100mbit", "20mbit": "20mbit", "5mbit": "5mbit"}
MODEL = ["model.d_model=256", "model.hidden=520", "model.layers=2", "model.subsample_channels=64"]  # vs_ray_train's 10m
CHORUS = {  # name -> (group.kind, group.compression, group.topology_aware)
    "allreduce": ("allreduce", "none", True),
    "allreduce_int8": ("allreduce", "int8", True),
    "gossip": ("gossip", "int8", True),
    "hierarchical": ("hierarchical", "int8", True),
    "gossip_none": ("gossip", "none", True),
    "hierarchical_none": ("hierarchical", "none", True),
    "gossip_blind": ("gossip", "int8", False),
    "diloco": ("diloco", "int8", True),
    "diloco_none": ("diloco", "none", True),
}
DILOCO = ["group.diloco.round_seconds=60", "group.diloco.streaming.fragments=4"]  # a fragment's sync every 15 s
DILOCO_CONTENDERS, DILOCO_LINKS = ["diloco", "allreduce"], ["unshaped", "20mbit", "5mbit"]
DILOCO_BASELINE_LINK = "unshaped"  # allreduce runs there only (its bytes per sample are the link's least concern)
MAIN = ["ray_train", "allreduce", "allreduce_int8", "gossip", "hierarchical"]
ABLATIONS = ["gossip_none", "hierarchical_none", "gossip_blind"]
ABLATION_LINKS = ["20mbit"]
TINY_BATCH_SECONDS = 40.0  # tiny.yaml's padded audio seconds a learner a step
BATCH_SECONDS = TINY_BATCH_SECONDS  # this run's (--batch-seconds)
WER_CONTENDERS, WER_LINK = ["ray_train", "gossip", "hierarchical", "gossip_none"], "100mbit"
WER_WARMUP_STEPS = 10  # time-to-WER runs: tiny.yaml's 100 warm-up steps are ~10 minutes of Ray Train at 100 Mbit/s


def corpus() -> Path:
    """The 2,000-utterance corpus and its filterbanks (made once)."""
    audio, feats = WORK / "corpus-2000-0", WORK / "feats-2000-0"
    if not (audio / "corpus.json").is_file():
        synthesize(audio, utterances=2000, eval_utterances=100, seed=0, progress=False, engines="espeak")
    from jobs.data.feature_shards import write_shards

    for split in ("train", "dev"):
        if not (feats / split).is_dir():
            write_shards(str(audio / f"{split}.jsonl"), str(feats / split), num_mel_bins=80, shard_mb=64.0)
    return feats


def job_spec(feats: Path, name: str, wall: float, eval_every: float | None):
    """tiny.yaml with the 10M model for 4 learners, one CPU each, trained for `wall` seconds; with
    `eval_every` (time-to-WER runs), dev every so many seconds and WER_WARMUP_STEPS of warm-up."""
    kind, compression, aware = CHORUS.get(name, ("allreduce", "none", True))
    warmup = [f"optim.warmup_steps={WER_WARMUP_STEPS}"] if eval_every else []
    warmup += DILOCO if kind == "diloco" else []
    return load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
        *MODEL, *warmup, f"data.max_batch_seconds={BATCH_SECONDS}", f"data.train={feats}/train",
        f"data.dev={feats}/dev", "data.test=null",
        "data.test_unseen=null",
        "data.test_unseen_engine=null", "budget.epochs=10000", f"budget.wall_seconds={wall}",
        "budget.eval_every_epochs=10000", f"budget.eval_every_seconds={eval_every or 'null'}",
        f"learners={LEARNERS}", "cpus_per_learner=1", f"group.kind={kind}", f"group.compression={compression}",
        f"group.topology_aware={str(aware).lower()}", f"name=net-{name.replace('_', '-')}"])


class LinkMeter:
    """Each host's link counters, sampled every half second in a thread while a run trains."""

    def __init__(self, hosts: Hosts):
        self.hosts, self.samples, self._stop = hosts, [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), [self.hosts.traffic(i)["sent"] for i in range(HOSTS)]))
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sent_per_s(self, start: float, end: float) -> list[float]:
        """Bytes per second each host sent between `start` and `end` (the samples closest inside)."""
        inside = [s for s in self.samples if start <= s[0] <= end] or self.samples[-2:]
        (t0, a), (t1, b) = inside[0], inside[-1]
        return [round((y - x) / max(t1 - t0, 1e-9)) for x, y in zip(a, b, strict=True)]


def run_chorus(name: str, hosts: Hosts, feats: Path, wall: float, eval_every: float | None) -> dict:
    curve: list[tuple[float, float | None, float | None]] = []
    started = time.time()
    meter = LinkMeter(hosts)
    try:
        job = TrainingJob(job_spec(feats, name, wall, eval_every), WORK / "runs" / name, overwrite=True,
                          report=lambda r: curve.append((time.time() - started, r.get("dev_wer"), r.get("dev_loss"))))
        s = job.run()
    finally:
        meter.stop()
    first = job.first_step_at or started
    return {"samples_per_s": s["samples_per_s"], "samples": s["samples"], "steps": s["steps"],
            "train_wall_s": s["train_wall_s"], "startup_s": s["startup_s"],
            "sent_per_s": meter.sent_per_s(first, first + s["train_wall_s"]), "dev_wer": s["wer_dev"],
            "curve": curve, "learner_sent_bytes": s["sent_bytes"], "events": s["events"],
            "sent_bytes_per_sample": s["sent_bytes_per_sample"], "group_counters": s["group_counters"]}


def run_ray_train(hosts: Hosts, feats: Path, wall: float, eval_every: float | None) -> dict:
    spec = job_spec(feats, "ray_train", wall, eval_every)
    meter = LinkMeter(hosts)
    try:
        plan = ray_train.Plan(workload=spec.workload_config.model_dump(mode="json"), seed=spec.seed, wall_s=wall,
                              eval_every_s=eval_every, final_eval=True, lr_over="wall", report="end")
        r, started = ray_train.fit(plan, LEARNERS, WORK / "ray_train", "baseline")
    finally:
        meter.stop()
    ended = r["marks"][-1][0]  # the time its budget was spent (before the final evaluation)
    train_wall = ended - r["first_step_at"]
    curve = [(t - started, wer, loss) for t, wer, loss in r["curve"]]
    return {"samples_per_s": round(r["samples"] / train_wall, 2), "samples": r["samples"], "steps": r["steps"],
            "train_wall_s": round(train_wall, 2), "startup_s": round(r["first_step_at"] - started, 3),
            "sent_per_s": meter.sent_per_s(r["first_step_at"], ended),
            "dev_wer": curve[-1][1] if curve else None, "curve": curve}


def measure(name: str, hosts: Hosts, feats: Path, link: str, wall: float, eval_every: float | None,
            log: Path) -> dict:
    hosts.shape(None, LINKS[link])
    result = run_ray_train(hosts, feats, wall, eval_every) if name == "ray_train" else \
        run_chorus(name, hosts, feats, wall, eval_every)
    result.update(contender=name, link=link, at=time.strftime("%H:%M:%S"))
    with open(log, "a") as f:  # each run kept as it ends, should the benchmark be cut short
        f.write(json.dumps(result, allow_nan=False) + "\n")
    print(f"[{link} {name}] {result['samples_per_s']:.1f} samples/s, sent/s {result['sent_per_s']}, "
          f"{result['steps']} steps, start-up {result['startup_s']} s, dev WER {result['dev_wer']}", flush=True)
    return result


def section(names: list[str], links: list[str], hosts, feats, wall, eval_every, repeats, log) -> dict:
    """Every link of `links`, its contenders interleaved `repeats` times: link -> name -> runs."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for link in links:
        runs[link] = {name: [] for name in names}

        def contender(name: str, link: str = link):
            def one(_repeat: int) -> float:
                runs[link][name].append(measure(name, hosts, feats, link, wall, eval_every, log))
                return runs[link][name][-1]["samples_per_s"]
            return one

        interleaved({name: contender(name) for name in names}, repeats=repeats)
    return runs


def earlier_runs(path: Path, names: list[str], repeats: int, skip: set[str]) -> dict:
    """The links of an earlier run's log (`runs.jsonl`) that every one of `names` ran `repeats`
    times in (a cut-short run's last link is left out), with every contender that ran them so
    often, but for `skip`: {"runs": link -> name -> runs}."""
    by_link: dict[str, dict[str, list[dict]]] = {}
    for line in path.read_text().splitlines():
        run = json.loads(line)
        by_link.setdefault(run["link"], {}).setdefault(run["contender"], []).append(run)
    return {"runs": {link: {n: rs for n, rs in by_name.items() if len(rs) >= repeats}
                     for link, by_name in by_link.items()
                     if link not in skip and all(len(by_name.get(n, [])) >= repeats for n in names)}}


def throughput_stats(runs: dict) -> dict:
    return {link: {name: {"samples_per_s": summary([r["samples_per_s"] for r in rs], 3),
                          "sent_mb_per_s": [summary([r["sent_per_s"][h] / 1e6 for r in rs], 3) for h in range(HOSTS)]}
                   for name, rs in by_name.items()} for link, by_name in runs.items()}


def first_at(curve: list, target: float, column: int) -> float | None:
    return next((t for t, *values in curve if values[column - 1] is not None and values[column - 1] <= target), None)


def time_to_wer(runs: dict) -> dict:
    """Per repeat, Ray Train's best WER and loss and when it had them, and when each Chorus
    contender first had as good; the ratios' median and IQR."""
    rows, chorus = [], [n for n in runs if n != "ray_train"]
    for r, rt in enumerate(runs["ray_train"]):
        scored = [c for c in rt["curve"] if c[1] is not None]
        best_wer, best_loss = min(c[1] for c in scored), min(c[2] for c in scored)
        row = {"repeat": r, "ray_train_wer": best_wer, "ray_train_wer_s": first_at(scored, best_wer, 1),
               "ray_train_loss": best_loss, "ray_train_loss_s": first_at(scored, best_loss, 2)}
        for name in chorus:
            row[f"{name}_wer_s"] = first_at(runs[name][r]["curve"], best_wer, 1)
            row[f"{name}_loss_s"] = first_at(runs[name][r]["curve"], best_loss, 2)
        rows.append(row)
    out = {"repeats": rows}
    for name in chorus:
        for what in ("wer", "loss"):
            ratios = [row[f"{name}_{what}_s"] / row[f"ray_train_{what}_s"] for row in rows
                      if row[f"{name}_{what}_s"] is not None]
            out[f"{name}_{what}_ratio"] = summary(ratios, 3) if len(ratios) == len(rows) else None
    return out


def judge(stats: dict, ttw: dict | None) -> dict:
    """Each target: the figures it compares and whether it holds."""
    checks = {}

    def rate(link, name):
        return stats.get(link, {}).get(name, {}).get("samples_per_s")

    def ratio_check(key, a, b, least):
        if a is None or b is None:
            checks[key] = {"held": False, "why": "not measured"}
            return
        c = compare(a, b)
        checks[key] = {**c, "least": least, "held": c["ratio"] is not None and c["ratio"] >= least
                       and c["verdict"] == "higher"}

    for name in ("gossip", "hierarchical"):
        ratio_check(f"{name} 100mbit / ray_train", rate("100mbit", name), rate("100mbit", "ray_train"), 5.0)
        ratio_check(f"{name} 20mbit / ray_train", rate("20mbit", name), rate("20mbit", "ray_train"), 10.0)
        for link, least in (("100mbit", 0.95), ("20mbit", 0.85)):
            own, base = rate(link, name), rate("unshaped", name)
            ok = own is not None and base is not None
            checks[f"{name} {link} / its unshaped"] = {
                "ratio": round(own["median"] / base["median"], 4) if ok else None, "least": least,
                "held": ok and own["median"] >= least * base["median"]}  # kept: not a win, IQRs not needed
    for link in ("100mbit", "20mbit"):
        ratio_check(f"allreduce_int8 {link} / ray_train", rate(link, "allreduce_int8"), rate(link, "ray_train"), 1.5)
    for name in ("allreduce", "allreduce_int8", "gossip", "hierarchical"):
        a, b = rate("unshaped", name), rate("unshaped", "ray_train")
        ok = a is not None and b is not None
        checks[f"{name} unshaped / ray_train"] = {**(compare(a, b) if ok else {}), "least": 0.95,
                                                  "held": ok and a["median"] >= 0.95 * b["median"]}
    key = "time to ray_train's WER, better of gossip and hierarchical / ray_train"
    if ttw is None:
        checks[key] = {"held": False, "why": "not measured"}
    else:
        best = [ttw.get(f"{n}_wer_ratio") for n in ("gossip", "hierarchical") if ttw.get(f"{n}_wer_ratio")]
        low = min(best, key=lambda s: s["median"]) if best else None
        checks[key] = {"ratio": low["median"] if low else None, "most": 0.3, "held": bool(low) and low["median"] <= 0.3}
    return checks


def markdown(result: dict) -> str:
    """The throughput figures as a table: per link and contender, samples/s and MB/s each host
    sent (medians [IQR]), and the ratio to Ray Train's samples/s on that link."""
    lines = ["| link | contender | samples/s | / Ray Train | MB/s sent per host |", "|---|---|---:|---:|---:|"]
    for link, by_name in result["throughput"].items():
        base = by_name.get("ray_train", {}).get("samples_per_s")
        for name, entry in by_name.items():
            s = entry["samples_per_s"]
            versus = compare(s, base) if base and name != "ray_train" else None
            ratio = f"{versus['ratio']:.2f} ({versus['verdict']})" if versus else "–"
            sent = " / ".join(f"{h['median']:.2f}" for h in entry["sent_mb_per_s"])
            lines.append(f"| {link} | {name} | {s['median']:.1f} [{s['iqr'][0]:.1f}, {s['iqr'][1]:.1f}] | {ratio} | "
                         f"{sent} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    stats = result["throughput"]
    links = [link for link in LINKS if link in stats]
    names = [n for n in MAIN + ABLATIONS if any(n in stats[link] for link in links)]
    colors = dict(zip(MAIN + ABLATIONS, ["tab:gray", "tab:blue", "tab:cyan", "tab:green", "tab:orange",
                                         "lightgreen", "navajowhite", "olive"], strict=True))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        for i, link in enumerate(links):
            entry = stats[link].get(name)
            if entry is None:
                continue
            s, x = entry["samples_per_s"], i + (j - len(names) / 2 + 0.5) * width
            ax.bar(x, s["median"], width, color=colors[name], yerr=[[s["median"] - s["iqr"][0]],
                                                                     [s["iqr"][1] - s["median"]]],
                   capsize=2, label=name if i == next(k for k, lk in enumerate(links) if name in stats[lk]) else None)
            sent = sum(h["median"] for h in entry["sent_mb_per_s"]) / HOSTS
            bx.bar(x, sent, width, color=colors[name])
    for axis, label in ((ax, "samples/s (median, IQR)"), (bx, "MB/s each host sent through its link (median)")):
        axis.set_xticks(range(len(links)), links)
        axis.set_ylabel(label)
        axis.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"2 hosts x 2 learners, ~10M-parameter model, {result['budget_s']:.0f} s budget", fontsize=9)
    bx.set_yscale("log")
    held = sum(c["held"] for c in result["checks"].values())
    bx.set_title(f"targets held: {held} of {len(result['checks'])} (passed: {result['passed']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_all(args, links: list[str], names: list[str], skip: set[str], feats: Path, log: Path):
    """Every section this invocation runs, on one set of hosts: (link -> name -> runs, the
    time-to-WER runs or None)."""
    log.unlink(missing_ok=True)
    with Hosts(count=HOSTS, cpus=CPUS) as hosts:
        # Ray Train's gloo needs the interface named by hand on these hosts (Chorus finds it itself)
        ray.init(address=hosts.gcs_address, log_to_driver=False,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}})
        try:
            if args.pilot:
                for link in links:
                    for name in names:
                        measure(name, hosts, feats, link, args.budget, None, log)
                return {}, None
            runs = section(names, links, hosts, feats, args.budget, None, args.repeats, log)
            if "ablations" not in skip:
                extra = section(ABLATIONS, [lk for lk in ABLATION_LINKS if lk in links], hosts, feats,
                                args.budget, None, args.repeats, log)
                for link, by_name in extra.items():
                    runs[link].update(by_name)
            ttw_runs = None
            if "time_to_wer" not in skip:
                ttw_runs = section(WER_CONTENDERS, [WER_LINK], hosts, feats, args.wer_budget, args.eval_every,
                                   args.repeats, log)[WER_LINK]
        except BaseException:
            traceback.print_exc()  # before the cluster goes: a driver whose cluster vanished exits at once
            raise
        finally:
            ray.shutdown()
    return runs, ttw_runs


SECRET_CONTENDERS = ["gossip", "allreduce"]


def run_cli(name: str, tree: Path, hosts: Hosts, feats: Path, wall: float, log: Path) -> dict:
    """`chorus train` of contender `name`'s spec from checkout `tree`, a driver process of its own
    against the hosts; its summary's figures."""
    import subprocess

    kind = name.split("@")[0]
    spec = WORK / f"spec-{kind}.json"
    spec.write_text(json.dumps(job_spec(feats, kind, wall, None).model_dump(mode="json"), allow_nan=False))
    env = {**hosts.env, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out",
                           str(WORK / "runs" / name.replace("@", "-")), "--overwrite", "--address", hosts.gcs_address],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=wall + 600)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: chorus train exited {proc.returncode}: {proc.stderr[-2000:]}")
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {"contender": name, "link": "unshaped", "tree": str(tree), "samples_per_s": s["samples_per_s"],
              "samples": s["samples"], "steps": s["steps"], "train_wall_s": s["train_wall_s"],
              "startup_s": s["startup_s"], "at": time.strftime("%H:%M:%S")}
    with open(log, "a") as f:
        f.write(json.dumps(result, allow_nan=False) + "\n")
    print(f"[unshaped {name}] {result['samples_per_s']:.1f} samples/s, {result['steps']} steps", flush=True)
    return result


def secret_cost(before: Path, repeats: int, wall: float, feats: Path) -> dict:
    """gossip and allreduce, unshaped, from this checkout and from `before`, interleaved."""
    log = WORK / "runs-secret.jsonl"
    log.unlink(missing_ok=True)
    trees = {"after": ROOT, "before": before.resolve()}
    runs: dict[str, list[dict]] = {f"{k}@{t}": [] for k in SECRET_CONTENDERS for t in trees}
    with Hosts(count=HOSTS, cpus=CPUS) as hosts:
        hosts.shape(None, None)

        def contender(name: str):
            def one(_repeat: int) -> float:
                runs[name].append(run_cli(name, trees[name.split("@")[1]], hosts, feats, wall, log))
                return runs[name][-1]["samples_per_s"]
            return one
        interleaved({name: contender(name) for name in runs}, repeats=repeats)
    stats = {name: summary([r["samples_per_s"] for r in rs], 3) for name, rs in runs.items()}
    verdicts = {k: compare(stats[f"{k}@after"], stats[f"{k}@before"]) for k in SECRET_CONTENDERS}
    return {"benchmark": "network-secret", "commit": commit(), "measured_at": time.strftime("%Y-%m-%d %H:%M %Z"),
            "passed": all(v["verdict"] != "lower" for v in verdicts.values()), "link": "unshaped", "hosts": HOSTS,
            "learners": LEARNERS,
            "model_overrides": MODEL, "batch_seconds": BATCH_SECONDS, "budget_s": wall, "repeats": repeats,
            "before": str(before), "samples_per_s": stats,
            "after_over_before": verdicts, "runs": runs}


def plot_secret(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    names = list(result["samples_per_s"])
    for i, name in enumerate(names):
        values = [r["samples_per_s"] for r in result["runs"][name]]
        ax.scatter([i] * len(values), values, color="tab:blue" if "after" in name else "tab:gray", alpha=0.7)
        ax.hlines(result["samples_per_s"][name]["median"], i - 0.25, i + 0.25, color="black")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("samples/s (4 learners, 2 hosts, unshaped)")
    ax.set_title("What the job's secret costs on the data path (dots: repeats; bar: median)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def diloco_section(args, feats: Path) -> dict:
    """Issue 57: DiLoCo (int8 between hosts, 4 fragments, rounds of 60 s) on every link of
    DILOCO_LINKS and allreduce (float32) unshaped, interleaved per link, the same batch and data;
    samples/s against DiLoCo's own unshaped rate, bytes each learner sent per sample against
    allreduce's. Writes network-diloco.json and .png."""
    log, started = WORK / "runs-diloco.jsonl", time.time()
    log.unlink(missing_ok=True)
    runs: dict[str, dict[str, list[dict]]] = {}
    with Hosts(count=HOSTS, cpus=CPUS) as hosts:
        ray.init(address=hosts.gcs_address, log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        try:
            for link in args.diloco_links.split(","):
                names = args.diloco_contenders.split(",") if link == DILOCO_BASELINE_LINK else ["diloco"]
                runs.update(section(names, [link], hosts, feats, args.budget, None, args.repeats, log))
        finally:
            ray.shutdown()
    stats = throughput_stats(runs)
    per_sample = {link: {name: summary([r["sent_bytes_per_sample"] for r in rs], 1) for name, rs in by_name.items()}
                  for link, by_name in runs.items()}
    own = stats[DILOCO_BASELINE_LINK]["diloco"]["samples_per_s"]
    checks = {f"diloco {link} / unshaped >= {bound}": {**compare(stats[link]["diloco"]["samples_per_s"], own),
                                                       "bound": bound}
              for link, bound in (("20mbit", 0.95), ("5mbit", 0.90)) if link in runs}
    for check in checks.values():
        check["held"] = check["ratio"] >= check["bound"]
    base = per_sample[DILOCO_BASELINE_LINK]
    if "allreduce" in base:
        ratio = base["diloco"]["median"] / base["allreduce"]["median"]
        checks["bytes per sample diloco / allreduce <= 1/50"] = {"ratio": round(ratio, 5), "held": ratio <= 1 / 50}
    return {"benchmark": "network-diloco", "hosts": HOSTS, "cpus_per_host": CPUS, "learners": LEARNERS,
            "model_overrides": MODEL, "diloco_options": DILOCO, "batch_seconds": args.batch_seconds,
            "budget_s": args.budget, "repeats": args.repeats, "links": {k: LINKS[k] for k in runs},
            "contenders": {n: CHORUS[n] for n in args.diloco_contenders.split(",")},
            "wall_s": round(time.time() - started, 1),
            "throughput": stats, "sent_bytes_per_sample": per_sample, "checks": checks,
            "passed": all(c["held"] for c in checks.values()), "runs": runs}


DILOCO_WER_CONTENDERS, DILOCO_WER_BOUND = ["ray_train", "diloco"], 0.5


def diloco_wer_section(args, feats: Path) -> dict:
    """Issue 57: Ray Train and DiLoCo at 100 Mbit/s, `--wer-budget` seconds each with dev every
    `--eval-every` seconds, interleaved; when DiLoCo first had Ray Train's best WER (and loss),
    over when Ray Train had it. Writes network-diloco-wer.json and .png."""
    log, started = WORK / "runs-diloco-wer.jsonl", time.time()
    log.unlink(missing_ok=True)
    with Hosts(count=HOSTS, cpus=CPUS) as hosts:
        ray.init(address=hosts.gcs_address, log_to_driver=False,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}})
        try:
            runs = section(DILOCO_WER_CONTENDERS, [WER_LINK], hosts, feats, args.wer_budget, args.eval_every,
                           args.repeats, log)[WER_LINK]
        finally:
            ray.shutdown()
    ttw = time_to_wer(runs)
    ratio = ttw["diloco_wer_ratio"]
    checks = {f"diloco time to ray_train's WER / ray_train's <= {DILOCO_WER_BOUND}": {
        "ratio": ratio and ratio["median"], "held": bool(ratio) and ratio["median"] <= DILOCO_WER_BOUND}}
    return {"benchmark": "network-diloco-wer", "hosts": HOSTS, "cpus_per_host": CPUS, "learners": LEARNERS,
            "model_overrides": MODEL, "diloco_options": DILOCO, "batch_seconds": args.batch_seconds,
            "link": WER_LINK, "wer_budget_s": args.wer_budget, "eval_every_s": args.eval_every,
            "warmup_steps": WER_WARMUP_STEPS, "repeats": args.repeats, "wall_s": round(time.time() - started, 1),
            "throughput": throughput_stats({WER_LINK: runs}), "time_to_wer": ttw, "checks": checks,
            "passed": all(c["held"] for c in checks.values()), "runs": runs}


def plot_diloco_wer(result: dict, path: Path) -> None:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rs in result["runs"].items():
        color = "tab:gray" if name == "ray_train" else "tab:blue"
        for i, r in enumerate(rs):
            scored = [c for c in r["curve"] if c[1] is not None]
            label = name if i == 0 else None
            ax.plot([c[0] for c in scored], [c[1] for c in scored], color=color, alpha=0.6, label=label)
            bx.plot([c[0] for c in scored], [c[2] for c in scored], color=color, alpha=0.6, label=label)
    ax.set(xlabel="seconds from the call that starts training", ylabel="dev WER (%)")
    bx.set(xlabel="seconds from the call that starts training", ylabel="dev loss")
    ax.legend(fontsize=8)
    fig.suptitle(f"DiLoCo and Ray Train at {result['link']}, every repeat", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_diloco(result: dict, path: Path) -> None:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for i, link in enumerate(result["runs"]):
        for name, rs in result["runs"][link].items():
            x = i + (0.15 if name == "allreduce" else -0.15)
            color = "tab:gray" if name == "allreduce" else "tab:blue"
            ax.scatter([x] * len(rs), [r["samples_per_s"] for r in rs], color=color, alpha=0.7,
                       label=name if i == 0 else None)
            bx.scatter([x] * len(rs), [r["sent_bytes_per_sample"] / 1e6 for r in rs], color=color, alpha=0.7)
    for axis in (ax, bx):
        axis.set_xticks(range(len(result["runs"])), list(result["runs"]))
    ax.set_ylabel("samples/s (4 learners, 2 hosts)")
    bx.set_ylabel("MB sent per sample (all learners)")
    bx.set_yscale("log")
    ax.legend(fontsize=8)
    fig.suptitle("DiLoCo (int8, 4 fragments, 60 s rounds) by link; allreduce unshaped", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def results_path(batch_seconds: float) -> Path:
    """results/network.json for tiny.yaml's batches; network-batch<N>s.json for others (another
    setting, not mixed into the first)."""
    name = "network" if batch_seconds == TINY_BATCH_SECONDS else f"network-batch{batch_seconds:g}s"
    return RESULTS / f"{name}.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--contenders", default=",".join(MAIN))
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--budget", type=float, default=45.0, help="training seconds of each throughput run")
    parser.add_argument("--wer-budget", type=float, default=150.0, help="training seconds of each time-to-WER run")
    parser.add_argument("--eval-every", type=float, default=15.0)
    parser.add_argument("--skip", default="", help="sections to leave out: ablations, time_to_wer")
    parser.add_argument("--pilot", action="store_true", help="one run of each, printed, no results written")
    parser.add_argument("--table", action="store_true", help="print results/network.json as Markdown, run nothing")
    parser.add_argument("--earlier", type=Path, action="append", help="a runs.jsonl of an earlier run (repeatable): "
                        "its complete links that this run does not measure go into the results, named as such "
                        "(`earlier`); with --links '' the results are made from these logs alone")
    parser.add_argument("--batch-seconds", type=float, default=BATCH_SECONDS, help="padded seconds a learner a step")
    parser.add_argument("--diloco", action="store_true", help="only: DiLoCo by link against its own unshaped rate "
                        "and allreduce's bytes per sample (issue 57); writes network-diloco.json")
    parser.add_argument("--diloco-links", default=",".join(DILOCO_LINKS), help="with --diloco: the links "
                        "(unshaped first: the baseline)")
    parser.add_argument("--diloco-contenders", default=",".join(DILOCO_CONTENDERS), help="with --diloco: "
                        "the contenders on the unshaped link (without allreduce: no bytes-per-sample check)")
    parser.add_argument("--diloco-out", default="network-diloco.json", help="with --diloco: the results' name")
    parser.add_argument("--diloco-wer", action="store_true", help="only: DiLoCo's time to Ray Train's WER at "
                        "100 Mbit/s (issue 57); writes network-diloco-wer.json")
    parser.add_argument("--secret-cost", type=Path, metavar="TREE", help="only: gossip and allreduce unshaped, from "
                        "this checkout and from TREE (the code before the job's secret), interleaved")
    args = parser.parse_args()
    globals()["BATCH_SECONDS"] = args.batch_seconds
    if args.secret_cost:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        result = secret_cost(args.secret_cost, args.repeats, args.budget, corpus())
        write_results(RESULTS / "network-secret.json", result, plot_secret)
        for kind, verdict in result["after_over_before"].items():
            print(f"{kind}: after / before {verdict}")
        return 0
    if args.diloco:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        result = diloco_section(args, corpus())
        write_results(RESULTS / args.diloco_out, result, plot_diloco)
        for key, check in result["checks"].items():
            print(f"{'ok  ' if check['held'] else 'MISS'} {key}: {check.get('ratio')} ({check.get('verdict', '')})")
        return 0 if result["passed"] else 1
    if args.diloco_wer:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        result = diloco_wer_section(args, corpus())
        write_results(RESULTS / "network-diloco-wer.json", result, plot_diloco_wer)
        for row in result["time_to_wer"]["repeats"]:
            print(row)
        for key, check in result["checks"].items():
            print(f"{'ok  ' if check['held'] else 'MISS'} {key}: {check.get('ratio')}")
        return 0 if result["passed"] else 1
    if args.table:
        print(markdown(json.loads(results_path(args.batch_seconds).read_text())))
        return 0
    links, names = [lk for lk in args.links.split(",") if lk], args.contenders.split(",")
    skip = set(args.skip.split(","))
    unknown = sorted((set(links) - set(LINKS)) | (set(names) - set(MAIN) - set(ABLATIONS)))
    if unknown:
        parser.error(f"unknown links or contenders: {unknown}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # clean up the hosts as on Ctrl-C
    feats = corpus()
    log = WORK / "runs.jsonl"
    started = time.time()
    runs, ttw_runs = measure_all(args, links, names, skip, feats, log) if links else ({}, None)
    if args.pilot:
        return 0
    earlier = {}  # link -> the log it comes from
    for path in args.earlier or []:
        for link, by_name in earlier_runs(path, names, args.repeats, skip=set(runs))["runs"].items():
            runs[link], earlier[link] = by_name, str(path)
    runs = {link: runs[link] for link in LINKS if link in runs}
    stats = throughput_stats(runs)
    ttw = time_to_wer(ttw_runs) if ttw_runs else None
    checks = judge(stats, ttw)
    result = {"benchmark": "network", "hosts": HOSTS, "cpus_per_host": CPUS, "learners": LEARNERS,
              "model_overrides": MODEL, "batch_seconds": args.batch_seconds, "budget_s": args.budget,
              "wer_budget_s": args.wer_budget,
              "eval_every_s": args.eval_every, "repeats": args.repeats, "links": {k: LINKS[k] for k in runs},
              "contenders": {n: CHORUS.get(n, "ray_train (DDP, gloo)") for n in names + ABLATIONS},
              "wall_s": round(time.time() - started, 1), "throughput": stats, "time_to_wer": ttw,
              "checks": checks, "passed": all(c["held"] for c in checks.values()),
              "runs": runs, "time_to_wer_runs": ttw_runs,
              "earlier": earlier}
    write_results(results_path(args.batch_seconds), result, plot)
    print(markdown(result))
    for key, check in checks.items():
        print(f"{'ok  ' if check['held'] else 'MISS'} {key}: {check.get('ratio')} ({check.get('verdict', '')})")
    print(f"passed: {result['passed']}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
