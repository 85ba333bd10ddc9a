"""Benchmark: `chorus transcribe` spread over Ray actors, 1 actor against 2 (issue 58).

A set of >= 1 hour of synthesized speech (`chorus synth --hours 4 --engines espeak`, its train
split; made once into bench/work/transcribe-corpus) is transcribed with a trained checkpoint (the
demo's, runs/demo/checkpoint.pt: `make demo`) by `chorus transcribe --address HEAD --actors N`
(each actor 1 CPU, 1 torch thread), N = 1 and 2, on one Ray head of this machine's 2 CPUs started
once for the whole benchmark (`ray start --head`, its own temp dir and ports). Contenders
interleaved, `--repeats` each.

Measured per run: the whole command's wall time (process start to exit: Python and Chorus
imports, reading the inputs, connecting, starting the actors, every utterance, the totals) and
the utterances/s it gives; the command's own totals (its wall time from connecting on, the time
to its first result, the real-time factor). Each run's output is checked: every utterance of
the set exactly once, in the set's order.

Target: 2 actors >= 1.7x the utterances/s of 1 (median of whole-command rates, IQRs apart).

Writes `bench/results/transcribe.json` and `transcribe.png`.

Usage: .venv/bin/python bench/transcribe.py [--repeats 5] [--checkpoint runs/demo/checkpoint.pt] [--hours 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
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

RESULT = ROOT / "bench" / "results" / "transcribe.json"
WORK = ROOT / "bench" / "work"
TARGET = 1.7
ACTORS = (1, 2)


def corpus(hours: float) -> Path:
    """The train split's manifest of a synthesized set of about `hours`, made once."""
    folder = WORK / "transcribe-corpus"
    if not (folder / "corpus.json").is_file():
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "synth", str(folder), "--hours", str(hours),
                        "--eval-utterances", "20", "--seed", "58", "--engines", "espeak"], cwd=ROOT, check=True)
    return folder / "train.jsonl"


def transcribe(checkpoint: Path, manifest: Path, address: str, env: dict, actors: int, expected: list[str]) -> dict:
    """One run of the command; its figures, its output checked against `expected` (the set's paths)."""
    out = WORK / f"transcribe-{actors}.jsonl"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "transcribe", str(checkpoint), str(manifest),
                           "--address", address, "--actors", str(actors), "--cpus-per-actor", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"chorus transcribe --actors {actors} failed: {proc.stderr[-2000:]}")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    records, totals = lines[:-1], lines[-1]["totals"]
    if [r["path"] for r in records] != expected:
        raise RuntimeError(f"--actors {actors}: the output is not every utterance once, in order")
    return {"wall_s": wall, "utterances_per_s": len(records) / wall, **{f"command_{k}": v for k, v in totals.items()
                                                                          if k not in {"skipped", "wer"}}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "runs" / "demo" / "checkpoint.pt")
    parser.add_argument("--hours", type=float, default=4.0)
    args = parser.parse_args()
    if not args.checkpoint.exists():
        sys.exit(f"{args.checkpoint}: no checkpoint; `make demo` trains the demo's")
    from orchestrator.cluster.local_head import HeadNode

    manifest = corpus(args.hours)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    expected = [str((manifest.parent / r["audio_filepath"]).resolve()) for r in rows]
    hours = sum(r["duration"] for r in rows) / 3600
    head = HeadNode(cpus=2, token=False, dashboard=False, temp_prefix="chorus-bench-transcribe-")
    runs: dict[str, list[dict]] = {f"actors_{n}": [] for n in ACTORS}

    def contender(n: int):
        def run(repeat: int) -> float:
            runs[f"actors_{n}"].append(transcribe(args.checkpoint, manifest, head.gcs_address, head.env, n, expected))
            return runs[f"actors_{n}"][-1]["utterances_per_s"]
        return run

    try:
        rates = interleaved({f"actors_{n}": contender(n) for n in ACTORS}, repeats=args.repeats)
    finally:
        head.stop()
    contenders = {name: {"utterances_per_s": summary(rates[name]),
                         "wall_s": summary([r["wall_s"] for r in runs[name]]),
                         "command_first_result_s": summary([r["command_first_result_s"] for r in runs[name]]),
                         "command_real_time_factor": summary([r["command_real_time_factor"] for r in runs[name]]),
                         "runs": runs[name]} for name in rates}
    speedup = compare(contenders["actors_2"]["utterances_per_s"], contenders["actors_1"]["utterances_per_s"])
    result = {"benchmark": "transcribe", "commit": commit(), "checkpoint": str(args.checkpoint),
              "set": {"manifest": str(manifest.relative_to(ROOT)), "utterances": len(rows), "hours": round(hours, 4)},
              "machine": "2 cores; one Ray head of 2 CPUs on it; each actor 1 CPU",
              "repeats": args.repeats, "contenders": contenders, "speedup_2_over_1": speedup, "target": TARGET,
              "passed": bool(speedup["ratio"] and speedup["ratio"] >= TARGET and speedup["verdict"] == "higher")}
    write_results(RESULT, result, plot)
    print(json.dumps({k: result[k] for k in ("set", "speedup_2_over_1", "passed")}))


def plot(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for x, name in enumerate(result["contenders"]):
        s = result["contenders"][name]["utterances_per_s"]
        low, high = s["iqr"]
        ax.bar(x, s["median"], color=["tab:blue", "tab:green"][x], alpha=0.85)
        ax.errorbar(x, s["median"], yerr=[[s["median"] - low], [high - s["median"]]], color="black", capsize=6)
        ax.scatter([x] * len(s["runs"]), s["runs"], color="black", s=10, zorder=3)
        rtf = result["contenders"][name]["command_real_time_factor"]["median"]
        ax.text(x, high * 1.02, f"{s['median']:.0f} utt/s\nRTF {rtf:.4f}", ha="center", fontsize=8)
    one = result["contenders"]["actors_1"]["utterances_per_s"]["median"]
    ax.hlines(TARGET * one, 0.6, 1.4, color="red", ls="--", lw=1, label=f"{TARGET}x one actor")
    ax.set_xticks(range(len(result["contenders"])), ["1 actor", "2 actors"])
    ax.set_ylabel("utterances/s, whole command\n(bars: median; whiskers: IQR; dots: runs)")
    s = result["set"]
    ax.set_title(f"chorus transcribe: {s['utterances']} utterances, {s['hours']:.2f} h; "
                 f"{result['speedup_2_over_1']['ratio']}x ({result['speedup_2_over_1']['verdict']})", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
