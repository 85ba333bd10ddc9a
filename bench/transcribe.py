"""Benchmark: `chorus transcribe` spread over Ray actors, 1 actor against 2 (issue 58).

A set of >= 1 hour of synthesized speech (`chorus synth --hours 12 --engines espeak`, its train
split; made once into bench/work/transcribe-corpus-12h; `--hours 4 --name transcribe-4h` ran
first) is transcribed with a trained checkpoint (the demo's, runs/demo/checkpoint.pt: `make demo`)
by `chorus transcribe --address HEAD --actors N` (each actor 1 CPU, 1 torch thread), N = 1 and 2,
on one Ray head of this machine's 2 CPUs started once for the whole benchmark (`ray start --head`,
its own temp dir and ports, Ray's metrics interval). Contenders interleaved, `--repeats` each.

Measured per run: the whole command's wall time (process start to exit: Python and Chorus
imports, loading the checkpoint, connecting, starting the actors while the inputs are read, every
utterance, the totals) and the utterances/s it gives; the command's own totals (its wall time from
just before connecting on, the time to its first result, the real-time factor); the rate after the
first result (utterances less the first actor call's, over the time from the first result to the
last: start-up left out; with 2 actors the second call's results come just after the first's, so
this favours them by up to one call, 256 of the set's utterances); and where the cores went: CPU
seconds of the actors, of the command's own process and of everything else on the machine (Ray's
daemons among it), from /proc, sampled every 0.2 s. Each run's output is checked: every utterance
of the set exactly once, in the set's order.

For the machine's own bound, interleaved with them: the same command without Ray (`local_1`: one
process, 1 torch thread) and two such processes at once on the set's halves (`local_2`).

Target: 2 actors >= 1.7x the utterances/s of 1 (median of whole-command rates, IQRs apart).

Writes `bench/results/transcribe.json` and `transcribe.png`.

Usage: .venv/bin/python bench/transcribe.py [--repeats 5] [--checkpoint runs/demo/checkpoint.pt] [--hours 12]
       [--name transcribe]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from harness.stats import compare, interleaved, summary  # noqa: E402

RESULT = ROOT / "bench" / "results" / "transcribe.json"
WORK = ROOT / "bench" / "work"
TARGET = 1.7
ACTORS = (1, 2)
FIRST_CALL = 256  # utterances of an actor's first call (orchestrator/service/batch_inference.py, BATCH_RECORDS)


def corpus(hours: float) -> Path:
    """The train split's manifest of a synthesized set of about `hours`, made once."""
    folder = WORK / f"transcribe-corpus-{hours:g}h"
    if not (folder / "corpus.json").is_file():
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "synth", str(folder), "--hours", str(hours),
                        "--eval-utterances", "20", "--seed", "58", "--engines", "espeak"], cwd=ROOT, check=True)
    return folder / "train.jsonl"


class CoresUsed:
    """CPU seconds the processes on this machine used while watched, summed by what they were: the
    pool's actors and everything else (sampled from /proc every 0.2 s, so a process's last 0.2 s
    may be missed), and the command's process (its rusage, whole)."""

    def __init__(self):
        self.first, self.last, self.stop = self._sample(), {}, threading.Event()
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    @staticmethod
    def _sample() -> dict[int, tuple[float, str]]:
        seen = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            seen[int(pid)] = ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), name)
        return seen

    def _watch(self) -> None:
        while not self.stop.wait(0.2):
            for pid, (cpu, name) in self._sample().items():  # a dying process's name reads empty: keep the last
                self.last[pid] = (cpu, name if name.strip() or pid not in self.last else self.last[pid][1])

    def finish(self, command_pid: int) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command's, reaped by now
        used = {"actors_cpu_s": 0.0, "other_cpu_s": 0.0, "command_cpu_s": after.ru_utime + after.ru_stime
                - self.children.ru_utime - self.children.ru_stime}
        for pid, (cpu, name) in self.last.items():
            if pid != command_pid:
                used["actors_cpu_s" if "_Worker" in name else "other_cpu_s"] += cpu - self.first.get(pid, (0.0, ""))[0]
        return {k: round(v, 2) for k, v in used.items()}


def transcribe(checkpoint: Path, manifest: Path, address: str, env: dict, actors: int, expected: list[str]) -> dict:
    """One run of the command; its figures, its output checked against `expected` (the set's paths)."""
    out = WORK / f"transcribe-{actors}.jsonl"
    cores = CoresUsed()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "transcribe", str(checkpoint), str(manifest),
                             "--address", address, "--actors", str(actors), "--cpus-per-actor", "1", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = proc.communicate()[1]
    wall = time.monotonic() - started
    used = cores.finish(proc.pid)
    if proc.returncode != 0:
        raise RuntimeError(f"chorus transcribe --actors {actors} failed: {stderr[-2000:]}")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    records, totals = lines[:-1], lines[-1]["totals"]
    if [r["path"] for r in records] != expected:
        raise RuntimeError(f"--actors {actors}: the output is not every utterance once, in order")
    after_first = (len(records) - FIRST_CALL) / (totals["wall_s"] - totals["first_result_s"])
    return {"wall_s": wall, "utterances_per_s": len(records) / wall, "after_first_result_utterances_per_s": after_first,
            **used, **{f"command_{k}": v for k, v in totals.items() if k not in {"skipped", "wer"}}}


def without_ray(checkpoint: Path, manifests: list[Path], expected: list[str]) -> dict:
    """The command without Ray, one process a manifest at once (1 torch thread each); checked as above."""
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "transcribe", str(checkpoint), str(m), "--out",
                               str(WORK / f"local-{k}.jsonl")], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for k, m in enumerate(manifests)]
    errors = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - started
    if any(p.returncode for p in procs):
        raise RuntimeError(f"chorus transcribe without Ray failed: {errors}")
    paths = [json.loads(line)["path"] for k in range(len(manifests))
             for line in (WORK / f"local-{k}.jsonl").read_text().splitlines()[:-1]]
    if paths != expected:
        raise RuntimeError("without Ray: the output is not every utterance once, in order")
    return {"wall_s": wall, "utterances_per_s": len(paths) / wall}


def halves(manifest: Path) -> list[Path]:
    """The manifest's two halves, its paths made absolute, in bench/work."""
    lines = manifest.read_text().splitlines()
    out = []
    for k, part in enumerate((lines[:len(lines) // 2], lines[len(lines) // 2:])):
        rows = [{**json.loads(line), "audio_filepath": str((manifest.parent / json.loads(line)["audio_filepath"])
                                                         .resolve())} for line in part]
        out.append(WORK / f"transcribe-half-{k}.jsonl")
        out[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "runs" / "demo" / "checkpoint.pt")
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--name", default="transcribe", help="results/NAME.json and .png")
    args = parser.parse_args()
    if not args.checkpoint.exists():
        sys.exit(f"{args.checkpoint}: no checkpoint; `make demo` trains the demo's")
    from orchestrator.cluster.local_head import HeadNode

    manifest = corpus(args.hours)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    expected = [str((manifest.parent / r["audio_filepath"]).resolve()) for r in rows]
    hours = sum(r["duration"] for r in rows) / 3600
    head = HeadNode(cpus=2, token=False, dashboard=False, temp_prefix="chorus-bench-transcribe-",
                    system_config={"metrics_report_interval_ms": 10_000})  # Ray's default, not the tests' 1 s
    runs: dict[str, list[dict]] = {name: [] for name in ("actors_1", "actors_2", "local_1", "local_2")}
    parts = halves(manifest)

    def contender(name: str, measure):
        def run(repeat: int) -> float:
            runs[name].append(measure())
            return runs[name][-1]["utterances_per_s"]
        return run

    try:
        rates = interleaved({
            **{f"actors_{n}": contender(f"actors_{n}", lambda n=n: transcribe(
                args.checkpoint, manifest, head.gcs_address, head.env, n, expected)) for n in ACTORS},
            "local_1": contender("local_1", lambda: without_ray(args.checkpoint, [manifest], expected)),
            "local_2": contender("local_2", lambda: without_ray(args.checkpoint, parts, expected))},
            repeats=args.repeats)
    finally:
        head.stop()
    contenders = {name: {"utterances_per_s": summary(rates[name]), "wall_s": summary([r["wall_s"] for r in runs[name]]),
                         **{key: summary([r[key] for r in runs[name]]) for key in (
                             "after_first_result_utterances_per_s", "command_first_result_s",
                             "command_real_time_factor", "actors_cpu_s", "command_cpu_s", "other_cpu_s")
                             if key in runs[name][0]},
                         "runs": runs[name]} for name in rates}
    speedup = compare(contenders["actors_2"]["utterances_per_s"], contenders["actors_1"]["utterances_per_s"])
    after_first = compare(contenders["actors_2"]["after_first_result_utterances_per_s"],
                          contenders["actors_1"]["after_first_result_utterances_per_s"])
    bound = compare(contenders["local_2"]["utterances_per_s"], contenders["local_1"]["utterances_per_s"])
    result = {"benchmark": "transcribe", "commit": commit(), "checkpoint": str(args.checkpoint),
              "set": {"manifest": str(manifest.relative_to(ROOT)), "utterances": len(rows), "hours": round(hours, 4)},
              "machine": "2 cores; one Ray head of 2 CPUs on it; each actor 1 CPU",
              "repeats": args.repeats, "contenders": contenders, "speedup_2_over_1": speedup,
              "speedup_after_first_result": after_first, "without_ray_2_over_1": bound, "target": TARGET,
              "passed": bool(speedup["ratio"] and speedup["ratio"] >= TARGET and speedup["verdict"] == "higher")}
    write_results(RESULT.with_name(f"{args.name}.json"), result, plot)
    print(json.dumps({k: result[k] for k in ("set", "speedup_2_over_1", "speedup_after_first_result",
                                             "without_ray_2_over_1", "passed")}))


def plot(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.4))
    names = list(result["contenders"])
    colors = {"actors_1": "tab:blue", "actors_2": "tab:green", "local_1": "tab:gray", "local_2": "silver"}
    for x, name in enumerate(names):
        s = result["contenders"][name]["utterances_per_s"]
        low, high = s["iqr"]
        ax.bar(x, s["median"], color=colors[name], alpha=0.85)
        ax.errorbar(x, s["median"], yerr=[[s["median"] - low], [high - s["median"]]], color="black", capsize=6)
        ax.scatter([x] * len(s["runs"]), s["runs"], color="black", s=10, zorder=3)
        rtf = result["contenders"][name].get("command_real_time_factor", {}).get("median")
        ax.text(x + 0.3, s["median"] * 0.5, f"{s['median']:.0f} utt/s" + (f"\nRTF {rtf:.4f}" if rtf else ""),
                ha="center", va="center", rotation=90, fontsize=8)
    one = result["contenders"]["actors_1"]["utterances_per_s"]["median"]
    ax.hlines(TARGET * one, 0.6, 1.4, color="red", ls="--", lw=1, label=f"{TARGET}x one actor")
    ax.set_xticks(range(len(names)), ["Ray, 1 actor", "Ray, 2 actors", "no Ray,\n1 process",
                                      "no Ray, 2 processes\n(halves)"])
    ax.set_ylabel("utterances/s, whole command\n(bars: median; whiskers: IQR; dots: runs)")
    s = result["set"]
    ax.set_title(f"chorus transcribe, {s['utterances']} utterances ({s['hours']:.2f} h), 2 cores: 2 actors "
                 f"{result['speedup_2_over_1']['ratio']}x 1; without Ray 2 processes "
                 f"{result['without_ray_2_over_1']['ratio']}x 1", fontsize=8)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
