"""Benchmark: what strangers cost a job (issue 56). On two hosts with addresses of their own (token
authentication on) and a third of the strangers', for a 2-learner gossip job, a 2-learner
allreduce job and a 2x2 hierarchical job, runs with and without strangers interleaved (`probed`:
`orchestrator/testing/probed_job.py`, a stranger on a member's host and one on its own host probing
every port the learners listen on, once their group has formed), `--repeats` each, the same spec
(tests/builders.py's small BiLSTM on the 160-utterance test corpus, `--epochs`, no rebalancing).

Per run: final train loss, test WER, samples/s; probed runs also the refusals counted, what
Chorus's listeners and a library's kept, memory growth. Per kind: median and IQR of each, probed
over unprobed (a tie unless the IQRs are apart), and the unprobed runs' spread (max - min: the
noise tests/orchestrator/groups/test_strangers.py allows). `passed` when neither the loss nor the
WER of the probed runs is worse than the unprobed ones' outside the noise, every probe found
Chorus's listeners settled, and no stranger read or wrote a key. samples/s is reported, not
judged: the strangers run on the job's own 2 cores here, so a probed run trains beside them.
Writes `bench/results/strangers.json` and `.png`.

    .venv/bin/python bench/strangers.py --repeats 5      # as root (namespaces), nothing heavy beside it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import compare, interleaved, summary  # noqa: E402

from jobs.synth.corpus import synthesize  # noqa: E402
from orchestrator.testing.hosts import Hosts  # noqa: E402
from orchestrator.testing.probed_job import ProbedJob  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "strangers"
KINDS = {"gossip": (2, 2), "allreduce": (2, 2), "hierarchical": (4, 1)}  # kind -> (learners, CPUs each)
FIGURES = ("final_train_loss", "wer_test", "samples_per_s")
JUDGED = {"final_train_loss": "higher", "wer_test": "higher"}  # figure -> the verdict that is worse


def corpus() -> Path:
    """The test suite's corpus (tests/conftest.py: 160 utterances, 20 each in dev, test, test-unseen)."""
    out = WORK / "corpus"
    if not (out / "corpus.json").is_file():
        synthesize(out, utterances=160, eval_utterances=20, seed=7, workers=2, progress=False, engines="espeak")
    return out


def spec(data: Path, name: str, kind: str, epochs: int) -> dict:
    """tests/orchestrator/groups/test_strangers.py's (tests/builders.py's `make_spec`): a BiLSTM of ~30k
    parameters, 10 s batches, lr 3e-3 after 10 warm-up steps, `epochs` epochs, no rebalancing."""
    learners, cpus = KINDS[kind]
    return {"name": name, "learners": learners, "cpus_per_learner": cpus, "group": {"kind": kind, "balance": False},
            "data": {"train": str(data / "train.jsonl"), "test": str(data / "test.jsonl"), "max_batch_seconds": 10},
            "model": {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1},
            "optim": {"lr": 3e-3, "warmup_steps": 10, "schedule": "constant"}, "budget": {"epochs": epochs}}


def run(hosts: Hosts, data: Path, kind: str, probed: bool, epochs: int, serial: list) -> dict:
    serial[0] += 1
    name = f"{'p' if probed else 'u'}{kind[:3]}{serial[0]}"
    job = ProbedJob(hosts, spec(data, name, kind, epochs), WORK / "runs" / name)
    probe = job.probe(KINDS[kind][0]) if probed else None
    s = job.summary()
    result = {"kind": kind, "probed": probed, **{f: s[f] for f in FIGURES}, "refused": s["refused"]}
    if probe is not None:
        pids = list(probe.listening)
        result.update(
            chorus_listeners=len(probe.chorus), chorus_settled=probe.settled, settle_s=round(probe.settle_s, 2),
            keys_touched=sum(v == "ok" for a in probe.attacks.values() for r in a["targets"].values()
                             for v in r["tcpstore"].values()),
            ray_answered=any(a["ray"]["answered"] for a in probe.attacks.values()),
            library_kept=sum(max(0, n) for ports in probe.kept_by_library().values() for n in ports.values()),
            rss_growth_mb=round(max((probe.after[p][0] - probe.before[p][0]) / 2**20 for p in pids), 1))
    print(f"[{kind} {'probed' if probed else 'unprobed'}] " + json.dumps(result, allow_nan=False), flush=True)
    return result


def plot(result: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(12, 4))
    for ax, figure in zip(axes, FIGURES, strict=True):
        for i, kind in enumerate(result["kinds"]):
            for offset, probed, color in ((-0.15, "unprobed", "tab:gray"), (0.15, "probed", "tab:red")):
                values = [r[figure] for r in result["kinds"][kind]["runs"][probed]]
                ax.scatter([i + offset] * len(values), values, color=color, alpha=0.7,
                           label=probed if i == 0 else None)
        ax.set_xticks(range(len(result["kinds"])), list(result["kinds"]))
        ax.set_title(figure, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle("Jobs with and without strangers probing every learner port (each dot a run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def judge(kinds: dict) -> bool:
    """Whether strangers cost the jobs nothing (see the module's docstring); notes each kind's
    `worse_outside_noise`."""
    for k in kinds.values():
        verdicts = k["probed_over_unprobed"]
        k["worse_outside_noise"] = [f for f, worse in JUDGED.items() if verdicts[f]["verdict"] == worse]
    probes = [r for k in kinds.values() for r in k["runs"]["probed"]]
    return all(not k["worse_outside_noise"] for k in kinds.values()) and all(
        r["chorus_settled"] and not r["keys_touched"] and not r["ray_answered"]
        and (r["chorus_listeners"] or r["kind"] == "allreduce") for r in probes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    shutil.rmtree(WORK / "runs", ignore_errors=True)  # (a cut-short run's folders: each run starts afresh)
    (WORK / "runs").mkdir(parents=True)
    data, serial, kinds = corpus(), [0], {}
    started = time.time()
    with Hosts(count=2, cpus=2, token=True, strangers=1) as hosts:
        for kind in args.kinds.split(","):
            runs = {"unprobed": [], "probed": []}

            def contender(probed: bool, kind: str = kind, runs: dict = runs):
                def one(_repeat: int) -> float:
                    runs["probed" if probed else "unprobed"].append(run(hosts, data, kind, probed, args.epochs,
                                                                        serial))
                    return runs["probed" if probed else "unprobed"][-1]["final_train_loss"]
                return one
            interleaved({"unprobed": contender(False), "probed": contender(True)}, repeats=args.repeats)
            stats = {p: {f: summary([r[f] for r in runs[p]], 3) for f in FIGURES} for p in runs}
            verdicts = {f: compare(stats["probed"][f], stats["unprobed"][f]) for f in FIGURES}
            spread = {f: round(max(r[f] for r in runs["unprobed"]) - min(r[f] for r in runs["unprobed"]), 3)
                      for f in FIGURES}
            kinds[kind] = {"stats": stats, "probed_over_unprobed": verdicts, "unprobed_spread": spread, "runs": runs}
    passed = judge(kinds)
    result = {"benchmark": "strangers", "commit": commit(), "measured_at": time.strftime("%Y-%m-%d %H:%M %Z"),
              "repeats": args.repeats, "epochs": args.epochs, "wall_s": round(time.time() - started),
              "kinds": kinds, "passed": passed}
    write_results(RESULTS / "strangers.json", result, plot)
    for kind, k in kinds.items():
        print(kind, {f: (k["stats"]["unprobed"][f]["median"], k["stats"]["probed"][f]["median"],
                         k["probed_over_unprobed"][f]["verdict"]) for f in FIGURES}, "spread", k["unprobed_spread"])
    print(f"passed: {passed}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
