"""Benchmark: how far each recipe generalizes beyond the voices it heard (issue 20).

Two recipes, `jobs/configs/tiny.yaml` (BiLSTM, characters, no augmentation, greedy decoding) and
`jobs/configs/conformer.yaml` (Conformer, BPE, speed/noise/reverberation/VTLP, lexicon decoding),
each trained by 2 gossip learners within the same wall budget (6 minutes, as `make demo`) on the
same corpus from `chorus synth` with Festival (`--utterances 2000 --seed 0`: espeak-ng and
Festival's diphone voices in training, Festival's HTS voice only in `test-unseen-engine`).
Reported per recipe: WER on `test` (seen voices), `test-unseen` (unseen espeak-ng voices) and
`test-unseen-engine` (a synthesizer never heard), the epochs reached within the budget (so a slow
day shows as such) and samples/s.
Each run's final (averaged) model is also scored with both decoders, greedy and the lexicon beam
search (`decoding.kind`), in one unwarped pass, and, where the recipe averages test-time warps
(`decoding.warps`), its own decoder with them (variant `<kind>_tta`), so what the decoder and the
warps do is told apart from what the model learnt.
The recipes run interleaved, `--repeats` times each (one run is one sample: the figures are
medians with IQRs), each on a fresh local Ray instance.

Targets: `test` <= 5% and `test-unseen-engine` <= 20% for the better recipe (lower unseen-engine
WER). Writes `bench/results/generalization.json` and `generalization.png`.

Usage: .venv/bin/python bench/generalization.py [--repeats 5] [--wall-seconds 345]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from harness.results import write_results  # noqa: E402
from harness.stats import interleaved, summary  # noqa: E402

from jobs.sections import DecodingConfig  # noqa: E402
from jobs.synth.corpus import data_overrides, synthesize  # noqa: E402
from jobs.workload import AsrWorkload  # noqa: E402
from orchestrator.checkpoint.files import load  # noqa: E402
from orchestrator.driver.config import JobSpec, load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "generalization"
RECIPES = {"tiny": ROOT / "jobs" / "configs" / "tiny.yaml", "conformer": ROOT / "jobs" / "configs" / "conformer.yaml"}
SPLITS = ("test", "test_unseen", "test_unseen_engine")
TARGETS = {"test": 5.0, "test_unseen_engine": 20.0}
DECODERS = ("greedy", "lexicon")


def decoding_variants(spec: JobSpec) -> dict[str, DecodingConfig]:
    """Each of DECODERS in one unwarped pass, and the recipe's own decoder with its test-time warps
    (`<kind>_tta`) if it has any."""
    own = spec.workload_config.decoding
    variants = {kind: DecodingConfig(**{**own.model_dump(), "kind": kind, "warps": None}) for kind in DECODERS}
    return {**variants, **({f"{own.kind}_tta": own} if own.warps else {})}


def own_variant(spec: JobSpec) -> str:
    own = spec.workload_config.decoding
    return f"{own.kind}_tta" if own.warps else own.kind


def wer_by_decoder(spec: JobSpec, run: Path) -> dict:
    """WER on SPLITS of the run's newest checkpoint's averaged model, decoded each way of `decoding_variants`."""
    state = load(run / "checkpoint.pt").state
    wers = {}
    for variant, decoding in decoding_variants(spec).items():
        workload = AsrWorkload(spec.workload_config.model_copy(update={"decoding": decoding}), seed=spec.seed)
        model = workload.build_model()
        workload.load_state_dict(state, model)
        wers.update({f"wer_{s}_{variant}": round(workload.evaluate(model, s)["wer"], 2) for s in SPLITS})
    return wers


def run_recipe(name: str, corpus: Path, wall_seconds: float, details: dict) -> float:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = load_spec(RECIPES[name], [*data_overrides(corpus), f"budget.wall_seconds={wall_seconds}",
                                         "budget.epochs=null", "learners=2", "group.kind=gossip", f"name={name}"])
        summary_ = TrainingJob(spec, WORK / name, overwrite=True).run()
    finally:
        ray.shutdown()
    run = {**{f"wer_{s}": summary_.get(f"wer_{s}") for s in SPLITS},
           **{k: summary_[k] for k in ("epochs", "samples_per_s", "wall_s")},
           "decoding": own_variant(spec), "variants": list(decoding_variants(spec)),
           **wer_by_decoder(spec, WORK / name)}
    # the job's own final scores are its checkpoint's, decoded its way
    run["rescored_as_the_job"] = all(run[f"wer_{s}_{run['decoding']}"] == round(run[f"wer_{s}"], 2) for s in SPLITS)
    details.setdefault(name, []).append(run)
    print(f"[{name}] " + json.dumps(run), flush=True)
    return run["wer_test_unseen_engine"] if run["wer_test_unseen_engine"] is not None else float("inf")


def plot(result: dict, path: Path) -> None:
    """Per split, a bar for each recipe and decoding variant (median, IQR whiskers); the recipe's own
    decoding solid, the others hatched."""
    fig, ax = plt.subplots(figsize=(10, 4.8))
    bars = [(name, kind) for name in RECIPES for kind in result["recipes"][name]["variants"]]
    width = 0.8 / len(bars)
    for i, (name, kind) in enumerate(bars):
        stats = result["recipes"][name]
        own = stats["decoding"] == kind
        medians = [stats[f"wer_{s}_{kind}"]["median"] for s in SPLITS]
        low = [m - stats[f"wer_{s}_{kind}"]["iqr"][0] for m, s in zip(medians, SPLITS, strict=True)]
        high = [stats[f"wer_{s}_{kind}"]["iqr"][1] - m for m, s in zip(medians, SPLITS, strict=True)]
        xs = [x + (i - (len(bars) - 1) / 2) * width for x in range(len(SPLITS))]
        ax.bar(xs, medians, width, yerr=[low, high], capsize=3, color=f"C{list(RECIPES).index(name)}",
               hatch=None if own else "//", alpha=1.0 if own else 0.55,
               label=f"{name}, {kind}{' (its own)' if own else ''} ({stats['epochs']['median']:g} epochs)")
        for x, m in zip(xs, medians, strict=True):
            ax.text(x, m, f"{m:.1f}", ha="center", va="bottom", fontsize=7)
    for s, target in TARGETS.items():
        x = SPLITS.index(s)
        ax.hlines(target, x - 0.45, x + 0.45, color="red", ls=":", lw=1)
    ax.set_xticks(range(len(SPLITS)), ["test (seen voices)", "test-unseen (voices)", "test-unseen-engine"])
    ax.set_ylabel("WER (%), median and IQR")
    ax.set_title(f"2 gossip learners, {result['wall_seconds']:g} s each, {result['repeats']} repeats; "
                 "targets dotted", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wall-seconds", type=float, default=345.0)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # throwaway local instances
    corpus = WORK / "corpus-2000-0"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, utterances=2000, seed=0, progress=False, engines="espeak,festival")
    details: dict[str, list[dict]] = {}
    started = time.time()
    interleaved({name: (lambda _r, name=name: run_recipe(name, corpus, args.wall_seconds, details))
                 for name in RECIPES}, repeats=args.repeats)
    recipes = {name: {key: summary([r[key] for r in runs], 2) for key in runs[0]
                      if isinstance(runs[0][key], (int, float)) and not isinstance(runs[0][key], bool)}
               for name, runs in details.items()}
    for name, runs in details.items():
        recipes[name]["decoding"], recipes[name]["variants"] = runs[0]["decoding"], runs[0]["variants"]
        recipes[name]["rescored_as_the_job"] = all(r["rescored_as_the_job"] for r in runs)
    best = min(RECIPES, key=lambda n: recipes[n]["wer_test_unseen_engine"]["median"])
    result = {"benchmark": "generalization", "learners": 2, "group": "gossip", "wall_seconds": args.wall_seconds,
              "repeats": args.repeats, "corpus": json.loads((corpus / "corpus.json").read_text()),
              "recipes": recipes, "runs": details, "best": best, "targets": TARGETS,
              "wall_s": round(time.time() - started, 1),
              "passed": all(recipes[best][f"wer_{s}"]["median"] <= t for s, t in TARGETS.items())}
    write_results(RESULTS / "generalization.json", result, plot)
    print(json.dumps({n: {k: v["median"] if isinstance(v, dict) else v for k, v in r.items()}
                      for n, r in recipes.items()}), "best", best,
          "passed", result["passed"])
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
