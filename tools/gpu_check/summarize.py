"""summary.txt from the run's logs: one line per step (name, rc, seconds, key figures), then the
GPU/CPU samples-per-second ratio. Usage: python summarize.py LOGS_DIR T0"""

from __future__ import annotations

import csv
import json
import re
import sys
from datetime import datetime
from pathlib import Path

LOGS = Path(sys.argv[1])
TRAIN_KEYS = ["samples_per_s", "epochs", "steps", "train_wall_s", "startup_s", "wall_s", "wer_dev", "wer_test",
              "wer_test_unseen", "first_train_loss", "final_train_loss", "learners", "group", "events"]


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def gpu_samples() -> list[tuple[float, float, float]]:
    """(epoch seconds, GPU util %, memory used MiB) from gpu_util.csv."""
    rows = []
    for row in csv.reader(read(LOGS / "gpu_util.csv").splitlines()):
        try:
            t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(row[1].split()[0]), float(row[3].split()[0])))
        except (ValueError, IndexError):
            continue
    return rows


def gpu_procs(start: float, end: float) -> set[str]:
    """Process titles seen on the GPU between start and end (gpu_procs.log)."""
    seen, now = set(), 0.0
    for line in read(LOGS / "gpu_procs.log").splitlines():
        if line.startswith("--- "):
            now = float(line.split()[1])
        elif start <= now <= end and line.count(",") >= 2:
            title = line.split(",", 2)[2].strip()
            seen.add(re.sub(r"\s+--.*", "", title)[:60] or line.split(",")[0])
    return seen


def train_figures(name: str, start: float, end: float, samples) -> str:
    console = read(LOGS / f"{name}.log")
    try:
        summary = json.loads(read(LOGS / name / "summary.json"))
    except ValueError:
        summary = last_json(console) or {}
    first = console.splitlines()[0] if console else ""
    path = ("ray actor (--address)" if "Ray dashboard" in console or "--address" in first else "in-process")
    bits = [f"path={path}"]
    bits += [f"{k}={json.dumps(summary[k]) if isinstance(summary[k], dict) else summary[k]}"
             for k in TRAIN_KEYS if k in summary and summary[k] is not None]
    nodes = [f"{n.get('address')}:gpus={n.get('gpus')}:learners={n.get('learners')}"
             f":gpus_per_learner={n.get('gpus_per_learner')}" for n in summary.get("nodes") or []]
    if nodes:
        bits.append("nodes=" + ",".join(nodes))
    if not summary:
        tail = [line for line in console.splitlines() if line.strip()][-2:]
        bits.append("NO summary.json; last lines: " + " | ".join(tail)[-300:])
    during = [s for s in samples if start <= s[0] <= end]
    if during:
        busy = [u for _, u, _ in during]
        bits.append(f"gpu_util_mean={sum(busy) / len(busy):.0f}% gpu_util_max={max(busy):.0f}% "
                    f"gpu_mem_max_mib={max(m for _, _, m in during):.0f}")
    procs = gpu_procs(start, end)
    if procs:
        bits.append("gpu_processes=" + "; ".join(sorted(procs)))
    evals = [json.loads(x) for x in read(LOGS / name / "evals.jsonl").splitlines() if x.strip()]
    if evals:
        bits.append(f"evals={len(evals)}")
    return " ".join(bits), summary


def main() -> None:
    rows = list(csv.DictReader(read(LOGS / "steps.tsv").splitlines(), delimiter="\t"))
    samples = gpu_samples()
    out, rates = [], {}
    for row in rows:
        name, rc = row["step"], row["rc"]
        try:
            start, end = float(row["start"]), float(row["end"])
        except (TypeError, ValueError):
            start = end = 0.0
        figures = row.get("note") or ""
        text = read(LOGS / f"{name}.log")
        if name == "a_env":
            starts = ("python=", "torch=", "gpu=", "ray=", "pydantic=", "stripped", "chorus imports", "ray.train")
            keep = [line for line in text.splitlines() if line.startswith(starts) or "IMPORT FAILED" in line]
            figures += " " + " | ".join(keep)
        elif name == "b_synth":
            summary = last_json(text)
            if summary:
                splits = {k: v.get("utterances") for k, v in summary.get("splits", {}).items()}
                hours = round(sum(v.get("hours", 0) for v in summary.get("splits", {}).values()), 3)
                figures += f" splits={json.dumps(splits)} hours={hours} engines={summary.get('engines')}"
        elif name == "i_lstm_probe":
            result = last_json(text)
            if result:
                runs = result.get("runs", {})
                figures += (f" passed={result.get('passed')} cuda_matches_cpu={result.get('cuda_matches_cpu')} "
                            f"cudnn={result.get('cudnn')} "
                            + " ".join(f"{k}_ms={v.get('ms_per_step')}" for k, v in runs.items())
                            + " warnings="
                            + json.dumps(sorted({w for v in runs.values() for w in v.get("warnings", [])}))[:600])
        elif rc == "skip":
            pass
        elif name.startswith(("d_", "e_", "f_", "h_", "j_", "k_")):
            text_figures, summary = train_figures(name, start, end, samples)
            figures += " " + text_figures
            if "samples_per_s" in summary:
                rates[name] = summary["samples_per_s"]
        elif name == "g_bench_gpu":
            result = read(LOGS / "gpu.json")
            if result:
                data = json.loads(result)
                steps = data.get("steps", {})
                figures += " " + " ".join(f"{k}_s_per_step={v.get('median')}" for k, v in
                                          steps.get("seconds_per_step", {}).items())
                figures += f" bf16_speedup={json.dumps(steps.get('bf16_speedup'))} passed={data.get('passed')}"
            else:
                figures += " " + " | ".join(text.strip().splitlines()[-2:])[-300:]
        elif name.startswith("ray_head"):
            address = re.findall(r"^127\.0\.0\.1:\d+$", text, re.M)
            figures += f" address={address[-1] if address else 'NONE'}"
        seconds = end - start
        out.append(f"{name}\trc={rc}\t{seconds:.1f}s\t{figures.strip()}")
    if "d_tiny_gpu" in rates and "f_tiny_cpu" in rates and rates["f_tiny_cpu"]:
        out.append(f"ratio\ttiny samples/s GPU (d) / CPU (f) = {rates['d_tiny_gpu']} / {rates['f_tiny_cpu']} = "
                   f"{rates['d_tiny_gpu'] / rates['f_tiny_cpu']:.2f}")
    warnings = read(LOGS / "warnings_and_errors.txt").splitlines()
    out.append(f"warnings_and_errors.txt: {len(warnings)} distinct lines; top: "
               + " || ".join(w.strip()[:160] for w in warnings[:5]))
    print("\n".join(out))


if __name__ == "__main__":
    main()
