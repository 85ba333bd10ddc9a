"""Benchmark: the `search/configs/bohb_tiny.yaml` sweep, end to end through `chorus sweep`, on a
2,000-utterance synthetic corpus, next to its baseline: `tiny.yaml` as shipped, trained with the
same 2 learners for the sweep's maximum budget (27 epochs) through `chorus train`.

Targets (issue 5): the sweep finishes within 30 minutes and its best trial reaches WER <= 5% on
`test`; trials are paused and resumed from checkpoints. Reported as ratios: sweep wall / 1800 s,
best-trial test WER / 5%, and best-trial test WER / the baseline's. Writes
`bench/results/sweep_tiny.json`, `sweep_tiny.csv` (the sweep's results) and `sweep_tiny.png` (every
trial's dev WER per epoch, rungs dotted, resumptions circled).

Usage: .venv/bin/python bench/sweep_tiny.py [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from jobs.synth.corpus import data_overrides, synthesize

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "sweep_tiny"
WALL_TARGET_S, WER_TARGET = 1800.0, 5.0
EPOCHS = 27  # the sweep's maximum budget


def chorus(*args: str) -> tuple[dict, float]:
    """Run `chorus ARGS`; its last stdout line (the summary JSON) and its wall time."""
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"chorus {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def du_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    corpus = WORK / "corpus-2000-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=2000, eval_utterances=200, seed=0, progress=False)
    data = data_overrides(corpus, prefix="job.data.")
    out = WORK / "sweep"
    shutil.rmtree(out, ignore_errors=True)
    sweep_args = [a for d in data for a in ("--set", d)]
    summary, wall = chorus("sweep", "search/configs/bohb_tiny.yaml", *sweep_args, "--out", str(out))
    result = {
        "sweep": "search/configs/bohb_tiny.yaml", "wall_s": round(wall, 1), "wall_target_s": WALL_TARGET_S,
        "wall_ratio": round(wall / WALL_TARGET_S, 3), "wer_test": summary["wer_test"], "wer_target": WER_TARGET,
        "wer_ratio": round(summary["wer_test"] / WER_TARGET, 3) if summary["wer_test"] is not None else None,
        "wer_test_unseen": (summary["best_job_summary"] or {}).get("wer_test_unseen"),
        "best_config": summary["best_config"], "best_dev_wer": summary["best_metric"],
        "trials": summary["trials"], "trials_by_outcome": summary["trials_by_outcome"],
        "trials_resumed": summary["trials_resumed"], "epochs_trained": summary["epochs_trained"],
        "learner_seconds": summary["learner_seconds"], "out_mb": du_mb(out),
    }
    result["passed"] = (wall <= WALL_TARGET_S and result["wer_test"] is not None
                        and result["wer_test"] <= WER_TARGET and result["trials_resumed"] > 0)
    if not args.no_baseline:
        base_out = WORK / "baseline"
        shutil.rmtree(base_out, ignore_errors=True)
        base, base_wall = chorus("train", "jobs/configs/tiny.yaml", "--set", "learners=2",
                                 "--set", f"budget.epochs={EPOCHS}", "--set", "budget.wall_seconds=null",
                                 *[a for d in data for a in ("--set", d.removeprefix("job."))], "--out", str(base_out))
        result["baseline"] = {"spec": "jobs/configs/tiny.yaml", "learners": 2, "epochs": EPOCHS,
                              "wall_s": round(base_wall, 1), "wer_test": base["wer_test"],
                              "wer_test_unseen": base.get("wer_test_unseen"), "wer_dev": base.get("wer_dev")}
        result["wer_vs_baseline"] = round(result["wer_test"] / base["wer_test"], 3) if base["wer_test"] else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sweep_tiny.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.copy(out / "results.csv", RESULTS / "sweep_tiny.csv")
    shutil.copy(out / "learning_curves.png", RESULTS / "sweep_tiny.png")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
