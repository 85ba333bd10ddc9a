"""The GPU check (`make gpu-check`, tools/gpu_check): its summary lines parse, and its dry run
(`make gpu-check-dry`: every step on the CPU) runs each step, with tiny budgets, to a summary line
written as the step ends, bench/gpu.py's conformer_gpu.yaml row first and its DataLoader baseline
named, leaving no process behind."""

import csv
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "tools" / "gpu_check"
STEPS = ["install", "a_sys", "a_env", "b_synth", "c_monitors", "g1_conformer_gpu", "i_lstm_probe", "g2_bench_gpu",
         "ray_head_gpu", "d_tiny_gpu", "h_gossip2_shared_gpu", "ray_head_cpu", "f_tiny_cpu"]


def _summarize_module():
    spec = importlib.util.spec_from_file_location("gpu_check_summarize", KIT / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def summarize():
    return _summarize_module()


@pytest.mark.unit
def test_a_summary_line_parses_back_and_anything_else_is_refused(summarize):
    step = summarize.line("g1_conformer_gpu", {"passed": False, "note": "a\ttab"}, rc="1", seconds=12.34)
    assert summarize.parse_line(step) == {"step": "g1_conformer_gpu", "rc": "1", "seconds": 12.3,
                                          "figures": {"passed": False, "note": "a\ttab"}}
    assert summarize.parse_line(summarize.line("total_s", {"seconds": 3})) == {"line": "total_s",
                                                                               "figures": {"seconds": 3}}
    for bad in ("g1\trc=0\t1.0s", "total_s 113", "total_s\t[1, 2]", "a_env\trc=0\t1.0s\tpython=3.12"):
        with pytest.raises(ValueError):
            summarize.parse_line(bad)


@pytest.mark.unit
def test_the_headline_is_conformer_gpus_row_and_a_cut_off_step_still_has_a_line(summarize, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = [["step", "rc", "start", "end", "note"], ["g1_conformer_gpu", "0", "10.0", "95.5", "conformer_gpu.yaml"],
            ["g2_bench_gpu", "124", "96.0", "336.0", ""], ["d_tiny_gpu", "skip", "336.0", "336.0", "no time left"]]
    (logs / "steps.tsv").write_text("\n".join("\t".join(r) for r in rows) + "\n")
    (logs / "g2_bench_gpu.log").write_text("=== g2\nrepeat 1/5: chorus_1 12000\n")
    row = {"samples_per_s": {"chorus_1": {"median": 5200.0, "iqr": [5100.0, 5300.0]},
                             "torch_dataloader": {"median": 900.0, "iqr": [880.0, 950.0]}},
           "gpu_busy_mean": {"chorus_1": {"median": 81.0, "iqr": [79.0, 83.0]}}, "baseline": "torch_dataloader",
           "chorus_over_baseline": {"ratio": 5.78, "verdict": "higher"}}
    (tmp_path / "gpu_conformer_gpu.json").write_text(json.dumps(
        {"complete": True, "passed": False, "checks": {"conformer_gpu_chorus_1_gpu_at_least_70_percent_busy": False,
                                                       "tiny_chorus_1_at_least_10000_samples_per_s": None},
         "learners": {"baseline": {"name": "torch_dataloader", "why": "test"}, "recipes": {"conformer_gpu": row}}}))
    lines = [summarize.parse_line(x) for x in summarize.whole(summarize.Logs(tmp_path))]
    headline = lines[0]["figures"]["conformer_gpu"]
    assert headline["chorus_1_samples_per_s"] == [5200.0, [5100.0, 5300.0]]
    assert headline["chorus_1_gpu_busy_pct"] == [81.0, [79.0, 83.0]]
    assert headline["torch_dataloader_samples_per_s"] == [900.0, [880.0, 950.0]]
    steps = {x["step"]: x for x in lines if "step" in x}
    assert list(steps) == ["g1_conformer_gpu", "g2_bench_gpu", "d_tiny_gpu"]
    assert steps["g1_conformer_gpu"]["seconds"] == 85.5
    g1 = steps["g1_conformer_gpu"]["figures"]
    assert g1["failed_checks"] == ["conformer_gpu_chorus_1_gpu_at_least_70_percent_busy"]
    assert g1["not_measured"] == ["tiny_chorus_1_at_least_10000_samples_per_s"]
    assert "repeat 1/5" in steps["g2_bench_gpu"]["figures"]["missing"]  # cut off before its JSON: its log's tail
    assert steps["d_tiny_gpu"]["rc"] == "skip"


def _processes_of(work: Path) -> list[str]:
    """Processes the run started and left: its scratch folder in their command line (Ray's heads) or
    their environment (everything run.sh starts has RAY_TMPDIR=<scratch>; Ray's workers rename
    themselves `ray::...`, and their forked data workers inherit that)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(work) in args or f"RAY_TMPDIR={work}".encode() in environ:
            found.append(f"{proc.name}: {args[:160]}")
    return found


@pytest.mark.slow
def test_the_dry_run_gives_every_step_a_summary_line_as_it_ends(summarize, tmp_path):
    out, work = tmp_path / "out", Path(f"/tmp/ckt{os.getpid()}")  # short: Ray's socket paths live under it
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "OUT": str(out), "WORK_DIR": str(work),
           "SYNTH_UTT": "60", "D_WALL": "10", "F_WALL": "10", "H_WALL": "10", "G_REPEATS": "5", "G_WINDOW": "0.5",
           "G2_WINDOW": "0.5", "G_BASELINE": "torch", "TOTAL_S": "1200",
           "TRAIN_OVERHEAD": "120"}  # a job's start and final evaluations on 2 cores shared with another test
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(["bash", str(KIT / "run.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # as each step ended, its line (and, after g1, the headline) was printed, before the next step started
    said = [x for x in proc.stdout.splitlines() if "] summary: " in x or ": start (timeout" in x]
    names = [summarize.parse_line(x.split("] summary: ", 1)[1]).get("step", "headline") if "] summary: " in x
             else "start " + x.split("] ", 1)[1].split(":")[0] for x in said]
    assert [n for n in names if not n.startswith("start ")] == [*STEPS[:6], "headline", *STEPS[6:]]
    assert names.index("g1_conformer_gpu") < names.index("headline") < names.index("start i_lstm_probe")
    lines = [summarize.parse_line(x) for x in (out / "summary.txt").read_text().splitlines()]
    assert lines[0]["line"] == "headline"
    headline = lines[0]["figures"]["conformer_gpu"]
    assert headline["chorus_1_samples_per_s"][0] > 0 and headline["torch_dataloader_samples_per_s"][0] > 0
    steps = {x["step"]: x for x in lines if "step" in x}
    with tarfile.open(out / "gpu_logs.tar.gz") as tar:
        tsv = tar.extractfile("logs/steps.tsv").read().decode()
    assert [r["step"] for r in csv.DictReader(tsv.splitlines(), delimiter="\t")] == STEPS == list(steps)
    for name, step in steps.items():
        if name.startswith("g"):  # bench/gpu.py exits 1 when a check fails, as every GPU target does on a CPU
            assert step["rc"] in ("0", "1") and step["figures"]["complete"] is True, step
        else:
            assert step["rc"] == "0", step
    result = json.loads((out / "gpu.json").read_text())
    assert result["learners"]["baseline"]["name"] == "torch_dataloader"
    assert set(result["learners"]["recipes"]) == {"conformer_gpu", "tiny", "conformer"}  # g1's row merged in
    assert result["merged_from"]["recipes"] == ["conformer_gpu"]
    assert all(r["baseline"] == "torch_dataloader" and len(r["samples_per_s"]["torch_dataloader"]["runs"]) == 5
               for r in result["learners"]["recipes"].values())
    assert steps["d_tiny_gpu"]["figures"]["samples_per_s"] > 0
    assert steps["h_gossip2_shared_gpu"]["figures"]["learners"] == 2
    deadline = time.monotonic() + 15  # Ray's processes take a moment to exit after their head is stopped
    while (left := _processes_of(work)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left and not work.exists()



def _dry_env(out: Path, work: Path, **more: str) -> dict:
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "OUT": str(out), "WORK_DIR": str(work), **more}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.mark.slow
def test_a_run_out_of_time_gives_each_step_it_skips_a_line_and_ends_within_its_limit(summarize, tmp_path):
    out, work = tmp_path / "out", Path(f"/tmp/ckt{os.getpid()}s")
    started = time.monotonic()
    proc = subprocess.run(["bash", str(KIT / "run.sh")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_dry_env(out, work, SYNTH_UTT="20", TOTAL_S="75", G_WINDOW="5"))
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [summarize.parse_line(x) for x in (out / "summary.txt").read_text().splitlines()]
    steps = {x["step"]: x for x in lines if "step" in x}
    assert list(steps) == STEPS
    skipped = [name for name, step in steps.items() if step["rc"] == "skip"]
    assert "f_tiny_cpu" in skipped and all(steps[n]["figures"]["note"].startswith("no time left") for n in skipped)
    assert lines[-1]["line"] == "total_s" and lines[-1]["figures"]["seconds"] <= 75 and took < 85
    # g1 had 23 s: its limit killed bench/gpu.py and its Ray's processes, some of which outlive a TERM
    # (14 here, stopped by `rayhead.py reap`), and none is left
    assert steps["g1_conformer_gpu"]["rc"] == "124" and _processes_of(work) == [] and not work.exists()


@pytest.mark.slow
def test_a_run_stopped_mid_step_stops_that_step_and_still_leaves_its_summary(summarize, tmp_path):
    out, work = tmp_path / "out", Path(f"/tmp/ckt{os.getpid()}t")
    proc = subprocess.Popen(["bash", str(KIT / "run.sh")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_dry_env(out, work, SYNTH_UTT="3000"))
    try:
        for text in proc.stdout:  # the corpus of 3,000 utterances takes minutes on 2 cores
            if "b_synth: start" in text:
                break
        proc.send_signal(15)
        stopped = time.monotonic()
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert time.monotonic() - stopped < 30, rest[-3000:]  # not after the step's own limit (120 s)
    lines = [summarize.parse_line(x) for x in (out / "summary.txt").read_text().splitlines()]
    steps = {x["step"]: x for x in lines if "step" in x}
    assert list(steps) == STEPS[:4] and steps["b_synth"]["rc"] != "0"
    assert (out / "gpu_logs.tar.gz").is_file() and not work.exists()
    deadline = time.monotonic() + 15
    while (left := _processes_of(work)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left
