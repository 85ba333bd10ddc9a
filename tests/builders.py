"""Builders that tests share (`from tests.builders import ...`): small job specs (`make_spec`,
`linear_spec`), an untrained model's checkpoint state (`checkpoint_state`), a job run in a thread
(`run_in_thread`, `stop_job`), `chorus` in a process of its own
(`run_cli`), and what a job left on the cluster (`leftovers_of`, `assert_nothing_left`)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.testing.cluster import leftovers_of

SPLIT_MANIFESTS = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl",
                   "test_unseen": "test-unseen.jsonl"}


SMALL_MODEL = {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1}  # ~30k parameters


def make_spec(corpus: Path | None = None, *splits: str, raw: bool = False, **fields):
    """A small job spec: name `t`, data from `corpus` (the session's, or `stub_corpus`), a small
    BiLSTM (`SMALL_MODEL`: 1 layer of 32, 8 subsampling channels), lr 3e-3 with 10 warmup steps
    and a constant schedule, batches of 10 audio seconds, 1 epoch.

    `splits` (default: train) name the corpus's splits the spec reads (train, dev, test,
    test_unseen), each its .jsonl manifest, or with a trailing slash ("test/") its LibriSpeech-layout
    folder. `fields` set the rest: `section__key=value` one key of a section (`budget__epochs=3`),
    `section=value` a whole section or top-level field (`group={"kind": "gossip"}`, `learners=2`).
    The parsed `JobSpec`, or with `raw=True` the dict (for a YAML/JSON spec file)."""
    data = {}
    for split in splits or (("train",) if corpus is not None else ()):
        key = split.rstrip("/")
        data[key] = str(corpus / (key.replace("_", "-") if split.endswith("/") else SPLIT_MANIFESTS[key]))
    spec = {"name": "t", "data": {**data, "max_batch_seconds": 10}, "model": dict(SMALL_MODEL),
            "optim": {"lr": 3e-3, "warmup_steps": 10, "schedule": "constant"}, "budget": {"epochs": 1}}
    return _with_fields(spec, fields, raw)


def checkpoint_state(corpus: Path, **fields) -> dict:
    """What a checkpoint of `make_spec(corpus, **fields)`'s untrained model holds, as
    `orchestrator.checkpoint.files.load` returns it (its spec, model, tokenizer and what its
    decoding carries): an untrained model's greedy texts are letters, not nothing."""
    from jobs.workload import AsrWorkload

    spec = make_spec(corpus, **fields)
    workload = AsrWorkload(spec.workload_config, seed=0)
    return {"spec": spec.model_dump(mode="json"), **workload.state_dict(workload.build_model())}


def linear_spec(raw: bool = False, **fields):
    """A job spec of the tiny `linear` workload (jobs/linear.py), for tests about orchestration:
    512 random samples in batches of 16, each step taking 20 ms (sleeping), 1 epoch. `fields` and
    `raw` as in `make_spec`."""
    spec = {"name": "t", "workload": "linear",
            "data": {"samples": 512, "batch_size": 16, "compute_seconds": 0.02}, "optim": {"lr": 0.1},
            "budget": {"epochs": 1}}
    return _with_fields(spec, fields, raw)


def _with_fields(spec: dict, fields: dict, raw: bool):
    for name, value in fields.items():
        section, _, key = name.partition("__")
        if key:
            spec[section] = {**spec.get(section, {}), key: value}
        else:
            spec[section] = value
    if raw:
        return spec
    from orchestrator.driver.config import parse_spec

    return parse_spec(spec)


_JOB_THREADS: list[tuple[object, threading.Thread]] = []  # run_in_thread's jobs, ended by the test's teardown


def run_in_thread(job) -> threading.Thread:
    """Run a `TrainingJob` in a daemon thread; `thread.outcome` gets its summary, or the error that
    escaped it (with its traceback). A job still running when its test ends (the test failed
    midway) is stopped then (`leaves_the_cluster_as_found`): it must not go on asking for learners
    on a cluster that the next test uses."""
    outcome = {}

    def run():
        try:
            outcome["summary"] = job.run()
        except BaseException as exc:  # noqa: BLE001 - the test asserts none escapes
            import traceback

            outcome["error"] = f"{exc!r}\n{traceback.format_exc()}"

    thread = threading.Thread(target=run, daemon=True)
    thread.outcome = outcome
    thread.start()
    _JOB_THREADS.append((job, thread))
    return thread


def end_job_threads() -> list[str]:
    """Stop the jobs of `run_in_thread` that still run (cleanly: they release their learners);
    one that does not end is interrupted. Names those that had to be stopped."""
    stopped = []
    while _JOB_THREADS:
        job, thread = _JOB_THREADS.pop()
        if not thread.is_alive():
            continue
        stopped.append(getattr(job, "job_id", repr(job)))
        job.stop()
        thread.join(timeout=90)
        if thread.is_alive():
            job.interrupt()
            thread.join(timeout=30)
        if thread.is_alive():
            stopped[-1] += " (still running after stop and interrupt)"
    return stopped


def stop_job(job, thread: threading.Thread, timeout: float = 120) -> dict:
    """Stop a job run by `run_in_thread`; its summary (it must end on its own, no error escaping)."""
    job.stop()
    thread.join(timeout=timeout)
    assert not thread.is_alive(), "the job did not stop"
    assert "error" not in thread.outcome, thread.outcome["error"]
    return thread.outcome["summary"]


def run_cli(*args: str, entry_point: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """`chorus ARGS` in a process of its own (`python -m orchestrator.cli`, or with `entry_point`
    the installed `chorus` script), its output captured as text. `kwargs` go to subprocess.run
    (cwd, env, timeout)."""
    if entry_point:
        from orchestrator.cluster.local_head import BIN

        command = [str(BIN / "chorus")]
    else:
        command = [sys.executable, "-m", "orchestrator.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, **kwargs)


def assert_nothing_left(prefix: str, placement_groups: int | None = None, within: float = 0.0) -> None:
    """Nothing of the jobs named `prefix...` is left on the connected cluster (`leftovers_of`: no
    actor of theirs alive, no placement group of theirs not REMOVED, no resource request), waiting
    up to `within` seconds for Ray to finish removing them. With `placement_groups`: exactly that
    many groups of theirs were made (all of them removed; 0: none was ever made)."""
    from ray.util import placement_group_table

    deadline = time.time() + within
    left = leftovers_of(prefix)
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = leftovers_of(prefix)
    assert not left, f"left on the cluster by {prefix}*: {left}"
    if placement_groups is not None:
        groups = [g for g in placement_group_table().values() if g["name"].startswith(prefix)]
        assert len(groups) == placement_groups, groups
