"""Benchmark: the open-vocabulary recipe end to end (issue 41).

`jobs/configs/openvocab.yaml` trained by 2 allreduce learners within a wall budget (30 minutes) on
an open-vocabulary corpus from `chorus synth --task openvocab --hours 20 --seed 0` (real English
sentences, some test words never in training text), its training audio streamed from shards
(`chorus shards`), with a word trigram model estimated from the training text (`chorus lm`). Each
run's final model is scored on `test` (seen voices), `test_unseen` (unseen espeak-ng voices) and
`test_unseen_engine` (a synthesizer never heard), greedily and with the language model: WER and
CER, and the test's out-of-vocabulary rate (words never in training text, which no lexicon
decoder can output). One run is one sample: `--repeats` runs (each on a fresh local Ray
instance), figures are medians with IQRs.

Targets: WER with the LM <= 25% on test and <= 40% on test-unseen-engine; the LM lowers test WER
by >= 20% relative to greedy decoding. Writes `bench/results/openvocab.json` and `openvocab.png`.

With `--shard-features` the training shards carry log-mels (`chorus shards --features`) and the
learners read them (`data.shard_features`), augmenting in the log-mel domain: no audio decoded and
no filterbanks computed in training.

With `--engines espeak,festival,flite` the corpus has CMU flite's clustergen voices in training as
well (`jobs/synth/corpus.py`; its own corpus folder, `-flite` in the results' names): whether a third
engine's voices in training bring the held-out engine nearer. With `--engines
espeak,festival,flite,world` (`-flite-world`), the WORLD vocoder's higher-pitched conversions of the
male Festival and flite voices too (`jobs/synth/voice_conversion.py`).

With `--set KEY=VALUE` (repeatable, as `chorus train --set`) the recipe is changed for an
experiment, named by `--name` (its runs' folders and results file carry the name); the recipe's
own figures are the runs without.

Each run records the commit it ran at; `--first-seed 1 --repeats 2 --keep-runs` adds seeds 1-2 to
an earlier file's seed 0 (refused unless the corpus is the same), the median then over all three.

Usage: .venv/bin/python bench/openvocab.py [--repeats 3] [--wall-seconds 1800] [--hours 20] [--shard-features]
       [--first-seed 0] [--keep-runs] [--engines auto|espeak,festival,flite[,world]] [--set KEY=VALUE --name NAME]
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
from harness.results import commit, write_results  # noqa: E402
from harness.stats import summary  # noqa: E402

from jobs.data.audio_shards import write_audio_shards  # noqa: E402
from jobs.ngram import write_lm  # noqa: E402
from jobs.synth.corpus import synthesize  # noqa: E402
from jobs.workload import AsrWorkload  # noqa: E402
from orchestrator.checkpoint.files import load  # noqa: E402
from orchestrator.driver.config import load_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "openvocab"
RECIPE = ROOT / "jobs" / "configs" / "openvocab.yaml"
SPLITS = ("test", "test_unseen", "test_unseen_engine")
DECODERS = ("greedy", "lm")
COMMIT = commit()  # each run records it
TARGETS = {"wer_test_lm": 25.0, "wer_test_unseen_engine_lm": 40.0, "lm_relative_gain_test": 0.20}


def prepare(hours: float, seed: int = 0, mel_bins: int | None = None, engines: str = "auto") -> Path:
    """The corpus, its training shards (with `mel_bins`: carrying log-mels, in `shards-features`)
    and its trigram model (each made once)."""
    corpus = WORK / f"corpus-{hours:g}h-{seed}{engines_tag(engines)}"
    if not (corpus / "corpus.json").is_file():
        synthesize(corpus, eval_utterances=400, seed=seed, task="openvocab", hours=hours, engines=engines)
    shards = corpus / ("shards-features" if mel_bins else "shards")
    if not (shards / "shards.json").is_file():
        write_audio_shards(corpus / "train.jsonl", shards, shard_mb=64, mel_bins=mel_bins)
    if not (corpus / "lm.arpa").is_file():
        write_lm(corpus / "train.jsonl", corpus / "lm.arpa", 3)
    return corpus


def engines_tag(engines: str) -> str:
    """The corpus's and results' names' mark of the engines beyond espeak-ng and Festival."""
    return "".join(f"-{engine}" for engine in ("flite", "world") if engine in engines.split(","))


def overrides(corpus: Path, wall_seconds: float, seed: int, shard_features: bool = False,
              changes: list[str] = ()) -> list[str]:
    data = {"train": corpus / ("shards-features" if shard_features else "shards"),
            **{s: corpus / f"{s.replace('_', '-')}.jsonl" for s in ("dev", *SPLITS)}, "shard_features": shard_features}
    return [*(f"data.{k}={v}" for k, v in data.items()), f"decoding.lm={corpus / 'lm.arpa'}",
            f"budget.wall_seconds={wall_seconds}", "budget.epochs=null", f"seed={seed}", *changes]


def scores(spec, run: Path) -> dict:
    """WER and CER on SPLITS of the run's final model, decoded each way of DECODERS."""
    state = load(run / "checkpoint.pt").state
    found = {}
    for kind in DECODERS:
        decoding = spec.workload_config.decoding.model_copy(update={"kind": kind, "warps": None})
        workload = AsrWorkload(spec.workload_config.model_copy(update={"decoding": decoding}), seed=spec.seed)
        model = workload.build_model()
        workload.load_state_dict(state, model)
        for split in SPLITS:
            result = workload.evaluate(model, split)
            found[f"wer_{split}_{kind}"] = round(result["wer"], 2)
            found[f"cer_{split}_{kind}"] = round(result["cer"], 2)
    found["lm_relative_gain_test"] = round(1 - found["wer_test_lm"] / found["wer_test_greedy"], 4)
    return found


def run_once(seed: int, corpus: Path, wall_seconds: float, runs: list, shard_features: bool = False,
             tag: str = "", changes: list[str] = ()) -> float:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = WORK / f"run{'-features' if shard_features else ''}{tag}-{seed}"
    try:
        spec = load_spec(RECIPE, overrides(corpus, wall_seconds, seed, shard_features, changes))
        outcome = TrainingJob(spec, out, overwrite=True).run()
    finally:
        ray.shutdown()
    run = {"seed": seed, "commit": COMMIT, **({"changes": list(changes)} if changes else {}),
           **{k: outcome[k] for k in ("epochs", "samples_per_s", "wall_s", "startup_s")},
           "skipped": outcome["skipped_utterances"], **scores(spec, out)}
    runs.append(run)
    print("[openvocab] " + json.dumps(run), flush=True)
    return run["wer_test_lm"]


def kept_runs(results: Path, corpus: Path, seeds: range) -> list[dict]:
    """The runs of other seeds in an earlier results file, each marked with the commit it names (or
    "earlier"); refused unless that file's corpus is the one made now (the same counts, hours and OOV)."""
    earlier = json.loads(results.read_text())
    if earlier["corpus"] != json.loads((corpus / "corpus.json").read_text()):
        raise SystemExit(f"{results}: its runs were of another corpus than {corpus}; not kept")
    return [{**r, "commit": r.get("commit", "earlier")} for r in earlier["runs"] if r["seed"] not in seeds]


def plot(result: dict, path: Path) -> None:
    """WER per split, greedy and with the LM (median, IQR whiskers); targets dotted."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    stats = result["figures"]
    for i, kind in enumerate(DECODERS):
        medians = [stats[f"wer_{s}_{kind}"]["median"] for s in SPLITS]
        low = [m - stats[f"wer_{s}_{kind}"]["iqr"][0] for m, s in zip(medians, SPLITS, strict=True)]
        high = [stats[f"wer_{s}_{kind}"]["iqr"][1] - m for m, s in zip(medians, SPLITS, strict=True)]
        xs = [x + (i - 0.5) * 0.38 for x in range(len(SPLITS))]
        ax.bar(xs, medians, 0.38, yerr=[low, high], capsize=3, color=f"C{i}", label=kind)
        for x, m in zip(xs, medians, strict=True):
            ax.text(x, m, f"{m:.1f}", ha="center", va="bottom", fontsize=8)
    for split, target in (("test", 25.0), ("test_unseen_engine", 40.0)):
        x = SPLITS.index(split)
        ax.hlines(target, x - 0.45, x + 0.45, color="red", ls=":", lw=1)
    ax.set_xticks(range(len(SPLITS)), ["test (seen voices)", "test-unseen (voices)", "test-unseen-engine"])
    ax.set_ylabel("WER (%), median and IQR")
    features = (", shard features" if result.get("shard_features") else "") + (
        ", " + "+".join(result["corpus"]["engines"]) if "flite" in result["corpus"]["engines"] else "") + "".join(
        f", {change}" for change in result.get("changes", []))
    ax.set_title(f"openvocab.yaml{features}, 2 learners, {result['wall_seconds']:g} s, {result['repeats']} runs; "
                 f"{result['corpus']['splits']['train']['hours']:.1f} h; test OOV "
                 f"{100 * result['corpus']['oov_rate_test']:.1f}%", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wall-seconds", type=float, default=1800.0)
    parser.add_argument("--hours", type=float, default=20.0)
    parser.add_argument("--first-seed", type=int, default=0, help="the runs' seeds: first-seed, first-seed + 1, ...")
    parser.add_argument("--keep-runs", action="store_true",
                        help="keep the runs of other seeds in the results file (the corpus must be the same) and "
                             "take the median over all of them")
    parser.add_argument("--shard-features", action="store_true",
                        help="train on shards carrying log-mels (data.shard_features), augmented in that domain; "
                             "writes openvocab-shard-features.json")
    parser.add_argument("--engines", choices=["auto", "espeak,festival,flite", "espeak,festival,flite,world"],
                        default="auto",
                        help="the corpus's engines (chorus synth --engines); flite's go in a corpus of their own")
    parser.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE",
                        help="an experiment: change the recipe so (repeatable); needs --name")
    parser.add_argument("--name", default="", help="the experiment's name, in its runs' and results' names")
    args = parser.parse_args()
    if bool(args.changes) != bool(args.name):
        parser.error("--set and --name go together: an experiment's results are kept apart from the recipe's")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # throwaway local instances
    started = time.time()
    mel_bins = load_spec(RECIPE, [], check_paths=False).workload_config.features.num_mel_bins
    corpus = prepare(args.hours, mel_bins=mel_bins if args.shard_features else None, engines=args.engines)
    tag = engines_tag(args.engines) + (f"-{args.name}" if args.name else "")
    out = RESULTS / f"openvocab{'-shard-features' if args.shard_features else ''}{tag}.json"
    seeds = range(args.first_seed, args.first_seed + args.repeats)
    runs = kept_runs(out, corpus, seeds) if args.keep_runs else []
    for seed in seeds:  # one recipe: nothing to interleave with
        run_once(seed, corpus, args.wall_seconds, runs, args.shard_features, tag, args.changes)
    runs.sort(key=lambda r: r["seed"])
    figures = {key: summary([r[key] for r in runs], 4) for key in runs[0]
               if isinstance(runs[0][key], (int, float)) and key != "seed"}
    checks = {"wer_test_lm": figures["wer_test_lm"]["median"] <= TARGETS["wer_test_lm"],
              "wer_test_unseen_engine_lm": figures["wer_test_unseen_engine_lm"]["median"]
              <= TARGETS["wer_test_unseen_engine_lm"],
              "lm_relative_gain_test": figures["lm_relative_gain_test"]["median"] >= TARGETS["lm_relative_gain_test"]}
    result = {"benchmark": "openvocab", "learners": 2, "group": "allreduce", "wall_seconds": args.wall_seconds,
              "shard_features": args.shard_features, "changes": args.changes,
              "repeats": len(runs), "corpus": json.loads((corpus / "corpus.json").read_text()),
              "figures": figures, "runs": runs, "targets": TARGETS, "checks": checks,
              "wall_s": round(time.time() - started, 1), "passed": all(checks.values())}
    write_results(out, result, plot)
    print(json.dumps({k: v["median"] for k, v in figures.items()}), "passed", result["passed"])
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
