"""Outputs that outlive the node: a run's `--out` at an S3 URI (`orchestrator.checkpoint.storage`, through
pyarrow.fs), against a real S3 API on loopback (moto's server). A job writes there, is stopped,
and resumes from the bucket alone with the same step count and curve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.testing.s3 import KEYS, local_s3, uri

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.xdist_group("s3")  # one worker runs them all: they share the module's S3 server
SMALL_MODEL = {"subsample_channels": 8, "d_model": 32, "hidden": 32, "layers": 1}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free loopback port with a bucket `chorus`: its endpoint
    ("127.0.0.1:PORT"); the AWS credentials it takes are set in this process's environment."""
    with local_s3() as endpoint:
        yield endpoint


def listed(endpoint: str, prefix: str) -> list[str]:
    import boto3

    reply = boto3.client("s3", endpoint_url=f"http://{endpoint}").list_objects_v2(Bucket="chorus", Prefix=prefix)
    # (pyarrow keeps an emptied folder as a `folder/` marker object: not a file)
    return sorted(o["Key"].removeprefix(prefix) for o in reply.get("Contents", []) if not o["Key"].endswith("/"))


@pytest.mark.unit
def test_a_run_folder_mirrored_to_s3_and_back(s3, tmp_path):
    from orchestrator.checkpoint.storage import RunStorage, StorageError

    storage = RunStorage(uri(s3, "unit/run"), staging=tmp_path / "a")
    storage.check(resume=False, overwrite=False)
    storage.local.mkdir()
    (storage.local / "evals.jsonl").write_text('{"step": 1}\n')
    (storage.local / "checkpoint-1.pt").write_bytes(b"x" * 5_000_000)
    os.link(storage.local / "checkpoint-1.pt", storage.local / "checkpoint.pt")
    (storage.local / ".lock").write_text("pid 1")
    storage.push()
    assert listed(s3, "unit/run/") == ["checkpoint-1.pt", "evals.jsonl"]  # no lock, no second copy
    (storage.local / "checkpoint-2.pt").write_bytes(b"y" * 10)
    (storage.local / "checkpoint-1.pt").unlink()  # pruned: gone from the bucket too
    storage.push()
    assert listed(s3, "unit/run/") == ["checkpoint-2.pt", "evals.jsonl"]

    with pytest.raises(StorageError, match=r"s3://chorus/unit/run already holds a run \(checkpoint-2.pt, "
                                           r"evals.jsonl\): pass --resume to continue it or --overwrite"):
        RunStorage(uri(s3, "unit/run"), staging=tmp_path / "b").check(resume=False, overwrite=False)
    again = RunStorage(uri(s3, "unit/run"), staging=tmp_path / "c")  # elsewhere: nothing local reused
    again.check(resume=True, overwrite=False)
    again.pull()
    assert sorted(p.name for p in again.local.iterdir()) == ["checkpoint-2.pt", "evals.jsonl"]
    assert (again.local / "checkpoint-2.pt").read_bytes() == b"y" * 10
    with pytest.raises(StorageError, match="s3://chorus/unit/none: no run there to resume"):
        RunStorage(uri(s3, "unit/none"), staging=tmp_path / "d").check(resume=True, overwrite=False)


@pytest.mark.unit
def test_chorus_shards_writes_a_corpus_to_s3_and_it_streams_back_from_the_index(s3, corpus, tmp_path):
    from click.testing import CliRunner

    from jobs.data.audio_shards import AudioShards
    from jobs.data.manifests import DataError
    from jobs.sections import WorkloadConfig
    from jobs.workload import AsrWorkload
    from orchestrator.cli import main

    made = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", uri(s3, "shards/dev"),
                                     "--shard-mb", "0.2"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["utterances"] == 20
    stored = listed(s3, "shards/dev/")
    assert {"shards.json", "texts.txt"} <= set(stored) and len(stored) == 2 + json.loads(made.output)["shards"] > 3
    shards = AudioShards(uri(s3, "shards/dev"))
    read = [u for name in shards.names for u in shards.read(name)]
    assert len(read) == 20 and all(u.waveform.numel() > 1000 and u.text for u in read)
    streamed = AsrWorkload(WorkloadConfig(data={"train": uri(s3, "shards/dev"), "max_batch_seconds": 10}))
    streamed.check_data()  # the index and a sample of the texts, from the bucket
    ids = [i for rank in range(2) for batch in streamed.batches(rank, 2, 0) for i in batch.ids]
    assert sorted(ids) == sorted(u.id for u in read)  # two learners streaming from S3: each utterance once
    with pytest.raises(DataError, match=r"^s3://chorus/shards/nothing: no shards.json there"):
        AsrWorkload(WorkloadConfig(data={"train": uri(s3, "shards/nothing")})).check_data()
    with_mel = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", uri(s3, "shards/dev-mel"),
                                         "--features", "40"])
    assert with_mel.exit_code == 0 and json.loads(with_mel.output)["mel_bins"] == 40, with_mel.output
    mel = AudioShards(uri(s3, "shards/dev-mel"))
    assert all(u.log_mel.shape[1] == 40 for name in mel.names for u in mel.read(name))
    missing = CliRunner().invoke(main, ["shards", str(corpus / "dev.jsonl"), "--out", "nosuch://x/y"])
    assert missing.exit_code == 1 and missing.output.startswith("Error: nosuch://x/y: cannot open it")
    with pytest.raises(DataError, match="s3://chorus/shards/none: no shards.json there"):
        AudioShards(uri(s3, "shards/none"))


@pytest.mark.slow
def test_a_job_writes_to_s3_is_stopped_and_resumes_from_it_on_another_node(ray_cluster, s3, corpus, tmp_path):
    """The resumed run is started from the session cluster's worker node (by a Ray task placed
    there), in an empty staging folder: all it has is the bucket. It goes on from the
    checkpoint's step, and its curve is the stopped run's (less an evaluation whose checkpoint
    the stop cut short) followed by its own."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({
        "name": "s3job", "seed": 0, "learners": 1, "cpus_per_learner": 1,
        "data": {"train": str(corpus / "train.jsonl"), "dev": str(corpus / "dev.jsonl"), "max_batch_seconds": 10},
        "model": SMALL_MODEL, "optim": {"lr": 0.003, "warmup_steps": 5, "schedule": "constant"},
        "budget": {"epochs": 1000, "wall_seconds": 300, "eval_every_seconds": 3}}))
    out = uri(s3, "runs/s3job")
    env = {**os.environ, **KEYS}

    def train(*extra: str, tmpdir: Path) -> subprocess.Popen:
        tmpdir.mkdir(exist_ok=True)
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", out, *extra],
                                cwd=ROOT, env={**env, "TMPDIR": str(tmpdir)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = train(tmpdir=tmp_path / "node-a")
    deadline = time.monotonic() + 180
    while sum(1 for line in listed(s3, "runs/s3job/") if line.startswith("checkpoint-")) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr[-3000:]
    assert "the last checkpoint is s3://chorus/runs/s3job/checkpoint-" in stderr, stderr[-2000:]
    files = listed(s3, "runs/s3job/")
    assert {"evals.jsonl", "events.jsonl"} <= set(files) and "checkpoint.pt" not in files, files
    kept = _jsonl(s3, "runs/s3job/evals.jsonl")

    @ray.remote(num_cpus=0)
    def resume_here(command: list[str], environment: dict) -> tuple[str, int, str, str]:
        proc = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
        return ray.get_runtime_context().get_node_id(), proc.returncode, proc.stdout, proc.stderr

    worker = ray_cluster.session_worker.node_id
    (tmp_path / "node-b").mkdir()
    command = [sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", out, "--resume",
               "--set", f"budget.epochs={int(kept[-1]['epoch']) + 2}"]
    node, code, stdout, stderr = ray.get(resume_here.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(worker, soft=False)).remote(
        command, {**env, "TMPDIR": str(tmp_path / "node-b")}), timeout=360)
    assert node == worker and node != ray.get_runtime_context().get_node_id()
    assert code == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["checkpoint"].startswith("s3://chorus/runs/s3job/checkpoint-"), summary["checkpoint"]
    curve = _jsonl(s3, "runs/s3job/evals.jsonl")
    names = listed(s3, "runs/s3job/")
    past = _jsonl(s3, "runs/s3job/evals.superseded.jsonl") if "evals.superseded.jsonl" in names else []
    kept = [e for e in kept if e not in past]
    assert curve[:len(kept)] == kept, (kept, curve)
    assert curve[-1]["step"] > kept[-1]["step"] and summary["steps"] == curve[-1]["step"], (curve, summary)
    assert "summary.json" in names and json.loads(_read(s3, "runs/s3job/summary.json")) == summary
    for node in ("node-a", "node-b"):  # the staging folders went with their runs
        assert not list((tmp_path / node).glob("chorus-staging-*")), node


def _read(endpoint: str, key: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}")
    return client.get_object(Bucket="chorus", Key=key)["Body"].read().decode()


def _jsonl(endpoint: str, key: str) -> list[dict]:
    return [json.loads(line) for line in _read(endpoint, key).splitlines() if line.strip()]
