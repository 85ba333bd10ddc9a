"""Benchmark: the one-learner tiny ASR job, end to end on this machine.

Synthesizes a 2,000-utterance training corpus (plus 200 each for dev, test and test-unseen),
trains `jobs/configs/tiny.yaml` on one in-process learner within a 6-minute wall budget, and
reports WER on `test` (target: <= 5%) and on `test-unseen` (voices never heard in training). It also
measures feature extraction (FLAC decode + 80-dim fbank + normalization) as x real time on one
core. Writes `bench/results/tiny_asr.json` (`tiny_asr_seed<N>.json` for another seed) and a PNG
learning curve (dev WER against wall time).

Usage: .venv/bin/python bench/tiny_asr.py [--utterances 2000] [--wall-seconds 330]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jobs.data.manifests import load_audio, read_corpus  # noqa: E402
from jobs.features.filterbanks import Fbank  # noqa: E402
from jobs.synth.corpus import data_overrides, synthesize  # noqa: E402
from orchestrator.cli.train import format_eval  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "tiny_asr"
WER_TARGET = 5.0
WALL_LIMIT = 360.0


def feature_speed(manifest: Path, utterances: int = 300) -> dict:
    """x real time per core of decode+fbank and of fbank alone, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        utts, _ = read_corpus(manifest)
        utts = utts[:utterances]
        audio_s = sum(u.duration for u in utts)
        fbank = Fbank(80)
        t0 = time.perf_counter()
        waves = [load_audio(u.path) for u in utts]
        t1 = time.perf_counter()
        for w in waves:
            fbank(w)
        t2 = time.perf_counter()
    finally:
        torch.set_num_threads(threads)
    return {"utterances": len(utts), "audio_seconds": round(audio_s, 1),
            "decode_and_fbank_x_realtime_per_core": round(audio_s / (t2 - t0), 1),
            "fbank_x_realtime_per_core": round(audio_s / (t2 - t1), 1)}


def plot(evals: list[dict], summary: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([e["wall_s"] for e in evals], [e["dev_wer"] for e in evals], marker="o", ms=3, label="dev WER")
    ax.axhline(WER_TARGET, color="red", ls="--", lw=1, label=f"target {WER_TARGET:g}% (test)")
    ax.scatter([summary["wall_s"]], [summary["wer_test"]], color="green", zorder=5,
               label=f"test {summary['wer_test']:.2f}%")
    ax.scatter([summary["wall_s"]], [summary["wer_test_unseen"]], color="orange", zorder=5,
               label=f"test-unseen {summary['wer_test_unseen']:.2f}%")
    ax.set(xlabel="wall time (s)", ylabel="WER (%)", yscale="log",
           title="tiny.yaml, 1 learner, 2 CPU cores: WER against wall time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--utterances", type=int, default=2000)
    parser.add_argument("--wall-seconds", type=float, default=345.0,
                        help="training budget; evaluation on test/test-unseen comes after it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)

    corpus = WORK / f"corpus-{args.utterances}-{args.seed}"
    t0 = time.perf_counter()
    synthesize(corpus, utterances=args.utterances, eval_utterances=200, seed=args.seed)
    synth_s = time.perf_counter() - t0

    spec = load_spec(ROOT / "jobs" / "configs" / "tiny.yaml", [
        *data_overrides(corpus), f"budget.wall_seconds={args.wall_seconds}",
        "budget.epochs=null", f"seed={args.seed}",
    ])
    job = TrainingJob(spec, WORK / "run", report=lambda r: print(format_eval(r), flush=True), overwrite=True)
    summary = job.run()
    speed = feature_speed(corpus / "test.jsonl")

    result = {
        "benchmark": "tiny_asr",
        "machine": {"cpus": torch.get_num_threads(), "torch": torch.__version__},
        "corpus": {"train_utterances": args.utterances, "eval_utterances": 200, "synth_seconds": round(synth_s, 1)},
        "wer_test": summary["wer_test"],
        "wer_test_unseen": summary["wer_test_unseen"],
        "wer_test_unseen_engine": summary.get("wer_test_unseen_engine"),
        "wer_dev": summary["wer_dev"],
        "wer_target": WER_TARGET,
        "wer_test_vs_target": round(summary["wer_test"] / WER_TARGET, 3),
        "wall_s": summary["wall_s"],
        "wall_limit_s": WALL_LIMIT,
        "wall_vs_limit": round(summary["wall_s"] / WALL_LIMIT, 3),
        "features": speed,
        "passed": summary["wer_test"] <= WER_TARGET and summary["wall_s"] <= WALL_LIMIT,
        "summary": summary,
        "evals": job.evals,
    }
    stem = "tiny_asr" if args.seed == 0 else f"tiny_asr_seed{args.seed}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(job.evals, summary, RESULTS / f"{stem}.png")
    print(json.dumps({k: result[k] for k in ("wer_test", "wer_test_unseen", "wer_test_vs_target", "wall_s",
                                              "wall_vs_limit", "features", "passed")}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
