"""Sweeps: one YAML space translated three ways (no Ray), bad sweep specs rejected before anything
starts, and real sweeps on the session's Ray cluster whose trials are distributed jobs: two
2-learner trials at once within 4 CPUs, and a sweep killed mid-run that resumes."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.driver.config import SpecError
from search import load_sweep
from search.space import Space
from tests.builders import linear_spec, run_cli

SPACE = {
    "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    "model.dropout": {"type": "float", "low": 0.0, "high": 0.3},
    "data.max_batch_seconds": {"type": "int", "low": 10, "high": 14},
    "model.layers": {"type": "int", "low": 1, "high": 8, "log": True},
    "model.kind": {"type": "categorical", "choices": ["bilstm_ctc", "conformer_ctc"]},
    "model.hidden": {"type": "categorical", "choices": [96, 160, 224]},
    "model.heads": {"type": "int", "low": 2, "high": 4, "when": {"model.kind": "conformer_ctc"}},
}


def _samples(space: Space, n: int = 3000) -> dict[str, list[dict]]:
    """n configs from each translation, reduced to their active parameters."""
    from hyperopt.pyll import stochastic
    from ray.tune.search.sample import Domain

    cs = space.to_configspace(seed=1)
    hyperopt_space, tune_space = space.to_hyperopt(), space.to_tune()
    rng = np.random.default_rng(1)
    out = {"configspace": [space.active(dict(c)) for c in cs.sample_configuration(n)],
           "hyperopt": [space.active(stochastic.sample(hyperopt_space, rng=rng)) for _ in range(n)],
           "tune": []}
    tune_rng = np.random.default_rng(1)  # seeded as the others: unseeded, Tune draws from the process's global state
    for _ in range(n):
        out["tune"].append(space.active({k: d.sample(random_state=tune_rng) if isinstance(d, Domain) else d
                                         for k, d in tune_space.items()}))
    return out


@pytest.mark.unit
def test_one_space_yields_equivalent_configspace_hyperopt_and_tune_spaces():
    space = Space.model_validate(SPACE)
    cs = space.to_configspace()
    # the definitions: same names, types, bounds, scales, choices and condition
    assert sorted(cs.keys()) == sorted(SPACE)
    lr, layers, kind = cs["optim.lr"], cs["model.layers"], cs["model.kind"]
    assert (lr.lower, lr.upper, lr.log) == (1e-4, 1e-2, True)
    assert (layers.lower, layers.upper, layers.log) == (1, 8, True)
    assert list(kind.choices) == ["bilstm_ctc", "conformer_ctc"]
    (condition,) = cs.conditions
    assert (condition.child.name, condition.parent.name, condition.value) == ("model.heads", "model.kind",
                                                                              "conformer_ctc")
    # the distributions: every translation samples the same ones (n = 3000 each)
    samples = _samples(space)
    for name, p in SPACE.items():
        per = {k: [c[name] for c in v if name in c] for k, v in samples.items()}
        for source, values in per.items():
            if p["type"] == "categorical":
                assert set(values) == set(p["choices"]), (name, source)
            else:
                assert p["low"] <= min(values) and max(values) <= p["high"], (name, source)
                if p["type"] == "int":
                    assert all(isinstance(v, int) for v in values), (name, source)
        if p["type"] == "float":  # the same quartiles (on the log scale for log parameters)
            scale = np.log if p.get("log") else (lambda x: np.asarray(x))
            width = scale(p["high"]) - scale(p["low"])
            quartiles = {k: np.quantile(scale(np.array(v)), [0.25, 0.5, 0.75]) for k, v in per.items()}
            for source in ("hyperopt", "tune"):
                assert np.abs(quartiles[source] - quartiles["configspace"]).max() < 0.05 * width, (name, source)
        else:  # discrete: each value's frequency within 0.04 of ConfigSpace's
            values = sorted(set(per["configspace"]), key=str)
            freq = {k: np.array([sum(1 for x in v if x == value) / len(v) for value in values]) for k, v in per.items()}
            for source in ("hyperopt", "tune"):
                assert np.abs(freq[source] - freq["configspace"]).max() < 0.04, (name, source, freq)
    # the condition: the child is active exactly when its parent takes the value
    for source, configs in samples.items():
        assert all(("model.heads" in c) == (c["model.kind"] == "conformer_ctc") for c in configs), source
        share = sum("model.heads" in c for c in configs) / len(configs)
        assert abs(share - 0.5) < 0.04, (source, share)
    # sampled values are plain Python values (ConfigSpace samples numpy scalars), so any sample
    # becomes job-spec overrides
    for source, configs in samples.items():
        assert all(type(v) in (int, float, str) for c in configs for v in c.values()), source
        assert all(len(space.overrides(c)) == len(c) for c in configs[:200]), source
    # and a config becomes job-spec overrides
    assert space.overrides({"optim.lr": 0.002, "model.dropout": 0.1, "data.max_batch_seconds": 12.0,
                            "model.layers": 2, "model.kind": "bilstm_ctc", "model.heads": 3}) == [
        "optim.lr=0.002", "model.dropout=0.1", "data.max_batch_seconds=12", "model.layers=2", "model.kind=bilstm_ctc"]


def _job(corpus) -> dict:
    """A small, fast job: a narrow BiLSTM on the session corpus."""
    return {"name": "t", "seed": 0,
            "data": {"train": str(corpus / "train.jsonl"), "dev": str(corpus / "dev.jsonl"),
                     "test": str(corpus / "test.jsonl"), "max_batch_seconds": 20},
            "model": {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1},
            "optim": {"lr": 3e-3, "warmup_steps": 5}}


def _linear_sweep(tmp_path: Path, **fields) -> Path:
    """A sweep of the tiny linear workload (these tests are about Tune and the trials' jobs):
    steps of 10 ms, an epoch of one learner ~0.3 s; it searches the learning rate and batch size."""
    job = linear_spec(raw=True, data__compute_seconds=0.01)
    job.pop("budget")
    space = {"optim.lr": {"type": "float", "low": 0.05, "high": 0.5, "log": True},
             "data.batch_size": {"type": "int", "low": 8, "high": 24}}
    return _sweep_file(tmp_path, None, **{"job": job, "space": space, **fields})


def _sweep_file(tmp_path: Path, corpus, **fields) -> Path:
    sweep = {"name": "t", "job": _job(corpus) if corpus is not None else None, "method": "random", "trials": 3,
             "max_concurrent": 1,
             "learners": 1, "driver_cpus": 0.5, "cpus_per_learner": 0.5, "budget": {"max": 2, "min": 1},
             "space": {"optim.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True},
                       "features.freq_mask": {"type": "int", "low": 4, "high": 12}}}
    sweep.update(fields)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


@pytest.mark.unit
@pytest.mark.parametrize("change, message", [
    ({"method": "sgd"}, "method: unknown method 'sgd' (one of: bohb, hyperband, asha, hyperopt, random)"),
    ({"space": {}}, "space: empty; name at least one parameter"),
    ({"space": {"optim.lr": {"type": "float", "low": 0.1, "high": 0.01}}},
     "space.optim.lr: low (0.1) must be below high (0.01)"),
    ({"space": {"optim.lrr": {"type": "float", "low": 0.001, "high": 0.01}}},
     "is not valid:\nparameter optim.lrr: unknown key"),
])
def test_a_bad_sweep_spec_fails_with_a_clear_message_before_anything_starts(stub_corpus, tmp_path, change, message):
    path = _sweep_file(tmp_path, stub_corpus, **change)
    with pytest.raises(SpecError) as err:
        load_sweep(path)
    assert f"{path}: " in str(err.value) and message in str(err.value)
    out = tmp_path / "out"
    proc = run_cli("sweep", str(path), "--out", str(out), timeout=120)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr.replace("invalid spec", "")  # no cluster was started
    assert not out.exists()


@pytest.mark.unit
def test_job_overrides_reach_into_the_job_spec_and_data_paths_become_absolute(stub_corpus, tmp_path):
    path = _sweep_file(tmp_path, stub_corpus)
    sweep = load_sweep(path, ["job.model.hidden=48", "trials=5", "space.optim.lr.high=0.02"])
    assert sweep.job["model"]["hidden"] == 48 and sweep.trials == 5
    assert sweep.space.root["optim.lr"].high == 0.02
    assert Path(sweep.job["data"]["train"]).is_absolute()
    with pytest.raises(SpecError, match=r"job: model.hiden \(from --set\): unknown key"):
        load_sweep(path, ["job.model.hiden=48"])


# -- real sweeps on the session cluster -----------------------------------------------------------
def _trial_groups() -> list[dict]:
    """Placement groups of trials (first bundle: the trial driver's 0.5 CPU) now holding resources."""
    from ray.util import placement_group_table

    return [g for g in placement_group_table().values()
            if g["state"] == "CREATED" and g["bundles"].get(0, {}).get("CPU") == 0.5]


@pytest.mark.slow
def test_two_concurrent_two_learner_trials_never_hold_more_than_4_cpus(ray_session, tmp_path):
    import ray
    from ray.util import placement_group_table

    from search import run_sweep

    assert ray.cluster_resources()["CPU"] == 4
    groups_before = set(placement_group_table())
    sweep = load_sweep(_linear_sweep(tmp_path, trials=3, max_concurrent=3, learners=2,
                                     cpus_per_learner=0.75, budget={"max": 1, "min": 1}))
    peak = {"cpus": 0.0, "trials": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            groups = _trial_groups()
            cpus = sum(b.get("CPU", 0) for g in groups for b in g["bundles"].values())
            peak["cpus"], peak["trials"] = max(peak["cpus"], cpus), max(peak["trials"], len(groups))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = run_sweep(sweep, tmp_path / "out", verbose=0)
    finally:
        done.set()
        watcher.join()
    assert summary["trials_by_outcome"] == {"finished": 3}, summary
    assert peak["cpus"] <= 4.0 and peak["trials"] == 2, peak  # two ran at once, never a third
    made = [g for i, g in placement_group_table().items() if i not in groups_before]
    # every learner sat in its trial's placement group: the jobs made none of their own
    assert len(made) == 3 and all(len(g["bundles"]) == 3 for g in made), made
    assert summary["learner_seconds"] > 0 and summary["wer_test"] is not None
    deadline = time.time() + 60  # trials end asynchronously: wait for their actors and groups to go
    while time.time() < deadline:
        learners = [a for a in ray.util.list_named_actors(all_namespaces=True) if "/learner-" in a["name"]]
        if not learners and not _trial_groups():
            break
        time.sleep(0.5)
    assert learners == [] and _trial_groups() == []


def _trial_states(experiment: Path) -> dict[str, str]:
    """Trial id -> status, from the newest experiment state Tune has saved."""
    states = sorted(experiment.glob("experiment_state-*.json"))
    if not states:
        return {}
    try:
        data = json.loads(states[-1].read_text())
    except (json.JSONDecodeError, OSError):  # being written
        return {}
    out = {}
    for trial_json, _ in data.get("trial_data", []):
        trial = json.loads(trial_json)
        out[trial["trial_id"]] = trial["status"]
    return out


@pytest.mark.slow
def test_a_sweep_killed_mid_run_resumes_without_repeating_finished_trials(ray_cluster, tmp_path):
    path = _linear_sweep(tmp_path, trials=3, budget={"max": 3, "min": 1})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--out", str(out),
           "--address", ray_cluster.address]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 300
    states = {}
    while time.time() < deadline and proc.poll() is None:
        states = _trial_states(out / "tune")
        # Tune creates trials one at a time (max_concurrent 1) and snapshots its state every few
        # seconds, so waiting for all 3 in the state left only the last trial's few seconds to kill
        # in (CI missed it). Kill once a trial has finished, its rows are on disk (the state can say
        # TERMINATED a row early) and another has yet to finish: two trials' time in which to act.
        done = [t for t, state in states.items() if state == "TERMINATED"]
        if done and len(done) < 3 and all(_progress_rows(out / "tune", t) == 3 for t in done):
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"the sweep ended before it could be killed:\n{proc.stdout.read()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = [t for t, s in states.items() if s == "TERMINATED"]
    rows_before = {t: _progress_rows(out / "tune", t) for t in finished}
    assert all(n == 3 for n in rows_before.values()), rows_before

    resumed = run_cli("sweep", str(path), "--out", str(out), "--address", ray_cluster.address, "--resume",
                      timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["trials"] == 3 and summary["trials_by_outcome"] == {"finished": 3}, summary["first_error"]
    assert {t: _progress_rows(out / "tune", t) for t in finished} == rows_before  # not run again
    after = _trial_states(out / "tune")
    assert set(states) <= set(after) and len(after) == 3  # the same trials go on, none added
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 4 and all(not math.isnan(float(r.split(",")[3])) for r in rows[1:])


def _progress_rows(experiment: Path, trial_id: str) -> int:
    (trial_dir,) = [d for d in experiment.iterdir() if d.is_dir() and trial_id in d.name]
    result = trial_dir / "result.json"
    return len(result.read_text().splitlines()) if result.is_file() else 0


def _reports(experiment: Path) -> dict[str, list[dict]]:
    """Trial id -> every result it reported (Tune's result.json)."""
    out = {}
    for trial_dir in experiment.iterdir():
        if (trial_dir / "result.json").is_file():
            rows = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
            out[rows[0]["trial_id"]] = rows
    return out


@pytest.mark.slow
def test_a_promoted_trial_resumes_from_its_checkpoint_with_the_learners_of_its_rung(ray_session, tmp_path):
    import ray

    from search import run_sweep
    from search.trial import trial_scratch

    # BOHB's Hyperband, max 3 epochs, eta 3: its first bracket holds 3 trials at 1 epoch, and the
    # best goes on to 3 (Tune's plain HyperBandScheduler would start with its no-stopping bracket)
    sweep = load_sweep(_linear_sweep(tmp_path, method="bohb", trials=3, max_concurrent=3, learners=1,
                                     learners_per_rung=[1, 2], cpus_per_learner=0.75,
                                     budget={"max": 3, "min": 1, "reduction_factor": 3}))
    summary = run_sweep(sweep, tmp_path / "out", verbose=0)
    assert summary["trials_by_outcome"] == {"finished": 1, "stopped": 2}, summary
    reports = _reports(tmp_path / "out" / "tune")
    assert len(reports) == 3
    winner = reports[summary["best_trial"]]
    # the first rung with one learner; promoted, it starts again with two, from its checkpoint
    assert [(r["epoch"], r["learners"], r["starts"]) for r in winner] == [(1, 1, 1), (2, 2, 2), (3, 2, 2)]
    assert winner[1]["step"] > winner[0]["step"] and winner[1]["samples"] > winner[0]["samples"]
    assert summary["best_job_summary"]["learners"] == 2 and summary["wer_test"] is not None
    # the model is kept in the best trial's last checkpoint, and nowhere else: no job folders
    # copied into the sweep's storage, no trial scratch left on this node
    kept = list((tmp_path / "out").rglob("checkpoint.pt"))
    assert Path(summary["best_job_summary"]["checkpoint"]) in kept
    assert all(p.parent.name.startswith("checkpoint_") for p in kept), kept
    assert not any(trial_scratch(d.name).exists() for d in (tmp_path / "out" / "tune").iterdir())
    for trial_id, rows in reports.items():  # the others trained the first rung only, with one learner
        if trial_id != summary["best_trial"]:
            assert [(r["epoch"], r["learners"]) for r in rows] == [(1, 1)]
    deadline = time.time() + 60
    while time.time() < deadline and (_trial_groups() or [
            a for a in ray.util.list_named_actors(all_namespaces=True) if "/learner-" in a["name"]]):
        time.sleep(0.5)
    assert _trial_groups() == []


def _stand_in_trial(config: dict, sweep_raw: dict) -> None:
    """A trial without a job: its loss is x at every epoch; a checkpoint at every rung."""
    import tempfile as tmp

    from ray import tune

    start = 0
    if tune.get_checkpoint() is not None:
        with tune.get_checkpoint().as_directory() as d:
            start = int((Path(d) / "t").read_text())
    for t in range(start + 1, sweep_raw["budget"]["max"] + 1):
        with tmp.TemporaryDirectory() as d:
            (Path(d) / "t").write_text(str(t))
            tune.report({"loss": config["x"], "epoch": t}, checkpoint=tune.Checkpoint.from_directory(d))


@pytest.mark.slow
def test_each_bohb_bracket_takes_its_trials_once_and_halves_them_when_filled(ray_session, tmp_path):
    import ray
    from ray import tune

    from search import run_sweep
    from search.spec import SweepSpec

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in, for the workers
    # max 9, eta 3: bracket 1 takes 9 trials at 1 epoch (3 go on to 3, 1 to 9), bracket 2 takes
    # 5 at 3 epochs (2 go on to 9). Tune's own brackets took trials into a finished bracket at its
    # top rung, and halved a bracket whenever no trial ran (one at a time here: often)
    sweep = SweepSpec(name="brackets", job={}, method="bohb", metric="loss", mode="min",
                      space={"x": {"type": "float", "low": 0.0, "high": 1.0}},
                      budget={"max": 9, "min": 1, "reduction_factor": 3}, trials=14, max_concurrent=1, learners=1)
    run_sweep(sweep, tmp_path / "out", trainable=_stand_in_trial, verbose=0, reuse_actors=True,
              resources=lambda n: tune.PlacementGroupFactory([{"CPU": 1}]))
    reports = _reports(tmp_path / "out" / "tune")
    index = {t: int(re.search(rf"_{t}_(\d+)", d.name).group(1))  # a trial's folder: <name>_<id>_<index>_...
             for d in (tmp_path / "out" / "tune").iterdir() for t in reports if f"_{t}_" in d.name}
    order = sorted(reports, key=index.get)  # in the order they were suggested
    top = {t: max(r["epoch"] for r in reports[t]) for t in order}  # the furthest epoch each reached
    first, rest = order[:9], order[9:]
    assert sum(top[t] > 1 for t in first) == 3 and sum(top[t] == 9 for t in first) == 1, top
    assert all(top[t] >= 3 for t in rest) and sum(top[t] == 9 for t in rest) == 2, top
    # and the halvings kept the best (lowest x) of the first rung, not the first trial to get there
    x = {t: reports[t][0]["loss"] for t in first}
    assert top[min(x, key=x.get)] == 9, (x, top)
