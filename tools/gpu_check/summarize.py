"""The GPU check's summary: a line per step, written to $OUT/summary.txt as each step ends (a run cut
off by its time limit still returns the lines of the steps it finished), and at the end the whole
summary again: the headline first (conformer_gpu.yaml's learner row of bench/gpu.py), every step, the
GPU/CPU ratio, the warnings.

A line is tab-separated, its figures one JSON object (`parse_line` reads it back):
    STEP   rc=RC   SECONDSs   {"figure": value, ...}      a step (RC: its exit status, or skip)
    NAME   {"figure": value, ...}                         headline, ratio, warnings, total_s

Usage: python summarize.py OUT                # the whole summary (OUT/logs holds the logs)
       python summarize.py OUT --step NAME    # step NAME's line (its last row in logs/steps.tsv)
       python summarize.py OUT --headline     # the headline line alone
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from datetime import datetime
from pathlib import Path

TRAIN_KEYS = ["samples_per_s", "epochs", "steps", "train_wall_s", "startup_s", "wall_s", "wer_dev", "wer_test",
              "wer_test_unseen", "first_train_loss", "final_train_loss", "learners", "group", "events"]
BENCH_RESULTS = {"g1_conformer_gpu": "gpu_conformer_gpu.json", "g2_bench_gpu": "gpu.json"}  # in OUT


def parse_line(line: str) -> dict:
    """A summary line as a dict: {"step", "rc", "seconds", "figures"} for a step, {"line", "figures"}
    for the others; ValueError for anything else."""
    fields = line.rstrip("\n").split("\t")
    if len(fields) == 4 and fields[1].startswith("rc=") and fields[2].endswith("s"):
        parsed = {"step": fields[0], "rc": fields[1][3:], "seconds": float(fields[2][:-1])}
    elif len(fields) == 2:
        parsed = {"line": fields[0]}
    else:
        raise ValueError(f"not a summary line ({len(fields)} tab-separated fields): {line[:120]!r}")
    parsed["figures"] = json.loads(fields[-1])
    if not isinstance(parsed["figures"], dict):
        raise ValueError(f"a summary line's figures are not a JSON object: {line[:120]!r}")
    return parsed


def line(name: str, figures: dict, rc: str | None = None, seconds: float | None = None) -> str:
    text = json.dumps(figures, default=str)
    return f"{name}\t{text}" if rc is None else f"{name}\trc={rc}\t{seconds:.1f}s\t{text}"


class Logs:
    """What the run left in OUT (its logs in OUT/logs), read for the summary."""

    def __init__(self, out: Path):
        self.out, self.logs = out, out / "logs"

    def read(self, name: str) -> str:
        try:
            return (self.logs / name).read_text(errors="replace")
        except OSError:
            return ""

    def steps(self) -> list[dict]:
        return list(csv.DictReader(self.read("steps.tsv").splitlines(), delimiter="\t"))

    def bench(self, step: str) -> dict | None:
        """The bench/gpu.py result a g step wrote (None before it wrote one)."""
        try:
            return json.loads((self.out / BENCH_RESULTS[step]).read_text())
        except (OSError, ValueError):
            return None

    def gpu_samples(self) -> list[tuple[float, float, float]]:
        """(epoch seconds, GPU util %, memory used MiB) from gpu_util.csv."""
        rows = []
        for row in csv.reader(self.read("gpu_util.csv").splitlines()):
            try:
                t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, float(row[1].split()[0]), float(row[3].split()[0])))
            except (ValueError, IndexError):
                continue
        return rows

    def gpu_procs(self, start: float, end: float) -> list[str]:
        """Process titles seen on the GPU between start and end (gpu_procs.log)."""
        seen, now = set(), 0.0
        for text in self.read("gpu_procs.log").splitlines():
            if text.startswith("--- "):
                now = float(text.split()[1])
            elif start <= now <= end and text.count(",") >= 2:
                title = text.split(",", 2)[2].strip()
                seen.add(re.sub(r"\s+--.*", "", title)[:60] or text.split(",")[0])
        return sorted(seen)


def last_json(text: str) -> dict | None:
    for text_line in reversed(text.splitlines()):
        text_line = text_line.strip()
        if text_line.startswith("{") and text_line.endswith("}"):
            try:
                return json.loads(text_line)
            except ValueError:
                continue
    return None


def tail(text: str, n: int = 2) -> str:
    return " | ".join([x for x in text.splitlines() if x.strip()][-n:])[-300:]


def train_figures(logs: Logs, name: str, start: float, end: float) -> dict:
    console = logs.read(f"{name}.log")
    try:
        summary = json.loads(logs.read(f"{name}/summary.json"))
    except ValueError:
        summary = last_json(console) or {}
    first = console.splitlines()[0] if console else ""
    figures = {"path": "ray actor (--address)" if "--address" in first else "in-process"}
    figures |= {k: summary[k] for k in TRAIN_KEYS if summary.get(k) is not None}
    nodes = [{k: n.get(k) for k in ("address", "gpus", "learners", "gpus_per_learner")}
             for n in summary.get("nodes") or []]
    if nodes:
        figures["nodes"] = nodes
    if not summary:
        figures["missing"] = "no summary.json; last lines: " + tail(console)
    during = [s for s in logs.gpu_samples() if start <= s[0] <= end]
    if during:
        busy = [u for _, u, _ in during]
        figures |= {"gpu_util_mean": round(sum(busy) / len(busy)), "gpu_util_max": max(busy),
                    "gpu_mem_max_mib": max(m for _, _, m in during)}
    procs = logs.gpu_procs(start, end)
    if procs:
        figures["gpu_processes"] = procs
    evals = [x for x in logs.read(f"{name}/evals.jsonl").splitlines() if x.strip()]
    if evals:
        figures["evals"] = len(evals)
    return figures


def _median(stats: dict | None, key: str):
    row = (stats or {}).get(key) or {}
    return row.get("median") if row.get("iqr") is None else [row.get("median"), row.get("iqr")]


def recipe_figures(row: dict) -> dict:
    """One recipe of bench/gpu.py's learners part: medians [IQR] of its contenders."""
    baseline = row.get("baseline")
    return {"chorus_1_samples_per_s": _median(row.get("samples_per_s"), "chorus_1"),
            "chorus_2_sharing_samples_per_s": _median(row.get("samples_per_s"), "chorus_2_sharing"),
            f"{baseline}_samples_per_s": _median(row.get("samples_per_s"), baseline),
            "chorus_1_gpu_busy_pct": _median(row.get("gpu_busy_mean"), "chorus_1"),
            "chorus_1_data_wait_s_per_step": _median(row.get("data_wait_s_per_step"), "chorus_1"),
            f"{baseline}_data_wait_s_per_step": _median(row.get("data_wait_s_per_step"), baseline),
            "chorus_over_baseline": row.get("chorus_over_baseline"),
            "two_sharing_over_one": row.get("two_sharing_over_one"), "parameters": row.get("parameters")}


def bench_figures(result: dict) -> dict:
    learners = result.get("learners") or {}
    figures = {"complete": result.get("complete"), "passed": result.get("passed"), "device": result.get("device_name"),
               "failed_checks": sorted(k for k, ok in (result.get("checks") or {}).items() if ok is False),
               "not_measured": sorted(k for k, ok in (result.get("checks") or {}).items() if ok is None),
               "baseline": learners.get("baseline"),
               **{recipe: recipe_figures(row) for recipe, row in learners.get("recipes", {}).items()}}
    steps = result.get("steps") or {}
    if steps:
        figures["s_per_step"] = {k: v.get("median") for k, v in steps.get("seconds_per_step", {}).items()}
        figures["bf16_speedup"] = steps.get("bf16_speedup")
        figures["cudnn_compaction_warning"] = steps.get("cudnn_compaction_warning")
    return figures


def step_figures(logs: Logs, row: dict) -> dict:
    name, note = row["step"], row.get("note") or ""
    start, end = _seconds(row.get("start")), _seconds(row.get("end"))
    text = logs.read(f"{name}.log")
    figures = {"note": note} if note else {}
    if row["rc"] == "skip":
        return figures
    if name == "a_env":
        starts = ("python=", "torch=", "gpu=", "ray=", "pydantic=", "stripped", "chorus imports", "ray.train")
        figures["env"] = [x for x in text.splitlines() if x.startswith(starts) or "IMPORT FAILED" in x]
    elif name == "b_synth" and (summary := last_json(text)):
        splits = summary.get("splits", {})
        figures |= {"splits": {k: v.get("utterances") for k, v in splits.items()}, "engines": summary.get("engines"),
                    "hours": round(sum(v.get("hours", 0) for v in splits.values()), 3)}
    elif name == "i_lstm_probe" and (result := last_json(text)):
        runs = result.get("runs", {})
        figures |= {k: result.get(k) for k in ("passed", "cuda_matches_cpu", "cudnn")}
        figures |= {f"{k}_ms_per_step": v.get("ms_per_step") for k, v in runs.items()}
        figures["warnings"] = sorted({w for v in runs.values() for w in v.get("warnings", [])})
    elif name in BENCH_RESULTS:
        result = logs.bench(name)
        figures |= bench_figures(result) if result else {"missing": "no result written; last lines: " + tail(text)}
    elif name.startswith(("d_", "e_", "f_", "h_")):
        figures |= train_figures(logs, name, start, end)
    elif name.startswith("ray_head"):
        address = re.findall(r"^127\.0\.0\.1:\d+$", text, re.M)
        figures["address"] = address[-1] if address else None
    elif row["rc"] != "0":
        figures["last_lines"] = tail(text)
    return figures


def _seconds(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def step_line(logs: Logs, row: dict) -> str:
    seconds = _seconds(row.get("end")) - _seconds(row.get("start"))
    return line(row["step"], step_figures(logs, row), rc=row["rc"], seconds=seconds)


def headline(logs: Logs) -> str:
    """conformer_gpu.yaml's learner row: what the GPU check is for, first."""
    for step in ("g2_bench_gpu", "g1_conformer_gpu"):
        result = logs.bench(step)
        row = ((result or {}).get("learners") or {}).get("recipes", {}).get("conformer_gpu")
        if row:
            return line("headline", {"conformer_gpu": recipe_figures(row), "from": BENCH_RESULTS[step],
                                     "passed": result.get("passed"), "complete": result.get("complete")})
    return line("headline", {"missing": "no bench/gpu.py result holds conformer_gpu.yaml's row"})


def whole(logs: Logs) -> list[str]:
    rows = logs.steps()
    out = [headline(logs)] + [step_line(logs, row) for row in rows]
    rates = {}
    for row in rows:
        if row["step"] in ("d_tiny_gpu", "f_tiny_cpu"):
            rates[row["step"]] = train_figures(logs, row["step"], 0, 0).get("samples_per_s")
    if rates.get("d_tiny_gpu") and rates.get("f_tiny_cpu"):
        out.append(line("ratio", {"tiny_samples_per_s_gpu_d": rates["d_tiny_gpu"],
                                  "tiny_samples_per_s_cpu_f": rates["f_tiny_cpu"],
                                  "gpu_over_cpu": round(rates["d_tiny_gpu"] / rates["f_tiny_cpu"], 2)}))
    warnings = logs.read("warnings_and_errors.txt").splitlines()
    out.append(line("warnings", {"distinct_lines": len(warnings), "top": [w.strip()[:160] for w in warnings[:5]]}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--step", help="this step's line only")
    parser.add_argument("--headline", action="store_true", help="the headline line only")
    args = parser.parse_args()
    logs = Logs(args.out)
    if args.headline:
        print(headline(logs))
    elif args.step:
        rows = [row for row in logs.steps() if row["step"] == args.step]
        if not rows:
            raise SystemExit(f"summarize.py: no step {args.step!r} in {logs.logs / 'steps.tsv'}")
        print(step_line(logs, rows[-1]))
    else:
        print("\n".join(whole(logs)))


if __name__ == "__main__":
    main()
