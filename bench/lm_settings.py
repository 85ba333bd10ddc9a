"""Benchmark: openvocab.yaml's decoding settings, checked on dev (issue 41).

The recipe's `decoding` (the trigram's weight 0.5, word score 0, beam 50, 16 units tried a frame)
was chosen on 100 test utterances. Here dev's 400 utterances, which chose nothing, are decoded by
the final models of bench/openvocab.py's runs (kept in bench/work/openvocab/run-features-<seed>)
at the recipe's setting and at settings around it: other weights and word scores at the same
search (same beam and units: the same cost), and smaller and larger searches. Per setting: each
model's dev WER, their median, and the seconds the evaluation took (one pass: a guide to the cost,
not a timing benchmark).

Check: no setting of the same search is better than the recipe's by more than `TOLERANCE` WER
points (median over the models). Larger searches are reported, not judged: they cost more.

Writes `bench/results/lm-settings.json` and `lm-settings.png`.

Usage: .venv/bin/python bench/lm_settings.py [--runs run-features-1 run-features-2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from harness.results import commit, write_results  # noqa: E402
from openvocab import RECIPE, WORK, overrides  # noqa: E402

from jobs.workload import AsrWorkload  # noqa: E402
from orchestrator.checkpoint.files import load  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CORPUS = WORK / "corpus-20h-0"
KNOBS = ("lm_weight", "word_score", "beam", "beam_tokens")
SETTINGS = [  # (lm_weight, word_score, beam, beam_tokens); the recipe's first
    (0.5, 0.0, 50, 16), (0.3, 0.0, 50, 16), (0.8, 0.0, 50, 16), (0.5, 1.0, 50, 16), (0.8, 1.0, 50, 16),
    (0.5, -1.0, 50, 16), (0.5, 0.0, 20, 16), (0.5, 0.0, 50, 8), (0.5, 0.0, 100, 16),
]
TOLERANCE = 0.5  # WER points


def dev_wer(spec, state: dict, setting: tuple) -> tuple[float, float]:
    """Dev WER of a model's state decoded at `setting`, and the evaluation's seconds."""
    decoding = spec.workload_config.decoding.model_copy(update=dict(zip(KNOBS, setting, strict=True)))
    workload = AsrWorkload(spec.workload_config.model_copy(update={"decoding": decoding}), seed=spec.seed)
    model = workload.build_model()
    workload.load_state_dict(state, model)
    start = time.perf_counter()
    wer = workload.evaluate(model, "dev")["wer"]
    return round(wer, 2), round(time.perf_counter() - start, 1)


def label(setting: tuple) -> str:
    weight, score, beam, units = setting
    return f"w {weight:g}, ws {score:+g}\nbeam {beam}/{units}"


def plot(result: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4.2))
    rows = result["settings"]
    medians = [r["median_wer"] for r in rows]
    colors = ["C3" if r["recipe"] else ("C0" if r["same_search"] else "C7") for r in rows]
    ax.bar(range(len(rows)), medians, color=colors)
    for x, row in enumerate(rows):
        ax.text(x, row["median_wer"], f"{row['median_wer']:.2f}\n{row['median_s']:.0f} s", ha="center",
                va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [label(tuple(r[k] for k in KNOBS)) for r in rows], fontsize=7)
    ax.set_ylim(min(medians) - 2, max(medians) + 1.5)
    ax.set_ylabel(f"dev WER (%), median of {len(result['runs'])} models")
    ax.set_title("openvocab.yaml's decoding on dev: the recipe's (red), the same search (blue), "
                 "other searches (grey); seconds per evaluation above", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["run-features-1", "run-features-2"],
                        help="folders under bench/work/openvocab holding a run's checkpoint.pt")
    args = parser.parse_args()
    missing = [run for run in args.runs if not (WORK / run / "checkpoint.pt").is_file()]
    if missing:
        raise SystemExit(f"no checkpoint.pt in {', '.join(str(WORK / r) for r in missing)}: "
                         f"run bench/openvocab.py --shard-features --keep-runs first")
    spec = load_spec(RECIPE, overrides(CORPUS, 1800, 0, True))
    recipe = tuple(getattr(spec.workload_config.decoding, k) for k in KNOBS)
    if recipe != SETTINGS[0]:
        raise SystemExit(f"{RECIPE}: its decoding {recipe} is not the one checked here {SETTINGS[0]}")
    started, rows = time.time(), []
    states = {run: load(WORK / run / "checkpoint.pt").state for run in args.runs}
    for setting in SETTINGS:
        found = {run: dev_wer(spec, state, setting) for run, state in states.items()}
        rows.append({**dict(zip(KNOBS, setting, strict=True)), "recipe": setting == recipe,
                     "same_search": setting[2:] == recipe[2:],
                     "wer": {run: wer for run, (wer, _) in found.items()},
                     "seconds": {run: s for run, (_, s) in found.items()},
                     "median_wer": statistics.median(w for w, _ in found.values()),
                     "median_s": statistics.median(s for _, s in found.values())})
        print(label(setting).replace("\n", ", "), rows[-1]["wer"], rows[-1]["median_s"], "s", flush=True)
    mine = rows[0]["median_wer"]
    best = min((r for r in rows[1:] if r["same_search"]), key=lambda r: r["median_wer"])
    result = {"benchmark": "lm-settings", "commit": commit(), "corpus": str(CORPUS.relative_to(ROOT)),
              "runs": args.runs, "settings": rows, "tolerance_wer": TOLERANCE,
              "best_same_search": {k: best[k] for k in (*KNOBS, "median_wer")},
              "recipe_margin": round(best["median_wer"] - mine, 2),
              "passed": best["median_wer"] >= mine - TOLERANCE, "wall_s": round(time.time() - started, 1)}
    write_results(RESULTS / "lm-settings.json", result, plot)
    print(f"recipe {mine}; best of the same search {best['median_wer']} "
          f"({label(tuple(best[k] for k in KNOBS)).replace(chr(10), ', ')}); passed {result['passed']}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
